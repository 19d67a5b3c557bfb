"""best_of (verifier-guided best-of-N) on the ScriptedEngine."""

from __future__ import annotations

import json
import math
import re

import pytest
from _prob_engine import LikelihoodEngine, ProbEngine
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    InvalidCollaboration,
    collaborate,
    collaboration_modes,
    prepare_collaboration,
)
from microagent.collab.modes._best_of import JUDGE_PROMPT, sequence_probability
from microagent.engine_bridge import EngineRequest, TokenLogprob
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

CONTEXT = "Give the record as JSON."
CANDIDATE = re.compile(r"candidate number (\d+)")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


def candidates(n: int) -> list[AgentSpec]:
    return [AgentSpec(f"c{i}", instructions=f"You are candidate number {i}.") for i in range(n)]


def number(request: EngineRequest) -> int:
    return int(CANDIDATE.findall(request.prompt.text)[0])


def judging(request: EngineRequest) -> bool:
    return JUDGE_PROMPT in request.prompt.text


async def test_best_of_is_registered() -> None:
    assert {"best_of", "auto"} <= set(collaboration_modes())


async def test_validator_picks_the_passing_candidate_and_prunes_the_rest() -> None:
    replies = [
        '{"name": 1}',  # fast, fails the schema
        '{"name": "ok"}',  # passes
        "long " * 60,
        "long " * 60,
    ]

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        return replies[number(request)]

    events: list[CollaborationEvent] = []
    async with ScriptedEngine(script=script, decode_time_per_token=0.01) as engine:
        outcome = await collaborate(
            engine,
            "best_of",
            CONTEXT,
            candidates(4),
            validator={"type": "json_schema", "schema": SCHEMA},
            on_event=events.append,
        )
        assert engine.live_requests() == frozenset()
    assert json.loads(outcome.answer) == {"name": "ok"}
    assert outcome.details["chosen"] == "c1" and outcome.details["valid"] is True
    assert outcome.details["scored_by"] == "validator" and outcome.details["judged"] == 0
    assert outcome.early_stopped
    assert [a.finish_reason for a in outcome.agents].count("pruned") == 2
    checks = [e.data["ok"] for e in events if e.type == "validation"]
    assert checks == [False, True]
    first = outcome.details["candidates"][0]
    assert first["valid"] is False and "name" in first["validator_message"]


async def test_without_a_passing_candidate_the_first_finished_is_returned_invalid() -> None:
    async with ScriptedEngine(script=lambda p, r: "not json") as engine:
        outcome = await collaborate(
            engine, "best_of", CONTEXT, candidates(3), validator={"type": "json"}
        )
    assert outcome.details["valid"] is False and not outcome.early_stopped
    assert outcome.details["samples"] == 3


async def test_self_judged_best_of_picks_the_candidate_the_model_most_believes() -> None:
    words = ["alpha", "beta", "gamma"]
    believed = {0: 0.3, 1: 0.9, 2: 0.6}

    def probs(request: EngineRequest) -> dict[str, float] | None:
        if not judging(request):
            return None
        p = believed[number(request)]
        return {"yes": p, "no": 1 - p}

    async with ProbEngine(probs, free=lambda r: words[number(r)]) as engine:
        outcome = await collaborate(engine, "best_of", CONTEXT, candidates(3))
        judges = [r for r in engine.history if judging(r)]
    assert outcome.answer == "beta" and outcome.details["chosen"] == "c1"
    assert outcome.details["scored_by"] == "self" and outcome.details["judged"] == 3
    scores = {c["agent"]: c["score"] for c in outcome.details["candidates"]}
    assert scores == pytest.approx({"c0": 0.3, "c1": 0.9, "c2": 0.6})
    for r in judges:  # constrained, greedy, with logprobs, continuing the candidate's thread
        assert r.sampling.choices == ("yes", "no") and r.sampling.logprobs == 20
        assert r.sampling.temperature == 0.0
        assert words[number(r)] in r.prompt.text


async def test_equal_answers_are_judged_once() -> None:
    picks = ["yes", "yes", "no", "yes"]

    def probs(request: EngineRequest) -> dict[str, float]:
        if judging(request):
            said_yes = picks[number(request)] == "yes"
            return {"yes": 0.2, "no": 0.8} if said_yes else {"yes": 0.7, "no": 0.3}
        pick = picks[number(request)]
        return {pick: 0.9, ("no" if pick == "yes" else "yes"): 0.1}

    async with ProbEngine(probs) as engine:
        outcome = await collaborate(engine, "best_of", CONTEXT, candidates(4), answer=["yes", "no"])
    assert outcome.answer == "no"  # one candidate, but the model believes it more
    assert outcome.details["judged"] == 2
    scores = [c["score"] for c in outcome.details["candidates"]]
    assert sorted(scores) == pytest.approx([0.2, 0.2, 0.2, 0.7])


async def test_judge_with_a_validator_scores_only_the_passing_candidates() -> None:
    replies = ['{"name": "a"}', "oops", '{"name": "b"}']

    def probs(request: EngineRequest) -> dict[str, float] | None:
        if not judging(request):
            return None
        p = 0.8 if '"b"' in request.prompt.text else 0.4
        return {"yes": p, "no": 1 - p}

    async with ProbEngine(probs, free=lambda r: replies[number(r)]) as engine:
        outcome = await collaborate(
            engine,
            "best_of",
            CONTEXT,
            candidates(3),
            validator={"type": "json"},
            judge=True,
        )
    assert json.loads(outcome.answer) == {"name": "b"}
    assert outcome.details["scored_by"] == "validator+self" and outcome.details["judged"] == 2
    invalid = [c for c in outcome.details["candidates"] if not c["valid"]]
    assert len(invalid) == 1 and "score" not in invalid[0]


