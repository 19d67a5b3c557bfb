"""Smoke tests of every demo, on the shared real engine (one per test session)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from _engine import RealEngine
from microagent import CollaborationEvent, Outcome

pytestmark = pytest.mark.engine

DEMOS = Path(__file__).parent.parent / "demos"


def load(name: str) -> ModuleType:
    """Import ``demos/<name>.py`` as a module (demos are scripts, not a package)."""
    key = f"_demo_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, DEMOS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def test_code_review(real_engine: RealEngine) -> None:
    demo = load("code_review")
    source = (DEMOS / "data" / "inventory.py").read_text()
    events: list[CollaborationEvent] = []
    outcome: Outcome = real_engine.call(
        lambda: demo.review(real_engine.bridge, source, on_event=events.append, max_tokens=48)
    )
    assert outcome.details["decision"] in ("yes", "no")
    assert outcome.answer  # the aggregator's review
    roles = [a.role for a in outcome.agents]
    assert roles.count("voter") == 3 and roles.count("aggregator") == 1
    assert {"agent_started", "delta", "vote", "final"} <= {e.type for e in events}
    # the 2 400-token file was prefilled once: the other reviewers hit the cache
    assert outcome.usage.cached_tokens >= 2 * 2048
    real_engine.assert_idle()


def test_debate_math(real_engine: RealEngine) -> None:
    demo = load("debate_math")
    problem, _ = demo.PROBLEMS[0]
    outcome: Outcome = real_engine.call(
        lambda: demo.solve(real_engine.bridge, problem, max_tokens=32)
    )
    assert outcome.mode == "debate" and outcome.answer
    assert 1 <= outcome.rounds <= 2
    real_engine.assert_idle()


def test_reflect_json(real_engine: RealEngine) -> None:
    demo = load("reflect_json")
    outcome: Outcome = real_engine.call(
        lambda: demo.extract(real_engine.bridge, rounds=2, max_tokens=48)
    )
    assert "valid" in outcome.details
    history = outcome.details["history"]
    assert history and all("valid" in step for step in history)
    real_engine.assert_idle()


def test_custom_mode(real_engine: RealEngine) -> None:
    demo = load("custom_mode")
    events: list[CollaborationEvent] = []
    outcome: Outcome = real_engine.call(
        lambda: demo.run(real_engine.bridge, "What is 17 * 3?", on_event=events.append)
    )
    assert outcome.mode == "solve_and_check"
    checked = [e for e in events if e.type == "checked"]
    assert checked  # the custom Checker actor answered through its mailbox
    if outcome.details["verified"]:  # the Checker's rule: the answer's last number is right
        assert re.findall(r"-?\d+", outcome.answer)[-1] == "51"
    real_engine.assert_idle()


def test_custom_checker_actor_alone() -> None:
    demo = load("custom_mode")
    import anyio
    from microagent import Runtime

    async def go() -> tuple[bool, bool]:
        async with Runtime() as rt:
            ref = rt.spawn(demo.Checker, name="checker")
            good = await ref.ask(demo.Check("What is 6 * 7?", "42"))
            bad = await ref.ask(demo.Check("What is 6 * 7?", "41"))
            return good, bad

    assert anyio.run(go) == (True, False)


def test_embed_fastapi(real_engine: RealEngine) -> None:
    demo = load("embed_fastapi")

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        app = demo.create_app(real_engine.bridge)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                item = (await client.get("/items/7")).json()
                answer = (await client.get("/ask", params={"q": "Is 17 a prime number?"})).json()
                return item, answer

    item, answer = real_engine.call(go)
    assert item == {"id": 7, "name": "item 7"}
    assert answer["answer"] in ("yes", "no")
    real_engine.assert_idle()


def test_graph_review(real_engine: RealEngine) -> None:
    demo = load("graph_review")
    outcome: Outcome = real_engine.call(lambda: demo.review(real_engine.bridge, max_tokens=24))
    nodes = outcome.details["nodes"]
    assert nodes["planner"]["iterations"] == 1 and nodes["final"]["iterations"] == 1
    assert outcome.answer
    real_engine.assert_idle()


def test_openai_client(real_engine: RealEngine) -> None:
    """The SDK demo against `microagent serve`'s app, live on 127.0.0.1, on the shared engine."""
    from openai import OpenAI
    from test_server_helpers import live_server

    demo = load("openai_client")
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge}, portal=real_engine.portal, open_engines=False
    ) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)
        answer, events = demo.stream_debate(client, bridge.model, "What is 6 + 7?", max_tokens=16)
    assert answer
    types = {e["type"] for e in events}
    assert {"agent_started", "delta", "agent_finished", "final"} <= types
    assert {e["agent"] for e in events if e["type"] == "agent_started"} >= {
        "debater-1",
        "debater-2",
        "debater-3",
    }
    real_engine.assert_idle()


@pytest.mark.parametrize("use_mcp", [False, True], ids=["python-tool", "mcp-tool"])
def test_tool_agent(real_engine: RealEngine, use_mcp: bool) -> None:
    demo = load("tool_agent")
    events: list[CollaborationEvent] = []

    async def go() -> Outcome:
        if not use_mcp:
            return await demo.ask(real_engine.bridge, [demo.stock], on_event=events.append)
        server = demo.McpServer(sys.executable, (str(demo.MCP_SERVER),))
        async with demo.mcp_tools(server) as tools:
            return await demo.ask(real_engine.bridge, tools, on_event=events.append)

    outcome: Outcome = real_engine.call(go)
    assert outcome.answer
    results = [e for e in events if e.type == "tool_result"]
    assert len(results) == 2 and all(
        e.data["ok"] and "in stock" in e.data["output"] for e in results
    )
    real_engine.assert_idle()


def test_hybrid_cascade(real_engine: RealEngine) -> None:
    """The hybrid demo with a fake remote verifier (tests/test_remote_real.py runs it on vLLM's)."""
    from _fake_openai import Reply, fake_endpoint
    from microagent import RemoteBridge

    demo = load("hybrid_cascade")

    async def go() -> tuple[Outcome, list[str]]:
        async with (
            # "ACCEPT yes": accepted, or (drafts that name no choice, at temperature 0.9) "yes"
            fake_endpoint(Reply(("ACCEPT yes",), usage=(90, 2, 0))) as fake,
            RemoteBridge("verifier", fake.url) as remote,
        ):
            outcome = await demo.check(
                real_engine.bridge, remote, demo.QUESTIONS[0], verify="always"
            )
            return outcome, [m["content"] for m in fake.requests[0].body["messages"]]

    outcome, sent = real_engine.call(go)
    assert outcome.details["escalated"] is True
    assert outcome.details["verdict"] in ("accepted", "answered")
    assert outcome.answer in ("yes", "no")
    assert outcome.usage_by_model["verifier"].prompt_tokens == 90
    assert "Draft 1:" in sent[-1]  # the local drafts reached the remote as text
    assert "verifier (remote): 1 requests" in demo.report(outcome)
    real_engine.assert_idle()
