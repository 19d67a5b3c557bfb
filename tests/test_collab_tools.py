"""Agents calling tools inside the loop (collab/_tools.py), on the ScriptedEngine.

Under the tool-call constraint the ScriptedEngine writes one valid call per
free-text step (a document of the call schema), so every free turn calls a tool
until ``max_tool_steps`` is spent; the last step answers without tools.
"""

from __future__ import annotations

import json
import uuid
from typing import Literal

import anyio
import pytest
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    InvalidCollaboration,
    Tool,
    collaborate,
)
from microagent.collab._tools import parameters_schema, run_calls
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

CONTEXT = "What is 2 + 3? Use the add tool."


async def test_agents_call_a_python_tool_and_continue_from_its_result() -> None:
    calls: list[tuple[int, int]] = []

    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    events: list[CollaborationEvent] = []
    async with ScriptedEngine(block_size=16) as engine:
        outcome = await collaborate(
            engine,
            "debate",
            CONTEXT,
            [AgentSpec("debater", count=2)],
            rounds=1,
            max_tokens=48,
            tools=[add],
            max_tool_steps=2,
            on_event=events.append,
        )
        assert engine.live_requests() == frozenset()
    assert outcome.answer
    assert len(calls) == 4  # 2 agents x 2 steps, each with valid integer arguments
    assert all(isinstance(a, int) and isinstance(b, int) for a, b in calls)
    assert sum(r.tool_calls for r in outcome.agents) == 4
    kinds = [e.type for e in events]
    assert kinds.count("tool_call") == 4 and kinds.count("tool_result") == 4
    results = [e for e in events if e.type == "tool_result"]
    assert all(e.data["ok"] and e.data["name"] == "add" for e in results)
    # the result went into the agent's thread: the next step's prompt extends the call's
    steps = [r for r in engine.history if r.sampling.tagged is not None]
    answers = [r for r in engine.history if r.sampling.tagged is None]
    for later in answers:
        text = engine.detokenize(later.prompt.token_ids)
        assert "<tool_response>" in text and "<tools>" in text
        assert any(step.prompt.is_prefix_of(later.prompt) for step in steps)


async def test_a_failing_tool_is_an_error_result_not_a_failure() -> None:
    def explode(reason: str) -> str:
        raise RuntimeError(f"cannot {reason}")

    events: list[CollaborationEvent] = []
    async with ScriptedEngine() as engine:
        outcome = await collaborate(
            engine,
            "debate",
            CONTEXT,
            [AgentSpec("debater", count=2)],
            rounds=1,
            max_tokens=32,
            tools=[explode],
            max_tool_steps=1,
            on_event=events.append,
        )
    assert outcome.answer
    results = [e for e in events if e.type == "tool_result"]
    assert results and not any(e.data["ok"] for e in results)
    assert all("RuntimeError: cannot" in e.data["output"] for e in results)


async def test_tool_timeout_and_output_limit() -> None:
    async def slow() -> str:
        await anyio.sleep(30)
        return "never"

    tool = Tool.from_function(slow, timeout=0.05)
    with anyio.fail_after(5):
        (outcome,) = await run_calls({"slow": tool}, [_call("slow", {})])
    assert not outcome.ok and "timed out" in outcome.text
    big = Tool.from_function(lambda: "x" * 100, name="big", max_output_chars=10)
    (cut,) = await run_calls({"big": big}, [_call("big", {})])
    assert cut.ok and cut.text.startswith("x" * 10) and "cut at 10" in cut.text
    (missing,) = await run_calls({}, [_call("nope", {})])
    assert not missing.ok and "no tool named" in missing.text
    (bad,) = await run_calls({"slow": tool}, [_call("slow", {"unexpected": 1})])
    assert not bad.ok and "bad arguments" in bad.text


async def test_cancelling_the_collaboration_stops_a_running_tool() -> None:
    started = anyio.Event()
    stopped: list[str] = []

    async def wait_forever() -> str:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.append("cancelled")
        return "unreachable"

    async with ScriptedEngine() as engine:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await collaborate(
                    engine,
                    "debate",
                    CONTEXT,
                    [AgentSpec("debater", count=2)],
                    rounds=1,
                    tools=[wait_forever],
                )

            tg.start_soon(run)
            with anyio.fail_after(10):
                await started.wait()
            tg.cancel_scope.cancel()
        assert stopped  # the tool saw the cancellation
        assert engine.live_requests() == frozenset()
        assert engine.stats().scheduler_running == 0


async def test_tools_need_a_text_context() -> None:
    async with ScriptedEngine() as engine:
        handle = engine.chat.context([{"role": "user", "content": CONTEXT}])
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(engine, "debate", handle, tools=[_noop])
    assert info.value.field == "tools"


def _noop() -> str:
    return ""


