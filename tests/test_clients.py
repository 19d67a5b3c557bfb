"""The clients people already run, unchanged, against the server on the real default model.

The OpenAI Agents SDK (its chat-completions model and its default, the Responses
API), a LangGraph ReAct agent on langchain-openai, and LangChain's streaming and
structured output. They conflict with vLLM's pins, so they live in a virtual
environment of their own (``tests/.venv-clients``, made by ``make clients`` or
on first use here) and each runs as a script under ``tests/clients/`` that
prints one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _engine import RealEngine
from microagent.server import ServerLimits
from test_server_helpers import LiveServer, live_server

pytestmark = [pytest.mark.engine, pytest.mark.clients]

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-clients"
#: What the peer environment holds (pinned: a client's new release must not change a result).
PACKAGES = ("openai-agents==0.24.0", "langgraph==1.2.22", "langchain-openai==1.7.4")


def client_python() -> Path:
    """The peer environment's python, made (about a minute) when missing or stale."""
    python = VENV / "bin" / "python"
    stamp = VENV / "installed.txt"
    wanted = "\n".join(PACKAGES)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PACKAGES],
        check=True,
    )
    stamp.write_text(wanted)
    return python


@pytest.fixture(scope="module")
def peer() -> Path:
    return client_python()


@pytest.fixture(scope="module")
def server(real_engine: RealEngine) -> Iterator[LiveServer]:
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge},
        portal=real_engine.portal,
        open_engines=False,
        limits=ServerLimits(max_concurrent_collaborations=8),
    ) as srv:
        yield srv
    real_engine.assert_idle(30)


def run_client(peer: Path, script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(peer), str(HERE / "clients" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("how", ["once", "stream"])
def test_the_agents_sdk_calls_its_tool_and_answers(
    peer: Path, server: LiveServer, api: str, how: str
) -> None:
    out = run_client(peer, "agents_sdk.py", f"{server.url}/v1", api, how)
    assert out["calls"] and all(isinstance(c, str) and c for c in out["calls"]), out
    assert isinstance(out["final"], str) and out["final"], out
    if how == "stream":
        assert out["events"] > 3, out


def test_a_langgraph_react_agent_makes_a_valid_call_and_reads_its_result(
    peer: Path, server: LiveServer
) -> None:
    """``tool_choice="required"``: every turn must call, so the graph runs into its step
    limit, as it would against any server; what matters is a valid first call whose
    result reached the next model turn."""
    out = run_client(peer, "langgraph_react.py", f"{server.url}/v1", "required")
    assert out["calls"] and 0 < len(out["calls"][0]) <= 64, out
    assert out["tool_results"] and "17 units" in out["tool_results"][0], out
    assert out["model_turns"] >= 2 and not out["finished"], out


def test_a_langgraph_react_agent_with_auto_finishes(peer: Path, server: LiveServer) -> None:
    out = run_client(peer, "langgraph_react.py", f"{server.url}/v1", "auto")
    assert out["finished"] and out["last"], out


def test_langchain_streams_and_parses_structured_output(peer: Path, server: LiveServer) -> None:
    out = run_client(peer, "langchain_basics.py", f"{server.url}/v1")
    assert out["chunks"] > 1 and out["text"], out
    assert out["structured"] is not None and set(out["structured"]) == {"answer", "reason"}, out
