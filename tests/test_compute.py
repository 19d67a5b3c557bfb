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
from microagent.collab._calculator import (
    ANSWER_STEP_REGEX,
    CALCULATOR,
    STEP_REGEX,
    CalculationError,
    calculate,
    calculate_program,
)
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
        ("What is the 3rd letter of the word apple?", None, False),  # an ordinal
        ("How many legs does a spider have?", None, False),
        ("What is 7 times 8?", None, True),
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


# --- greedy's call, byte for byte --------------------------------------------------------


def recording() -> tuple[ScriptedEngine, list[tuple[tuple[int, ...], Any]]]:
    """An engine that answers "Mice." to every plain turn and records each (prompt, sampling)."""
    sent: list[tuple[tuple[int, ...], Any]] = []

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        sent.append((tuple(prompt), request.sampling))
        regex = request.sampling.regex
        if regex is not None:
            return "answer = 7 * 3" if regex.startswith("answer") else "a = 7 * 3"
        choices = request.sampling.choices
        return choices[0] if choices else "Mice."

    return ScriptedEngine(script=script), sent


@pytest.mark.parametrize(
    ("question", "options"),
    [
        ("What is the plural of mouse?", {"max_tokens": 32}),  # free, nothing to compute
        ("What is the plural of mouse?", {"max_tokens": 32, "answer": ["mice", "mouses"]}),
        ("What is 7 times 8?", {"max_tokens": 32, "steps": 2}),  # 3 is no stated number
    ],
)
async def test_the_direct_answer_is_greedys_single_call_byte_for_byte(
    question: str, options: dict[str, Any]
) -> None:
    """compute's direct answer sends what ``microagent eval``'s greedy sends, and answers
    what it answers: with choices ``vote`` (style direct, one voter, temperature 0), on a
    free answer the plain call (``auto``, one agent, temperature 0, the reply as written)."""
    engine, sent = recording()
    async with engine:
        computed = await collaborate(
            engine, "compute", question, [AgentSpec("solver", temperature=0.0)], **options
        )
        direct = sent[-1]
        sent.clear()
        if "answer" in options:
            greedy = await collaborate(
                engine, "vote", question, [AgentSpec("voter", count=1)], style="direct",
                temperature=0.0, **options,
            )  # fmt: skip
        else:
            greedy = await collaborate(
                engine, "auto", question, [AgentSpec("agent", count=1)], temperature=0.0,
                max_tokens=options["max_tokens"],
            )  # fmt: skip
    assert computed.details["path"] == "direct"
    assert sent == [direct]  # the same prompt ids and the same sampling
    assert computed.answer == greedy.answer
    # a closed answer is normalised to its choice; a free one is the reply as written
    assert computed.answer == ("mice" if "answer" in options else "Mice.")
    if "steps" in options:  # the program ran, and was rejected for its invented 3
        (program,) = computed.details["programs"]
        assert program["rejected"] == "uses numbers the question does not state: 3"
        assert computed.details["why"] == "no program uses only numbers the question states"


# --- programs of named steps ---------------------------------------------------------------

PENS = "Ana buys 3 pens at 4 dollars each and a 5 dollar pad. How much does she pay?"


def programmed(
    programs: dict[str, list[str]], direct: str = "direct answer"
) -> tuple[ScriptedEngine, list[tuple[str, str, str | None]]]:
    """An engine whose regex-constrained turns write ``programs[agent]`` a step at a time;
    the list records each turn's (agent, prompt text, regex)."""
    seen: list[tuple[str, str, str | None]] = []
    engine: ScriptedEngine

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        text = engine.detokenize(prompt)
        found = AGENT.findall(text)
        agent = found[-1] if found else "solver"
        regex = request.sampling.regex
        written = sum(1 for a, _, r in seen if a == agent and r is not None)
        seen.append((agent, text, regex))
        if regex is None:
            return direct
        return programs[agent][written]

    engine = ScriptedEngine(script=script)
    return engine, seen


async def test_a_program_runs_a_step_a_turn_each_value_shown_to_the_next() -> None:
    engine, seen = programmed({"solver": ["price = 3 * 4", "total = price + 5", "answer = total"]})
    events: list[CollaborationEvent] = []
    async with engine:
        out = await collaborate(
            engine, "compute", PENS, agents("solver"), steps=3, on_event=events.append
        )
    assert out.answer == "17" and out.details["path"] == "computed"
    (program,) = out.details["programs"]
    assert [(s["step"], s["value"]) for s in program["steps"]] == [
        ("price = 3 * 4", 12),
        ("total = price + 5", 17),
        ("answer = total", 17),
    ]
    assert program["steps"][2]["seen"] == ["price = 3 * 4  # = 12", "total = price + 5  # = 17"]
    assert (program["value"], program["answer"]) == (17, "17")
    # the turns: held to the step grammar, the last to answer = ...; each prompt shows
    # the earlier steps with their values (what the sandbox computed)
    assert [r for _, _, r in seen] == [STEP_REGEX, STEP_REGEX, ANSWER_STEP_REGEX]
    assert "# =" not in seen[0][1]
    assert "price = 3 * 4  # = 12" in seen[1][1]
    assert "total = price + 5  # = 17" in seen[2][1]
    results = [e.data for e in events if e.type == "tool_result"]
    assert [(r["label"], r["ok"], r["output"]) for r in results] == [
        ("step", True, "12"),
        ("step", True, "17"),
        ("step", True, "17"),
    ]
    calls = [json.loads(e.data["arguments"]) for e in events if e.type == "tool_call"]
    assert calls[-1] == {"steps": ["price = 3 * 4", "total = price + 5", "answer = total"]}


