"""The clients people already run, unchanged, against the server on the real default model.

The OpenAI Agents SDK (its chat-completions model and its default, the Responses
API), a LangGraph ReAct agent on langchain-openai, LangChain's streaming and
structured output, and a real OTLP collector (Arize Phoenix) that a
collaboration's trace is read back from (LiteLLM, run on a preset by
``test_presets_real``, shares the environment). They conflict with vLLM's pins, so
they live in a virtual environment of their own (``tests/.venv-clients``, made
on first use here, about a minute) and each client runs as a script under
``tests/clients/`` that prints one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _engine import RealEngine
from microagent.collab.trace import otlp_tracing
from microagent.server import ServerLimits
from test_server_helpers import LiveServer, real_server

pytestmark = [pytest.mark.engine, pytest.mark.clients]

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-clients"
#: What the peer environment holds (pinned: a client's new release must not change a result).
PACKAGES = (
    "openai-agents==0.24.0",
    "langgraph==1.2.22",
    "langchain-openai==1.7.4",
    "arize-phoenix==20.26.1",
    "litellm==1.110.2",
)


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
    with real_server(real_engine, limits=ServerLimits(max_concurrent_collaborations=8)) as srv:
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


@pytest.mark.parametrize(
    "question",
    [
        "How many units of SKU-1234 are left?",
        # issue 39: a 48-digit item at the 64-character bound, cut by max_tokens=64: no call
        "How many widgets are in stock?",
        "Do we have any blue chairs?",
    ],
)
def test_a_langgraph_react_agent_makes_a_valid_call_and_reads_its_result(
    peer: Path, server: LiveServer, question: str
) -> None:
    """``tool_choice="required"``: every turn must call, so the graph runs into its step
    limit, as it would against any server; what matters is a valid first call whose
    result reached the next model turn."""
    out = run_client(peer, "langgraph_react.py", f"{server.url}/v1", "required", question)
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def phoenix(peer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``phoenix serve`` (UI, REST API and OTLP/HTTP on one port), offline, until the end."""
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    with open(work / "phoenix.log", "wb") as log:
        proc = subprocess.Popen(
            [str(peer.parent / "phoenix"), "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # wait for the process to answer (it has no readiness signal)
            assert proc.poll() is None, (work / "phoenix.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "phoenix did not answer in 180 s"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_collaborations_trace_reaches_a_real_collector(
    real_engine: RealEngine, phoenix: str
) -> None:
    """Spans exported over OTLP come back from Phoenix's own API with their structure:
    the collaboration, an agent span per voter under it, a chat span per request under
    those, and the tokens the response reported."""
    tracing = otlp_tracing(phoenix)
    try:
        with real_server(real_engine, tracing=tracing) as srv:
            r = httpx.post(
                f"{srv.url}/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "Is 17 a prime number?"}],
                    "max_tokens": 8,
                    "agents": [{"name": "voter", "count": 3}],
                    "collaboration": {
                        "mode": "vote",
                        "answer": {"choices": ["yes", "no"]},
                        "early_stop": False,
                    },
                },
                timeout=300,
            )
            assert r.status_code == 200, r.text
        assert tracing.flush()
    finally:
        tracing.shutdown()
    usage = r.json()["usage"]
    spans: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(spans) < 7:  # the collector ingests asynchronously: 1 + 3 agents + 3 requests
        got = httpx.get(f"{phoenix}/v1/projects/default/spans", timeout=10)
        assert got.status_code == 200, got.text
        spans = got.json()["data"]
        assert time.monotonic() < deadline, spans
        time.sleep(0.5)
    by_id = {s["context"]["span_id"]: s for s in spans}
    (root,) = [s for s in spans if s["name"] == "invoke_agent microagent.vote"]
    agents = [s for s in spans if s.get("parent_id") == root["context"]["span_id"]]
    assert sorted(s["name"] for s in agents) == [f"invoke_agent voter-{i}" for i in (1, 2, 3)]
    chats = [s for s in spans if s["name"].startswith("chat ")]
    assert len(chats) == 3
    assert all(by_id[c["parent_id"]]["name"].startswith("invoke_agent voter-") for c in chats)
    prompt = sum(int(c["attributes"]["gen_ai.usage.input_tokens"]) for c in chats)
    completion = sum(int(c["attributes"]["gen_ai.usage.output_tokens"]) for c in chats)
    assert (prompt, completion) == (usage["prompt_tokens"], usage["completion_tokens"])