def _call(name: str, arguments: object) -> dict[str, object]:
    return {"id": "c", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_parameters_schema_from_type_hints() -> None:
    def search(
        query: str,
        limit: int = 5,
        kind: Literal["web", "news"] = "web",
        tags: list[str] | None = None,
    ) -> str:
        return query

    schema = parameters_schema(search)
    assert schema["required"] == ["query"]
    assert schema["properties"]["limit"] == {"type": "integer"}
    assert schema["properties"]["kind"] == {"enum": ["web", "news"]}
    assert schema["properties"]["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    }
    assert schema["additionalProperties"] is False

    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(InvalidCollaboration, match="no type hint"):
        parameters_schema(untyped)
    with pytest.raises(InvalidCollaboration, match="used twice"):
        from microagent.collab._tools import as_tools

        as_tools([_noop, _noop])
    with pytest.raises(InvalidCollaboration, match="tool name"):
        Tool(name="bad name", fn=_noop)


async def test_each_agent_calls_only_the_tools_it_names() -> None:
    used: dict[str, list[str]] = {"add": [], "lookup": []}

    def add(a: int, b: int) -> int:
        used["add"].append("x")
        return a + b

    def lookup(key: str) -> str:
        used["lookup"].append(key)
        return key

    events: list[CollaborationEvent] = []
    async with ScriptedEngine() as engine:
        await collaborate(
            engine,
            "debate",
            CONTEXT,
            [AgentSpec("adder", tools=["add"]), AgentSpec("reader", tools=["lookup"])],
            rounds=1,
            max_tokens=32,
            tools=[add, lookup],
            tool_choice="required",
            max_tool_steps=1,
            on_event=events.append,
        )
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(
                engine,
                "debate",
                CONTEXT,
                [AgentSpec("a", tools=["nope"]), AgentSpec("b")],
                tools=[add],
            )
    assert info.value.field == "agents.tools" and "nope" in info.value.reason
    calls = {(e.agent, e.data["name"]) for e in events if e.type == "tool_call"}
    assert calls == {("adder", "add"), ("reader", "lookup")}


def test_agent_tools_field_rules() -> None:
    assert AgentSpec.from_dict({"name": "a", "tools": ["x", "y"]}).tools == ("x", "y")
    for bad, reason in (
        ("x", "must be a list"),
        (["x", "x"], "repeat"),
        ([""], "item 0"),
        ([3], "item 0"),
    ):
        with pytest.raises(InvalidCollaboration) as info:
            AgentSpec.from_dict({"name": "a", "tools": bad})
        assert info.value.field == "agents.tools" and reason in info.value.reason


async def test_each_tool_step_is_a_span_in_the_trace_with_tool_instants() -> None:
    from microagent.collab.trace import TraceRecorder

    def add(a: int, b: int) -> int:
        return a + b

    recorder = TraceRecorder()
    async with ScriptedEngine(decode_time_per_token=0.001) as engine:
        await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("solver")],
            tools=[add],
            tool_choice="required",
            max_tool_steps=2,
            on_event=recorder,
        )
        requests = len(engine.history)
    events = recorder.to_chrome_trace()["traceEvents"]
    turns = [e for e in events if e.get("ph") == "X" and e.get("cat") == "turn"]
    assert len(turns) == requests == 3  # two call steps and the answer
    # each step is a span of its own that lasts its decode (a stray finish has none)
    assert all(e["dur"] > 0 for e in turns), turns
    results = [e for e in events if e.get("ph") == "i" and e["name"] == "tool_result"]
    assert len(results) == 2 and {e["tid"] for e in results} == {turns[0]["tid"]}


async def test_a_tool_step_is_retained_until_its_tools_usual_duration() -> None:
    """Tool durations observed in this process become the next use of the steps that may
    call them: the engine keeps such a step while the wait is short against recomputing."""
    from microagent.collab._tools import TOOL_TIMES, ToolTimes

    async def slow_lookup(item: str) -> str:
        """Look an item up."""
        await anyio.sleep(0.05)
        return f"{item}: 3 in stock"

    name = f"lookup_{uuid.uuid4().hex[:8]}"  # the process's record starts empty for it
    tool = Tool.from_function(slow_lookup, name=name)
    async with ScriptedEngine(block_size=16) as engine:
        for _ in range(2):
            await collaborate(
                engine,
                "vote",
                "Is the widget in stock?",
                [AgentSpec("voter", count=1)],
                max_tokens=32,
                tools=[tool],
                max_tool_steps=1,
            )
    expected = TOOL_TIMES.expected([name])
    # an event loop's timer may fire up to its clock's resolution (1 ms on uvloop) early
    slept = 0.05 - 0.002
    assert expected is not None and slept <= expected < 1.0
    tool_steps = [r for r in engine.history if r.sampling.tagged is not None and r.retain]
    hints = [r.retain.next_use for r in tool_steps if r.retain is not None]
    # the first collaboration's first step knew nothing yet; later ones carry the median
    assert hints and hints[0] is None and all(h is not None and h >= slept for h in hints[1:])

    times = ToolTimes(keep=3)
    for seconds in (1.0, 9.0, 2.0, 3.0):  # the oldest falls out
        times.observe("a", seconds)
    times.observe("b", -1.0)  # a clock that went back counts as 0
    assert times.expected(["a"]) == 3.0 and times.expected(["a", "b"]) == 2.5
    assert times.expected(["never-ran"]) is None
