"""auto: the strategy picked from the question's form, on the ScriptedEngine and over HTTP."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from microagent.collab import AgentSpec, InvalidCollaboration, collaborate, prepare_collaboration
from microagent.collab.modes import AutoConfig, VoteConfig
from microagent.collab.modes._auto import plan
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from test_server_helpers import live_server, scripted

pytestmark = pytest.mark.anyio

CONTEXT = "Is 17 a prime number?"
ROOT = Path(__file__).resolve().parents[1]


def agents(n: int) -> list[AgentSpec]:
    return [AgentSpec("agent", count=n)]


@pytest.mark.parametrize(
    ("options", "n", "strategy"),
    [
        ({"answer": ["yes", "no"]}, 3, "vote"),
        ({}, 3, "vote"),
        ({}, 1, "single"),
        ({"validator": {"type": "json"}}, 3, "best_of_validator"),
    ],
)
def test_without_logprobs_the_rule_gives_way_to_plain_votes(
    options: dict[str, Any], n: int, strategy: str
) -> None:
    chosen = plan(AutoConfig(**options), agents(n), logprobs=False)
    assert chosen.strategy == strategy
    config = chosen.config
    if isinstance(config, VoteConfig):
        assert not config.soft and config.adaptive == "off"
        assert config.debias == ("order" if "answer" in options else "off")


@pytest.mark.parametrize(
    ("options", "n", "strategy"),
    [
        ({"answer": ["yes", "no"]}, 5, "soft_vote"),
        ({"answer": ["yes", "no"]}, 1, "soft_vote"),
        ({"answer": ["yes", "no"], "distinct_first": False}, 1, "soft_vote_labels"),
        ({"answer": {"regex": "[0-9]+"}}, 5, "vote"),
        ({"validator": {"type": "json"}}, 5, "best_of_validator"),
        ({}, 1, "single"),
        ({}, 3, "best_of_likelihood"),
    ],
)
def test_the_rule_picks_a_strategy_from_the_question_form(
    options: dict[str, Any], n: int, strategy: str
) -> None:
    options = dict(options)
    distinct = options.pop("distinct_first", True)
    chosen = plan(AutoConfig(**options), agents(n), distinct_first=distinct)
    assert chosen.strategy == strategy and chosen.why


def test_distinct_first_tokens_get_the_measured_soft_vote() -> None:
    import quality as Q

    published = Q.METHODS["soft2-content"]  # published before issue 30; a bench method now
    chosen = plan(AutoConfig(answer=["cold", "hot"]), agents(5))
    # the collaboration fields bench/quality.py measures, but the mode (auto chose it)
    assert {"mode": "vote", **chosen.options} == published["collaboration"]
    # yes/no: the same, uncalibrated (the content-free prior over-corrects "yes")
    yes_no = plan(AutoConfig(answer=["Yes", "No"]), agents(5))
    expected = {**published["collaboration"], "calibrate": "off"}
    del expected["mode"]
    assert yes_no.options == expected
    assert "yes/no" in yes_no.why


def test_a_lettered_soft_vote_is_calibrated_only_with_enough_voters() -> None:
    choices = ["a", "b", "c"]
    shared = {"distinct_first": False}
    assert plan(AutoConfig(answer=choices), agents(3), **shared).options["calibrate"] == "position"
    assert plan(AutoConfig(answer=choices), agents(2), **shared).options["calibrate"] == "off"
    many = [f"choice {i}" for i in range(30)]  # more than can be lettered
    assert plan(AutoConfig(answer=many), agents(3), **shared).options == {
        "style": "direct",
        "debias": "order",
    }


async def test_closed_choices_run_the_published_soft_vote() -> None:
    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return "yes" if request.sampling.choices else None

    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(engine, "auto", CONTEXT, answer=["yes", "no"])
        offered = {tuple(sorted(r.sampling.choices or ())) for r in engine.history}
    assert outcome.mode == "auto" and outcome.answer == "yes"
    assert outcome.details["strategy"] == "soft_vote"
    assert outcome.details["soft"]["calibrate"] == "off"  # yes/no: uncalibrated
    assert offered == {("no", "yes")} and len(outcome.agents) == 5


async def test_choices_sharing_a_first_token_run_a_soft_vote_over_letters() -> None:
    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return "A" if request.sampling.choices else None

    choices = ["New York", "New Delhi"]  # one first token: the texts cannot be told apart
    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(engine, "auto", CONTEXT, answer=choices)
        offered = {r.sampling.choices for r in engine.history}
    assert outcome.details["strategy"] == "soft_vote_labels"
    assert "position prior" in outcome.details["why"]
    assert outcome.details["soft"]["calibrate"] == "position"
    assert offered == {("A", "B")} and outcome.answer in choices


async def test_free_answers_run_best_of_scored_by_likelihood() -> None:
    async with ScriptedEngine() as engine:
        outcome = await collaborate(engine, "auto", CONTEXT, agents(3))
        requests = list(engine.history)
    assert outcome.details["strategy"] == "best_of_likelihood"
    assert outcome.details["scored_by"] == "likelihood" and outcome.details["judged"] == 0
    assert len(requests) == 3 and all(r.sampling.logprobs == 0 for r in requests)
    assert outcome.answer == next(
        c["answer"]
        for c in outcome.details["candidates"]
        if c["agent"] == outcome.details["chosen"]
    )


async def test_a_validator_runs_best_of_scored_by_it() -> None:
    async with ScriptedEngine(script=lambda p, r: '{"ok": true}') as engine:
        outcome = await collaborate(engine, "auto", CONTEXT, agents(3), validator={"type": "json"})
    assert outcome.details["strategy"] == "best_of_validator"
    assert outcome.details["valid"] is True and outcome.early_stopped


async def test_one_agent_and_a_free_answer_is_a_single_sample() -> None:
    async with ScriptedEngine(script=lambda p, r: "Yes, it is prime.") as engine:
        outcome = await collaborate(engine, "auto", CONTEXT, agents(1))
        assert len(engine.history) == 1
    assert outcome.answer == "Yes, it is prime." and outcome.details["strategy"] == "single"


def _names(specs: Sequence[AgentSpec]) -> list[str]:
    return [n for s in specs for n in s.agent_names()]


def test_the_chosen_modes_rules_are_checked_when_the_request_is_prepared() -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("auto", None, {"judge": "self"})  # a best_of option, not auto's
    assert info.value.field == "collaboration.judge"
    assert _names(prepare_collaboration("auto", None, {}).agents) == [
        f"agent-{i}" for i in range(1, 6)
    ]


def test_auto_and_best_of_over_http() -> None:
    with live_server(scripted()) as srv:
        for collaboration, strategy in (
            ({"mode": "auto", "answer": {"choices": ["yes", "no"]}}, "soft_vote"),
            ({"mode": "auto", "validator": {"type": "json"}}, "best_of_validator"),
        ):
            body = {
                "messages": [{"role": "user", "content": CONTEXT}],
                "max_tokens": 8,
                "agents": [{"name": "agent", "count": 3}],
                "collaboration": collaboration,
            }
            r = httpx.post(
                f"{srv.url}/v1/chat/completions", json=body, headers=srv.headers, timeout=30
            )
            assert r.status_code == 200, r.text
            collab = r.json()["collaboration"]
            assert collab["mode"] == "auto" and collab["details"]["strategy"] == strategy
        body["collaboration"] = {"mode": "best_of", "judge": "self"}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=srv.headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["collaboration"]["details"]["scored_by"] == "self"
