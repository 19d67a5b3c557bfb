"""The calculator (``_arith``, ``_calculator``) and the ``compute`` mode on the ScriptedEngine.

The calculator's language is checked in process and evaluated in the real
sandbox; the mode's paths (computed, voted, direct when there is nothing to
compute or nothing computes) are driven by scripted expressions.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    CollaborationFailed,
    InvalidCollaboration,
    calculator_tool,
    collaborate,
)
from microagent.collab._calculator import CALCULATOR, CalculationError, calculate
from microagent.collab.modes._compute import calls_for_calculation, choice_for
from microagent.engine_bridge import EngineRequest
from microagent.server import ServerLimits
from microagent.testing import ScriptedEngine
from test_server_helpers import live_server

pytestmark = pytest.mark.anyio

#: the agent whose prompt this is (each test agent's instructions name it)
AGENT = re.compile(r"agent (\w+) here")


def scripted(
    expressions: dict[str, str], direct: str = "direct answer"
) -> tuple[ScriptedEngine, list[str]]:
    """An engine whose expression turns (regex-constrained) write ``expressions[agent]``
    and whose other turns answer ``direct``; the list records which kind each turn was."""
    seen: list[str] = []
    engine: ScriptedEngine

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        text = engine.detokenize(prompt)
        if request.sampling.regex is not None:
            found = AGENT.findall(text)
            seen.append("expression")
            return expressions[found[-1] if found else "solver"]
        seen.append("direct")
        choices = request.sampling.choices
        return choices[0] if choices and direct not in choices else direct

    engine = ScriptedEngine(script=script)
    return engine, seen


def agents(*names: str, temperature: float | None = None) -> list[AgentSpec]:
    return [AgentSpec(n, instructions=f"agent {n} here.", temperature=temperature) for n in names]


# --- the calculator -------------------------------------------------------------------


async def test_calculate_evaluates_in_the_sandbox_and_formats_the_value() -> None:
    assert await calculate("17 * 23 + 4") == "395"
    assert await calculate("0.1 + 0.2") == "0.3"
    assert await calculate("10 / 4") == "2.5"
    assert await calculate("6 / 3") == "2"
    assert await calculate("3 > 2") == "True"


async def test_calculate_refuses_bad_expressions_before_the_sandbox() -> None:
    with pytest.raises(CalculationError, match="only these functions"):
        await calculate("open('/etc/passwd')")
    with pytest.raises(CalculationError, match="ZeroDivisionError"):
        await calculate("1 / (2 - 2)")


async def test_the_calculator_tool_returns_values_and_errors_to_the_model() -> None:
    tool = calculator_tool()
    assert tool.name == CALCULATOR
    assert tool.parameters["properties"]["expression"]["maxLength"] == 200
    ok = await tool.call({"expression": "(12 + 30) * 2"})
    assert (ok.text, ok.ok) == ("84", True)
    bad = await tool.call({"expression": "x"})
    assert not bad.ok and "unknown name 'x'" in bad.text


@pytest.mark.parametrize(
    ("question", "choices", "expected"),
    [
        ("What is 37 + 48?", None, True),
        ("Ana has 12 apples and buys 7 more. How many now?", None, True),
        ("How many centimetres are in 3.5 metres?", None, True),
        ("How many centimetres are in 3.5 metres?", ["350", "35", "3500"], True),
        ("Which is larger, 37 or 48?", ["37", "48"], True),
        ("What is the capital of France?", None, False),
        ("What is the capital of France?", ["Paris", "Lyon"], False),
        ("In 1990 who won?", ["Germany", "Italy"], False),
        ("Which number is prime?", ["4", "7"], False),
        ("Route 66 is in which country?", None, False),
    ],
)
def test_calls_for_calculation(question: str, choices: list[str] | None, expected: bool) -> None:
    assert calls_for_calculation(question, choices) is expected


def test_a_value_states_the_choice_that_writes_it() -> None:
    assert choice_for(85, ["84", "85", "86"]) == "85"
    assert choice_for(85.0, ["84", " 85 "]) == " 85 "
    assert choice_for(1250, ["1,250", "125"]) == "1,250"
    assert choice_for(2.5, ["2", "3"]) == ""


# --- the mode -------------------------------------------------------------------------------


async def test_compute_answers_with_the_value_of_the_expression() -> None:
    engine, seen = scripted({"solver": "37 + 48"})
    events: list[CollaborationEvent] = []
    async with engine:
        out = await collaborate(
            engine, "compute", "What is 37 + 48?", agents("solver"), on_event=events.append
        )
    assert out.answer == "85"
    assert out.details["path"] == "computed"
    assert out.details["expressions"] == [
        {"agent": "solver", "expression": "37 + 48", "value": 85, "answer": "85"}
    ]
    assert seen == ["expression"]
    kinds = [(e.type, e.data.get("name")) for e in events if e.type.startswith("tool")]
    assert kinds == [("tool_call", CALCULATOR), ("tool_result", CALCULATOR)]


async def test_compute_with_choices_answers_the_choice_its_value_states() -> None:
    engine, _ = scripted({"solver": "3.5 * 100"})
    async with engine:
        out = await collaborate(
            engine,
            "compute",
            "How many centimetres are in 3.5 metres?",
            agents("solver"),
            answer={"choices": ["35", "350", "3500"]},
        )
    assert out.answer == "350"


async def test_compute_votes_the_values_and_a_tie_goes_to_the_first_agent() -> None:
    engine, _ = scripted({"a": "40 + 2", "b": "41", "c": "40 + 1"})
    async with engine:
        out = await collaborate(
            engine, "compute", "What is 40 + 2?", agents("a", "b", "c"), verify=False
        )
    assert out.answer == "41"  # b and c agree against a (41 is no stated number: unverified)
    assert out.votes == {"42": 1, "41": 2}
    engine, _ = scripted({"a": "40 + 2", "b": "41", "c": "x"})
    async with engine:
        out = await collaborate(engine, "compute", "What is 40 + 2?", agents("a", "b", "c"))
    assert out.answer == "42"  # one each: the first agent's
    assert out.details["expressions"][2]["error"] == "unknown name 'x'"


async def test_compute_answers_directly_where_there_is_nothing_to_compute() -> None:
    engine, seen = scripted({}, direct="Paris")
    async with engine:
        out = await collaborate(
            engine,
            "compute",
            "What is the capital of France?",
            agents("solver"),
            answer={"choices": ["Paris", "Lyon"]},
        )
    assert out.answer == "Paris"
    assert out.details == {"path": "direct", "why": "the choices are not all numbers"}
    assert seen == ["direct"]  # no expression was asked for


async def test_compute_falls_back_to_a_direct_answer_when_no_value_states_a_choice() -> None:
    engine, seen = scripted({"solver": "37 + 48 - 1"}, direct="85")
    async with engine:
        out = await collaborate(
            engine,
            "compute",
            "What is 37 + 48?",
            agents("solver"),
            answer={"choices": ["83", "85", "87"]},
        )
    assert out.answer == "85"
    assert out.details["path"] == "direct"
    assert out.details["why"] == "no expression's value states one of the choices"
    assert seen == ["expression", "direct"]


async def test_compute_without_fallback_fails_with_every_record() -> None:
    engine, _ = scripted({"solver": "1 / 0"})
    async with engine:
        with pytest.raises(CollaborationFailed, match="no expression could be evaluated"):
            await collaborate(engine, "compute", "What is 1 / 0?", agents("solver"), fallback=False)


@pytest.mark.parametrize(
    ("options", "field"),
    [({"expression_tokens": 2}, "expression_tokens"), ({"fallback": "yes"}, "fallback")],
)
async def test_bad_compute_options_name_their_field(options: dict[str, Any], field: str) -> None:
    async with ScriptedEngine() as engine:
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(engine, "compute", "What is 1 + 1?", **options)
    assert info.value.field == f"collaboration.{field}"


async def test_auto_routes_calculations_to_compute_only_with_the_calculator() -> None:
    engine, seen = scripted({"solver": "12 * 12"}, direct="144")
    question = "What is 12 times 12?"
    async with engine:
        on = await collaborate(engine, "auto", question, agents("solver"), calculator=True)
        assert on.details["strategy"] == "compute"
        assert on.answer == "144"
        off = await collaborate(engine, "auto", question, agents("solver"))
        assert off.details["strategy"] == "single"
        other = await collaborate(
            engine, "auto", "Name a colour.", agents("solver"), calculator=True
        )
        assert other.details["strategy"] == "single"
    assert seen == ["expression", "direct", "direct"]


# --- over HTTP ------------------------------------------------------------------------------


def test_the_server_refuses_compute_unless_started_with_the_calculator() -> None:
    body = {
        "messages": [{"role": "user", "content": "What is 37 + 48?"}],
        "agents": [{"name": "solver", "temperature": 0}],
    }
    with live_server(lambda: {"scripted": scripted({"solver": "37 + 48"})[0]}) as srv:
        for collaboration, field in [
            ({"mode": "compute"}, "collaboration.mode"),
            ({"mode": "auto", "calculator": True}, "collaboration.calculator"),
        ]:
            r = httpx.post(
                f"{srv.url}/v1/chat/completions",
                json={**body, "collaboration": collaboration},
                timeout=30,
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == field
            assert "--calculator" in error["message"]


def test_a_server_with_the_calculator_computes_and_offers_the_tool() -> None:
    limits = ServerLimits(allow_calculator=True)
    body = {
        "messages": [{"role": "user", "content": "What is 37 + 48?"}],
        "agents": [{"name": "solver", "temperature": 0}],
    }
    make = lambda: {"scripted": scripted({"solver": "37 + 48"})[0]}  # noqa: E731
    with live_server(make, limits=limits, tools=[calculator_tool()]) as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={**body, "collaboration": {"mode": "compute"}},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["choices"][0]["message"]["content"] == "85"
        assert reply["collaboration"]["details"]["path"] == "computed"
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={
                **body,
                "collaboration": {
                    "mode": "auto",
                    "calculator": True,
                    "answer": {"choices": ["84", "85"]},
                },
            },
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "85"
        assert r.json()["collaboration"]["details"]["strategy"] == "compute"
        document = httpx.get(f"{srv.url}/openapi.json").json()
        assert CALCULATOR in json.dumps(document)
