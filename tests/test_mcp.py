"""MCP servers as tool sources (collab/_mcp.py), against a real stdio MCP server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    McpServer,
    ToolServerError,
    collaborate,
    mcp_tools,
)
from microagent.collab._tools import run_calls
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio
SERVER = Path(__file__).parent / "_mcp_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # one backend: each test starts a server process


def server(tmp_path: Path) -> McpServer:
    return McpServer(sys.executable, (str(SERVER), str(tmp_path / "slow-started")))


async def test_tools_are_listed_with_their_schemas(tmp_path: Path) -> None:
    async with mcp_tools(server(tmp_path)) as tools:
        by_name = {t.name: t for t in tools}
        assert set(by_name) == {"add", "fail", "slow"}
        add = by_name["add"]
        assert add.description == "Add two integers."
        assert add.parameters["required"] == ["a", "b"]
        assert "title" not in json.dumps(add.parameters)
        ok, failed = await run_calls(
            by_name,
            [
                {"id": "1", "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'}},
                {"id": "2", "function": {"name": "fail", "arguments": '{"reason": "no"}'}},
            ],
        )
    assert ok.ok and ok.text == "42"
    assert not failed.ok and "refused: no" in failed.text


async def test_agents_call_an_mcp_tool_in_a_collaboration(tmp_path: Path) -> None:
    events: list[CollaborationEvent] = []
    async with mcp_tools(server(tmp_path)) as tools, ScriptedEngine() as engine:
        add = [t for t in tools if t.name == "add"]
        outcome = await collaborate(
            engine,
            "debate",
            "What is 2 + 40?",
            [AgentSpec("solver", count=2)],
            rounds=1,
            tools=add,
            max_tool_steps=1,
            on_event=events.append,
        )
    assert sum(r.tool_calls for r in outcome.agents) == 2
    results = [e for e in events if e.type == "tool_result"]
    assert len(results) == 2 and all(e.data["ok"] for e in results)


async def test_cancelling_stops_a_running_mcp_call(tmp_path: Path) -> None:
    started = tmp_path / "slow-started"
    async with mcp_tools(server(tmp_path)) as tools, ScriptedEngine() as engine:
        slow = [t for t in tools if t.name == "slow"]
        with anyio.move_on_after(30) as timeout:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: collaborate(
                        engine, "debate", "Wait.", [AgentSpec("w", count=2)], tools=slow
                    )
                )
                # the server process writes it: another process's state has no event
                while not started.exists():  # noqa: ASYNC110
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()
        assert not timeout.cancel_called
        assert engine.live_requests() == frozenset()
        # the session still serves calls after a cancelled one
        add = {t.name: t for t in tools}
        (again,) = await run_calls(
            add, [{"id": "3", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}]
        )
        assert again.text == "2"


async def test_a_server_that_does_not_start_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ToolServerError, match="no-such-command"):
        async with mcp_tools("no-such-command --flag", timeout=10):
            pass
    bad = McpServer(sys.executable, ("-c", "import sys; sys.exit(3)"))
    with pytest.raises(ToolServerError):
        async with mcp_tools(bad, timeout=10):
            pass


def test_parse_command_line() -> None:
    assert McpServer.parse("python 'my server.py' --x") == McpServer(
        "python", ("my server.py", "--x")
    )
    with pytest.raises(ToolServerError):
        McpServer.parse("  ")