async def test_likelihood_picks_the_candidate_the_model_found_most_probable() -> None:
    async with LikelihoodEngine(["alpha", "beta", "gamma"], [0.3, 0.9, 0.6]) as engine:
        outcome = await collaborate(engine, "best_of", CONTEXT, candidates(3), judge="likelihood")
        requests = list(engine.history)
    assert outcome.answer == "beta" and outcome.details["chosen"] == "c1"
    assert outcome.details["scored_by"] == "likelihood" and outcome.details["judged"] == 0
    scores = {c["agent"]: c["score"] for c in outcome.details["candidates"]}
    assert scores == pytest.approx({"c0": 0.3, "c1": 0.9, "c2": 0.6})
    assert len(requests) == 3  # no judge request: the candidates' own logprobs score them
    assert all(r.sampling.logprobs == 0 for r in requests)


async def test_likelihood_sums_the_probability_of_equal_answers() -> None:
    """Soft self-consistency: two candidates reading 4 at 0.5 outweigh one reading 5 at 0.9."""
    replies = ["2 + 2 = 4", "The answer is 4.", "5"]
    async with LikelihoodEngine(replies, [0.5, 0.5, 0.9]) as engine:
        outcome = await collaborate(
            engine,
            "best_of",
            CONTEXT,
            candidates(3),
            judge="likelihood",
            answer={"extract": "number"},
        )
    assert outcome.answer == "4" and outcome.details["chosen"] in ("c0", "c1")
    scores = {c["agent"]: c["score"] for c in outcome.details["candidates"]}
    assert scores == pytest.approx({"c0": 1.0, "c1": 1.0, "c2": 0.9})
    async with LikelihoodEngine(replies, [0.5, 0.5, 0.9]) as engine:  # as texts: all differ
        outcome = await collaborate(engine, "best_of", CONTEXT, candidates(3), judge="likelihood")
    assert outcome.answer == "5"


async def test_likelihood_with_a_validator_scores_only_the_passing_candidates() -> None:
    replies = ['{"name": "a"}', "oops", '{"name": "b"}']
    async with LikelihoodEngine(replies, [0.4, 0.99, 0.7]) as engine:
        outcome = await collaborate(
            engine,
            "best_of",
            CONTEXT,
            candidates(3),
            validator={"type": "json"},
            judge="likelihood",
        )
    assert json.loads(outcome.answer) == {"name": "b"} and not outcome.early_stopped
    assert outcome.details["scored_by"] == "validator+likelihood"
    invalid = [c for c in outcome.details["candidates"] if not c["valid"]]
    assert len(invalid) == 1 and "score" not in invalid[0]


async def test_adaptive_likelihood_stops_once_the_leader_cannot_be_overtaken() -> None:
    """After the first wave 7 holds 1.8 and one candidate is left (at most 1 more): decided."""
    async with LikelihoodEngine(["7", "7", "8"], [0.9, 0.9, 0.99]) as engine:
        outcome = await collaborate(
            engine, "best_of", CONTEXT, candidates(3), judge="likelihood", adaptive=True
        )
        asked = [engine.candidate(r) for r in engine.history]
        assert engine.live_requests() == frozenset()
    assert outcome.answer == "7" and outcome.early_stopped
    assert outcome.details["stopped_by"] == "adaptive" and outcome.details["samples"] == 2
    assert sorted(asked) == [0, 1]  # the third candidate was never started
    assert [a.finish_reason for a in outcome.agents] == ["stop", "stop", "pruned"]


async def test_adaptive_likelihood_goes_on_while_the_rest_could_change_the_answer() -> None:
    async with LikelihoodEngine(["7", "8", "8"], [0.9, 0.6, 0.6]) as engine:
        outcome = await collaborate(
            engine, "best_of", CONTEXT, candidates(3), judge="likelihood", adaptive=True
        )
    assert outcome.answer == "8" and not outcome.early_stopped  # 1.2 against 0.9
    assert outcome.details["samples"] == 3 and "stopped_by" not in outcome.details


def test_sequence_probability_is_the_geometric_mean_of_the_token_probabilities() -> None:
    tokens = [TokenLogprob(i, math.log(p), ()) for i, p in enumerate((0.5, 0.125))]
    assert sequence_probability(tokens) == pytest.approx(0.25)
    assert sequence_probability(None) == sequence_probability(()) == 0.0  # no evidence
    unreported = [*tokens, TokenLogprob(9, -math.inf, ())]  # a sampled token vLLM did not rank
    assert sequence_probability(unreported) == 0.0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"judge": "off"}, "collaboration.judge"),  # nothing would score the candidates
        ({"judge": "maybe"}, "collaboration.judge"),
        ({"judge_instructions": ""}, "collaboration.judge_instructions"),
        ({"validator": {"type": "yaml"}}, "collaboration.validator.type"),
        ({"answer_tokens": 0}, "collaboration.answer_tokens"),
        ({"adaptive": True}, "collaboration.adaptive"),  # its bound needs likelihood scores
        ({"adaptive": True, "judge": "self"}, "collaboration.adaptive"),
        ({"wave": -1}, "collaboration.wave"),
    ],
)
async def test_bad_best_of_options_name_their_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("best_of", None, options)
    assert info.value.field == field
