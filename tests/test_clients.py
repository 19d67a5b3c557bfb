"""The clients and agent frameworks people already run, unchanged, against the server on
the real default model.

The OpenAI Agents SDK (its chat-completions model and its default, the Responses
API; an agent with a forced tool and one without tools, streamed and not), a
LangGraph ReAct agent on langchain-openai (``required`` and ``auto``, on several
questions), LangChain's streaming and structured output, pydantic-ai (structured
output as a forced call, a function tool, streamed text; both APIs), AutoGen
AgentChat's ``AssistantAgent``, smolagents' ``ToolCallingAgent`` (a forced call
every step), instructor's OpenAI modes, and a real OTLP collector (Arize Phoenix)
that a collaboration's trace is read back from (LiteLLM, run on a preset by
``test_presets_real``, shares the environment). Each test checks what the
framework's own run gives: it completed, a forced call's arguments are valid
against the tool's schema and its result reached the model, structured output
validated, usage counted. The default model calls no tool when the choice is its
own (``auto``): there the answer is text, and any call it made is checked.

They conflict with vLLM's pins, so they live in virtual environments of their own,
made on first use here (about a minute each): ``tests/.venv-clients``, and
``tests/.venv-frameworks`` for instructor, AutoGen and smolagents, whose pins
conflict with the first's. Each client runs as a script under ``tests/clients/``
that prints one JSON line.
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
import jsonschema
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
    "pydantic-ai-slim[openai]==2.68.0",
)
#: A second peer environment: instructor pins ``jiter<0.15``, which the openai releases
#: pydantic-ai and the Agents SDK resolve to (>=3.50) refuse, and AutoGen pins a
#: protobuf older than Phoenix's; so these three share an environment of their own.
FRAMEWORKS_VENV = HERE / ".venv-frameworks"
FRAMEWORKS = (
    "instructor==1.17.0",
    "autogen-agentchat==0.7.5",
    "autogen-ext[openai]==0.7.5",
    "smolagents==1.26.0",
)


def client_python(venv: Path = VENV, packages: tuple[str, ...] = PACKAGES) -> Path:
    """A peer environment's python, made (about a minute) when missing or stale."""
    python = venv / "bin" / "python"
    stamp = venv / "installed.txt"
    wanted = "\n".join(packages)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
        check=True,
    )
    stamp.write_text(wanted)
    return python


@pytest.fixture(scope="module")
def peer() -> Path:
    return client_python()


@pytest.fixture(scope="module")
def frameworks() -> Path:
    return client_python(FRAMEWORKS_VENV, FRAMEWORKS)


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


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("how", ["once", "stream"])
def test_the_agents_sdks_agent_without_tools_answers(
    peer: Path, server: LiveServer, api: str, how: str
) -> None:
    """The simplest agent: the SDK sends ``tools: []`` on every request (issue 39: a 400
    on the Responses API), and the run ends on the model's own stop: an incomplete
    response is an error to the SDK."""
    out = run_client(peer, "agents_sdk.py", f"{server.url}/v1", api, how, "none")
    assert out["calls"] == [] and "Paris" in out["final"], out
    assert out["usage"]["requests"] == 1, out
    if how == "stream":
        assert out["events"] > 3, out
    if not (api == "chat" and how == "stream"):  # the SDK asks a chat stream for no usage
        assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0, out


QUESTIONS = [
    "How many units of SKU-1234 are left?",
    # issue 39: a 48-digit item at the 64-character bound, cut by max_tokens=64: no call
    "How many widgets are in stock?",
    "Do we have any blue chairs?",
]


@pytest.mark.parametrize("question", QUESTIONS)
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


@pytest.mark.parametrize("question", QUESTIONS)
def test_a_langgraph_react_agent_with_auto_finishes(
    peer: Path, server: LiveServer, question: str
) -> None:
    """``auto`` leaves the call to the model (the default model answers in text on these
    questions): the graph ends on the model's answer, and any call it made was valid."""
    out = run_client(peer, "langgraph_react.py", f"{server.url}/v1", "auto", question)
    assert out["finished"] and out["last"], out
    assert all(0 < len(c) <= 64 for c in out["calls"]), out
    assert len(out["tool_results"]) == len(out["calls"]), out


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
    cached = sum(int(c["attributes"]["gen_ai.usage.cache_read.input_tokens"]) for c in chats)
    assert cached == usage["prompt_tokens_details"]["cached_tokens"]  # the conventions' name
    assert root["attributes"]["gen_ai.response.id"] == r.json()["id"]


# -- pydantic-ai, AutoGen AgentChat, smolagents, instructor ------------------------------------