async def test_a_program_ends_at_its_answer_step() -> None:
    engine, seen = programmed({"solver": ["p = 3 * 4", "answer = p + 5"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=5)
    assert out.answer == "17"
    assert len(seen) == 2  # two turns of the five allowed


async def test_a_program_that_reaches_the_bound_answers_its_last_value() -> None:
    engine, _ = programmed({"solver": ["p = 3 * 4", "q = p + 5"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=2)
    assert out.answer == "17"


@pytest.mark.parametrize(
    ("steps", "error"),
    [
        (["p = 3 * 4", "answer = cost + 5"], "step 2: unknown name 'cost'"),
        (["p = 3 * 4", "p = p + 5"], "step 2: 'p' is already assigned"),
        (["p = 3 * 4", "q = p.real"], "step 2: Attribute is not allowed"),
        (["p = 3 * 4", "q = p ** 4 ** 5"], "step 2: the power is too large"),
        (["p = 3 * 4", "q = p / (3 - 3)"], "step 2: ZeroDivisionError"),
    ],
)
async def test_a_bad_step_ends_the_program_at_its_last_good_value(
    steps: list[str], error: str
) -> None:
    engine, seen = programmed({"solver": [*steps, "answer = 1"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=3)
    (program,) = out.details["programs"]
    assert program["error"].startswith(error), program["error"]
    assert "value" not in program["steps"][-1] and program["steps"][-1]["step"] == steps[-1]
    assert (out.answer, out.details["path"]) == ("12", "computed")  # step 1's value
    assert len(seen) == len(steps)  # the program stopped at its bad step


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ("p = 3 ** 4 ** 5", "step 1: the power is too large"),
        ("__dict__ = 3", "step 1: a step's name is lower-case"),
        ("p = ().__class__", "step 1: Attribute is not allowed"),
        ("p = open(3)", "step 1: only these functions"),
    ],
)
async def test_a_bad_first_step_leaves_no_value_and_greedy_answers(step: str, error: str) -> None:
    engine, seen = programmed({"solver": [step, "answer = 1"]}, direct="17")
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=3)
    (program,) = out.details["programs"]
    assert program["error"].startswith(error), program["error"]
    assert "value" not in program
    assert (out.answer, out.details["path"]) == ("17", "direct")
    assert seen[-1][2] is None and len(seen) == 2  # the bad step, then greedy's direct call


async def test_programs_are_voted_and_an_ungrounded_one_is_rejected() -> None:
    engine, _ = programmed(
        {
            "a": ["p = 3 * 4", "answer = p + 5"],
            "b": ["p = 3 * 4", "answer = p + 6"],  # 6: the question states no 6
            "c": ["p = 3 * 4 + 5", "answer = p"],
        }
    )
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("a", "b", "c"), steps=2)
    assert out.answer == "17" and out.votes == {"17": 2}
    rejected = out.details["programs"][1]
    assert rejected["value"] == 18 and rejected["answer"] == ""
    assert rejected["rejected"] == "uses numbers the question does not state: 6"
    engine, _ = programmed({"b": ["p = 3 * 4", "answer = p + 6"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("b"), steps=2, verify=False)
    assert out.answer == "18"  # unchecked: the invented number stands


async def test_the_one_expression_path_is_checked_too() -> None:
    engine, seen = scripted({"solver": "37 + 47"}, direct="85")
    async with engine:
        out = await collaborate(engine, "compute", "What is 37 + 48?", agents("solver"))
    (entry,) = out.details["expressions"]
    assert entry["rejected"] == "uses numbers the question does not state: 47"
    assert (out.answer, out.details["path"]) == ("85", "direct")
    assert seen == ["expression", "direct"]


@pytest.mark.parametrize(
    ("options", "field"),
    [({"steps": 0}, "steps"), ({"steps": 7}, "steps"), ({"verify": "yes"}, "verify")],
)
async def test_bad_step_options_name_their_field(options: dict[str, Any], field: str) -> None:
    async with ScriptedEngine() as engine:
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(engine, "compute", "What is 1 + 1?", **options)
    assert info.value.field == f"collaboration.{field}"


async def test_auto_passes_steps_and_verify_to_the_compute_it_routes_to() -> None:
    """``compute_steps`` and ``compute_verify`` are rule 0's compute ``steps`` and
    ``verify``: the program runs a step a turn, and an invented number stands only
    unverified."""
    program = {"b": ["p = 3 * 4", "answer = p + 6"]}  # 6: the question states no 6
    engine, seen = programmed(program, direct="17")
    async with engine:
        out = await collaborate(engine, "auto", PENS, agents("b"), calculator=True, compute_steps=2)
    assert out.details["strategy"] == "compute"
    assert out.details["options"] == {"steps": 2, "verify": True}
    assert [regex is not None for _, _, regex in seen] == [True, True, False]
    assert out.details["programs"][0]["rejected"].endswith("does not state: 6")
    assert (out.answer, out.details["path"]) == ("17", "direct")  # greedy's call
    engine, _ = programmed(program)
    async with engine:
        out = await collaborate(
            engine,
            "auto",
            PENS,
            agents("b"),
            calculator=True,
            compute_steps=2,
            compute_verify=False,
        )
    assert (out.answer, out.details["path"]) == ("18", "computed")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"compute_steps": 2}, "compute_steps"),  # without calculator: never ignored
        ({"compute_verify": False}, "compute_verify"),
        ({"calculator": True, "compute_steps": 7}, "compute_steps"),
        ({"calculator": True, "compute_verify": "no"}, "compute_verify"),
    ],
)
async def test_bad_auto_compute_options_name_their_field(
    options: dict[str, Any], field: str
) -> None:
    async with ScriptedEngine() as engine:
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(engine, "auto", PENS, agents("b"), **options)
    assert info.value.field == f"collaboration.{field}"


