"""Soft votes, best_of and auto end to end on the real engine (the default model)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from _engine import RealEngine
from microagent.collab import AgentSpec, Outcome, collaborate
from microagent.collab._calculator import CALCULATOR, EXPRESSION_REGEX

pytestmark = pytest.mark.engine

QUESTION = "Is Paris the capital of France?"


def run(real_engine: RealEngine, mode: str, agents: list[AgentSpec], **options: Any) -> Outcome:
    async def go() -> Outcome:
        return await collaborate(real_engine.bridge, mode, QUESTION, agents, **options)

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    return outcome


def test_soft_labels_vote_reads_real_logprobs(real_engine: RealEngine) -> None:
    outcome = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=4)],
        answer=["yes", "no"],
        style="direct",
        max_tokens=8,
        debias="labels",
        soft=True,
        calibrate="position",
    )
    soft = outcome.details["soft"]
    assert outcome.answer in ("yes", "no") and soft["fallbacks"] == 0
    assert soft["mean_mass"] > 0.5  # the allowed letters hold the reported probability
    assert abs(sum(soft["distribution"].values()) - 1) < 1e-3
    for ballot in outcome.details["ballots"]:
        assert 0 < ballot["p"][0] < 1 and abs(sum(ballot["p"]) - 1) < 1e-3


def test_soft_letters_real_choices_that_share_a_first_token(real_engine: RealEngine) -> None:
    outcome = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=2)],
        answer=["12", "14"],  # digits are tokens of their own: both start with "1"
        style="direct",
        max_tokens=8,
        soft=True,
        answer_tokens=1,
        early_stop=False,
    )
    assert outcome.answer in ("12", "14")
    assert outcome.details["soft_fallback"]["to"] == "labels"
    # each voter's letters were scored from the real logprobs, in its own order
    assert [b["shown"] for b in outcome.details["ballots"]] == [["12", "14"], ["14", "12"]]
    for ballot in outcome.details["ballots"]:
        assert abs(sum(ballot["p"]) - 1) < 1e-3


def test_best_of_self_judged_scores_with_real_logprobs(real_engine: RealEngine) -> None:
    outcome = run(
        real_engine,
        "best_of",
        [AgentSpec("candidate", count=3)],
        answer=["yes", "no"],
        max_tokens=8,
    )
    scores = [c["score"] for c in outcome.details["candidates"]]
    assert outcome.details["scored_by"] == "self" and all(0 < s < 1 for s in scores)
    assert outcome.answer in ("yes", "no")


def test_best_of_by_likelihood_scores_with_the_candidates_own_real_logprobs(
    real_engine: RealEngine,
) -> None:
    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge,
            "best_of",
            "What is 3 + 4? Reply with the number only.",
            [AgentSpec("candidate", count=3)],
            judge="likelihood",
            answer={"extract": "number"},
            max_tokens=12,
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    details = outcome.details
    assert details["scored_by"] == "likelihood" and details["judged"] == 0
    scores = {c["agent"]: c["score"] for c in details["candidates"]}
    assert all(0 < s <= 3 for s in scores.values())  # summed over up to 3 equal answers
    assert scores[details["chosen"]] == max(scores.values())
    assert [a.requests for a in outcome.agents] == [1, 1, 1]  # no judge request


def test_adaptive_best_of_with_a_greedy_candidate_runs_on_the_real_engine(
    real_engine: RealEngine,
) -> None:
    agents = [AgentSpec("greedy", temperature=0.0), AgentSpec("sampled", count=2)]
    outcome = run(
        real_engine,
        "best_of",
        agents,
        judge="likelihood",
        adaptive=True,
        answer=["yes", "no"],
        max_tokens=8,
    )
    details = outcome.details
    assert outcome.answer in ("yes", "no") and details["samples"] in (2, 3)
    unstarted = [a for a in outcome.agents if a.requests == 0]
    assert len(unstarted) == 3 - details["samples"]  # stopped: the third never requested
    assert (details.get("stopped_by") == "adaptive") == (details["samples"] == 2)


def test_auto_runs_its_strategies_on_the_real_engine(real_engine: RealEngine) -> None:
    closed = run(real_engine, "auto", [AgentSpec("agent", count=3)], answer=["yes", "no"])
    assert closed.details["strategy"] == "soft_vote" and closed.answer in ("yes", "no")
    # the real tokenizer starts "12" and "14" with one digit token: letters instead
    shared = run(real_engine, "auto", [AgentSpec("agent", count=2)], answer=["12", "14"])
    assert shared.details["strategy"] == "soft_vote_labels" and shared.answer in ("12", "14")
    checked = run(
        real_engine,
        "auto",
        [AgentSpec("agent", count=2)],
        validator={"type": "json"},
        max_tokens=32,
    )
    assert checked.details["strategy"] == "best_of_validator"
    assert isinstance(checked.details["valid"], bool)
    free = run(real_engine, "auto", [AgentSpec("agent", count=2)], max_tokens=12)
    assert free.details["strategy"] == "best_of_likelihood" and free.details["judged"] == 0
    assert all(0 < c["score"] <= 2 for c in free.details["candidates"])


@pytest.mark.parametrize("debias", ["order", "labels"])
def test_debiased_votes_map_real_answers_back_to_the_choices(
    real_engine: RealEngine, debias: str
) -> None:
    outcome = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=2)],
        answer=["yes", "no"],
        style="direct",
        max_tokens=8,
        debias=debias,
        early_stop=False,
    )
    assert outcome.details["debias"] == debias and outcome.answer in ("yes", "no")
    assert outcome.votes is not None and sum(outcome.votes.values()) == 2
    assert set(outcome.votes) <= {"yes", "no"}  # letters and reorderings mapped back


def test_soft_order_vote_the_published_configuration_in_python(real_engine: RealEngine) -> None:
    outcome = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=2)],
        answer=["yes", "no"],
        style="direct",
        max_tokens=8,
        debias="order",
        soft=True,
        calibrate="content",
        answer_tokens=1,
    )
    soft = outcome.details["soft"]
    assert outcome.answer == max(soft["distribution"], key=soft["distribution"].__getitem__)
    assert soft["fallbacks"] == 0 and len(soft["content_priors"]) == 2
    assert outcome.votes is not None and set(outcome.votes) <= {"yes", "no"}  # whole choices


def test_adaptive_vote_stops_by_its_rule_on_the_real_engine(real_engine: RealEngine) -> None:
    outcome = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=6)],
        answer=["yes", "no"],
        style="direct",
        max_tokens=8,
        adaptive="beta",
        wave=2,
    )
    assert outcome.answer in ("yes", "no")
    assert 2 <= outcome.details["samples"] <= 6


def test_compute_evaluates_the_models_arithmetic_in_the_sandbox(real_engine: RealEngine) -> None:
    """The default model copies the numbers into an expression the calculator evaluates."""
    events: list[Any] = []

    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge,
            "compute",
            "What is 37 + 48?",
            [AgentSpec("solver", temperature=0.0)],
            max_tokens=8,
            on_event=events.append,
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    (entry,) = outcome.details["expressions"]
    assert re.fullmatch(EXPRESSION_REGEX, entry["expression"])  # held to the language
    assert outcome.details["path"] == "computed" and outcome.answer == "85"
    assert entry["value"] == 85
    results = [e for e in events if e.type == "tool_result"]
    assert [(e.data["name"], e.data["ok"], e.data["output"]) for e in results] == [
        (CALCULATOR, True, "85")
    ]


def test_compute_answers_a_question_without_numbers_as_greedy_does(
    real_engine: RealEngine,
) -> None:
    question = "Is a dog an animal or a fruit?"

    async def go() -> tuple[Outcome, Outcome]:
        options: dict[str, Any] = {"answer": ["animal", "fruit"], "max_tokens": 8}
        computed = await collaborate(
            real_engine.bridge, "compute", question, [AgentSpec("solver", temperature=0.0)],
            **options,
        )  # fmt: skip
        greedy = await collaborate(
            real_engine.bridge, "vote", question, [AgentSpec("voter")], style="direct",
            temperature=0.0, **options,
        )  # fmt: skip
        return computed, greedy

    computed, greedy = real_engine.call(go)
    real_engine.assert_idle()
    assert computed.details["path"] == "direct"
    assert computed.answer == greedy.answer