STOCK_CALL = {  # the ``lookup_stock`` tool every client below defines
    "type": "object",
    "properties": {"item": {"type": "string", "minLength": 1, "maxLength": 64}},
    "required": ["item"],
}


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("how", ["structured", "tool"])
def test_a_pydantic_ai_agent_returns_validated_output(
    peer: Path, server: LiveServer, api: str, how: str
) -> None:
    """pydantic-ai asks for structured output as a forced call of its output tool
    (``tool`` offers ``lookup_stock`` beside it until it is called): the run ends on a
    validated ``Stock``, each request a call."""
    out = run_client(peer, "pydantic_ai_agent.py", f"{server.url}/v1", api, how)
    assert set(out["output"]) == {"item", "units"} and isinstance(out["output"]["units"], int)
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0, out
    if how == "tool":
        assert len(out["calls"]) == 1 and 0 < len(out["calls"][0]) <= 64, out
        assert "17 units" in out["returns"][0], out  # the tool's result went back to the model
        assert out["usage"]["requests"] == 2, out
    else:
        assert out["calls"] == [] and out["usage"]["requests"] == 1, out


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_pydantic_ai_agent_streams_text(peer: Path, server: LiveServer, api: str) -> None:
    out = run_client(peer, "pydantic_ai_agent.py", f"{server.url}/v1", api, "stream")
    assert out["deltas"] > 1 and "Paris" in out["text"], out
    assert out["usage"]["requests"] == 1 and out["usage"]["output_tokens"] > 0, out


@pytest.mark.parametrize("how", ["once", "stream"])
def test_an_autogen_assistant_agent_runs(frameworks: Path, server: LiveServer, how: str) -> None:
    """AutoGen offers its tool with ``tool_choice: "auto"`` (the default model answers in
    text): the run ends on a text message, with no error recorded and any call valid."""
    out = run_client(frameworks, "autogen_agent.py", f"{server.url}/v1", how)
    assert out["errors"] == [] and out["final_type"] in ("TextMessage", "ToolCallSummaryMessage")
    assert isinstance(out["final"], str) and out["final"], out
    for call in out["calls"]:
        assert call["name"] == "lookup_stock", out
        jsonschema.validate(json.loads(call["arguments"]), STOCK_CALL)
    if how == "stream":
        assert out["chunks"] > 1, out
    else:
        assert out["usage"]["prompt_tokens"] > 0 and out["usage"]["completion_tokens"] > 0, out


def test_an_autogen_agent_returns_structured_content(frameworks: Path, server: LiveServer) -> None:
    out = run_client(frameworks, "autogen_agent.py", f"{server.url}/v1", "structured")
    assert out["final_type"] == "StructuredMessage[Stock]", out
    assert set(out["final"]) == {"item", "units"} and isinstance(out["final"]["units"], int)
    assert out["usage"]["prompt_tokens"] > 0 and out["usage"]["completion_tokens"] > 0, out


@pytest.mark.parametrize("how", ["once", "stream"])
def test_a_smolagents_tool_calling_agent_finishes(
    frameworks: Path, server: LiveServer, how: str
) -> None:
    """smolagents forces a call every step (``tool_choice: "required"``, its
    ``final_answer`` tool beside ours): each step made valid calls, none failed, and
    the run ended on ``final_answer`` within its steps."""
    out = run_client(frameworks, "smolagents_agent.py", f"{server.url}/v1", how)
    assert out["errors"] == [] and out["state"] == "success", out
    assert out["calls"] and out["calls"][-1]["name"] == "final_answer", out
    for call in out["calls"]:
        if call["name"] == "lookup_stock":
            jsonschema.validate(call["arguments"], STOCK_CALL)
        else:
            assert call["name"] == "final_answer" and set(call["arguments"]) == {"answer"}, out
    assert out["output"] is not None, out
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0, out


@pytest.mark.parametrize("how", ["tools", "partial", "json_schema", "responses"])
def test_instructor_extracts_a_validated_model(
    frameworks: Path, server: LiveServer, how: str
) -> None:
    """Each of instructor's OpenAI modes, with no retries: one request gives a valid
    ``Stock`` (``responses`` forces the call and sends the same schema as its text
    format: issue 39, once a 400)."""
    out = run_client(frameworks, "instructor_extract.py", f"{server.url}/v1", how)
    assert set(out["stock"]) == {"item", "units"} and out["stock"]["units"] == 17, out
    if how == "partial":
        assert out["partials"] >= 1, out
    if how in ("tools", "json_schema"):
        assert out["usage"]["prompt_tokens"] > 0 and out["usage"]["completion_tokens"] > 0, out