async def test_calculate_program_evaluates_every_step_in_the_sandbox() -> None:
    assert await calculate_program(["a = 17 * 23", "b = a + 4", "c = b > 400"]) == [391, 395, 0]
    with pytest.raises(CalculationError, match="at most 6 steps"):
        await calculate_program([f"s{i} = {i}" for i in range(7)])
    with pytest.raises(CalculationError, match=r"step 2: unknown name 'os'"):
        await calculate_program(["a = 1", "b = os"])  # refused before any process starts
    with pytest.raises(CalculationError, match=r"step 2: ZeroDivisionError"):
        await calculate_program(["a = 1", "b = a / (a - 1)"])  # in the sandbox


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("price = 3 * 4", True),
        ("total = price + 5", True),
        ("a = max(price, 3) * (2 + 4)", True),
        ("a = -3 + sqrt(16) ** 2 // 3 % 7", True),
        ("x = 3 * 4 + 5  x + 5", False),  # a second expression after a value
        ("price = 3 * 4 and total 5", False),  # words after a value
        ("Price = 3", False),
        ("x == 3", False),
        ("a = b.c", False),
        ("a = 'x'", False),
    ],
)
def test_the_step_grammar_holds_a_turn_to_one_assignment(text: str, held: bool) -> None:
    assert (re.fullmatch(STEP_REGEX, text) is not None) is held
    assert re.fullmatch(ANSWER_STEP_REGEX, text) is None  # the last step must be answer = ...
    assert re.fullmatch(ANSWER_STEP_REGEX, "answer = total * 2") is not None


async def test_a_step_loses_the_unmatched_parentheses_it_ends_with() -> None:
    engine, _ = programmed({"solver": ["p = (3 * 4 )))", "answer = max(p, 5) + 5)"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=2)
    (program,) = out.details["programs"]
    assert [s["step"] for s in program["steps"]] == ["p = (3 * 4 )", "answer = max(p, 5) + 5"]
    assert out.answer == "17"


async def test_a_step_may_write_out_a_value_an_earlier_step_computed() -> None:
    engine, _ = programmed({"solver": ["p = 3 * 4 + 5", "answer = 17"]})
    async with engine:
        out = await collaborate(engine, "compute", PENS, agents("solver"), steps=2)
    assert (out.answer, out.details["path"]) == ("17", "computed")


async def test_with_verify_the_expression_turn_is_held_to_the_questions_numbers() -> None:
    """The check moved into decoding: the expression turn's regex admits the question's
    numbers only with ``verify`` (the default), the calculator's whole language without."""
    question = "A crate holds 18 bottles. How many bottles are in 5 crates?"
    seen: list[str | None] = []

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        seen.append(request.sampling.regex)
        return "18 * 5" if request.sampling.regex else "90"

    async with ScriptedEngine(script=script) as engine:
        out = await collaborate(engine, "compute", question, [AgentSpec("solver")])
        plain = await collaborate(engine, "compute", question, [AgentSpec("solver")], verify=False)
    assert out.answer == plain.answer == "90"
    grounded, whole = seen[0], seen[1]
    assert grounded is not None and whole is not None
    assert re.fullmatch(grounded, "18 * 5") and not re.fullmatch(grounded, "17 * 5")
    assert re.fullmatch(whole, "17 * 5")  # verify off: any number (the check is off too)
