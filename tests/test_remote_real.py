"""Hybrid collaborations for real: local agents on the shared engine, a remote on vLLM's own server.

The remote is ``python -m vllm.entrypoints.openai.api_server`` started by
``microagent.testing.VLLMServer`` (``vllm_server`` fixture). Vote and cascade run with
local and remote agents through Python and HTTP; the remote's per-model usage
is checked against the server's own Prometheus counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from _engine import RealEngine
from _vllm_server import SERVED_NAME
from microagent import Outcome, RemoteBridge
from microagent.collab import collaborate
from microagent.testing import VLLMServer, metric_delta
from test_server_helpers import LiveServer, live_server

pytestmark = pytest.mark.engine

CHOICES = ["yes", "no"]
QUESTION = [{"role": "user", "content": "Is 17 a prime number? Answer yes or no."}]


@pytest.fixture(scope="module")
def big(real_engine: RealEngine, vllm_server: VLLMServer) -> Iterator[RemoteBridge]:
    """The vLLM server as remote model ``big`` (opened on the shared engine's loop)."""
    bridge = RemoteBridge("big", vllm_server.base_url, model=SERVED_NAME, timeout=120.0)
    real_engine.call(bridge.open)
    try:
        yield bridge
    finally:
        real_engine.call(bridge.close)


@pytest.fixture(scope="module")
def server(real_engine: RealEngine, big: RemoteBridge) -> Iterator[LiveServer]:
    local = real_engine.bridge
    engines = {local.model: local, "big": big}
    with live_server(lambda: engines, portal=real_engine.portal, open_engines=False) as srv:
        yield srv


def counted(vllm_server: VLLMServer, run: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``run()``'s result and what the server's counters rose by meanwhile."""
    before = vllm_server.metrics()
    result = run()
    return result, metric_delta(before, vllm_server.metrics())


def check_remote_usage(by_model: dict[str, Any], local: str, delta: dict[str, float]) -> None:
    """``big`` is reported as remote with the server's own numbers; the local model beside it."""
    remote, mine = by_model["big"], by_model[local]
    assert remote["remote"] is True and mine["remote"] is False
    assert remote["requests"] >= 1 and mine["requests"] >= 1
    assert remote["prompt_tokens"] == delta["vllm:prompt_tokens_total"]
    assert remote["completion_tokens"] == delta["vllm:generation_tokens_total"]


def test_python_vote_with_local_and_remote_voters(
    real_engine: RealEngine, big: RemoteBridge, vllm_server: VLLMServer
) -> None:
    local = real_engine.bridge
    agents = [{"name": "near", "count": 2}, {"name": "far", "model": "big"}]

    async def run() -> Outcome:
        return await collaborate(
            local,
            "vote",
            QUESTION,
            agents,
            engines={"big": big},
            answer={"choices": CHOICES},
            early_stop=False,
            max_tokens=16,
        )

    outcome, delta = counted(vllm_server, lambda: real_engine.call(run))
    far = next(a for a in outcome.agents if a.name == "far")
    assert far.model == "big" and far.answer in CHOICES and far.finish_reason == "stop"
    assert sum(outcome.votes.values()) == 3 and outcome.answer in CHOICES
    by_model = {k: v.to_dict() for k, v in outcome.usage_by_model.items()}
    check_remote_usage(by_model, local.model, delta)
    assert by_model["big"]["prompt_tokens"] == far.prompt_tokens
    real_engine.assert_idle()
    assert not big.live_requests()


def test_python_cascade_local_drafts_remote_verifies(
    real_engine: RealEngine, big: RemoteBridge, vllm_server: VLLMServer
) -> None:
    demo = _demo()
    local = real_engine.bridge
    outcome, delta = counted(
        vllm_server,
        lambda: real_engine.call(lambda: demo.check(local, big, QUESTION, verify="always")),
    )
    d = outcome.details
    assert d["escalated"] is True and d["retokenized"] is True
    assert d["verdict"] in ("accepted", "rewritten", "answered")  # answered: drafts named none
    assert outcome.usage_by_model["big"].requests == 1
    by_model = {k: v.to_dict() for k, v in outcome.usage_by_model.items()}
    check_remote_usage(by_model, local.model, delta)
    assert "remote" in demo.report(outcome)
    real_engine.assert_idle()


def test_python_aggregate_with_a_remote_aggregator(
    real_engine: RealEngine, big: RemoteBridge, vllm_server: VLLMServer
) -> None:
    """The local proposals reach the remote as text (re-tokenized), never as a local thread."""
    local = real_engine.bridge
    agents = [
        {"name": "proposer", "count": 2},
        {"name": "aggregator", "role": "aggregator", "model": "big"},
    ]

    async def run() -> Outcome:
        return await collaborate(
            local, "aggregate", QUESTION, agents, engines={"big": big}, max_tokens=24
        )

    outcome, delta = counted(vllm_server, lambda: real_engine.call(run))
    assert outcome.answer.strip()
    by_model = {k: v.to_dict() for k, v in outcome.usage_by_model.items()}
    check_remote_usage(by_model, local.model, delta)
    assert by_model["big"]["requests"] == 1 and by_model[local.model]["requests"] == 2
    real_engine.assert_idle()


def test_http_vote_and_cascade_with_a_remote_agent(
    real_engine: RealEngine, server: LiveServer, vllm_server: VLLMServer
) -> None:
    local = real_engine.bridge.model
    bodies = [
        {
            "model": local,
            "messages": QUESTION,
            "max_tokens": 16,
            "agents": [{"name": "near", "count": 2}, {"name": "far", "model": "big"}],
            "collaboration": {"mode": "vote", "early_stop": False, "answer": {"choices": CHOICES}},
        },
        {
            "model": local,
            "messages": QUESTION,
            "max_tokens": 16,
            "agents": [
                {"name": "drafter", "count": 2},
                {"name": "verifier", "role": "verifier", "model": "big"},
            ],
            "collaboration": {"mode": "cascade", "verify": "always"},
        },
    ]
    for body in bodies:
        r, delta = counted(
            vllm_server,
            lambda body=body: httpx.post(
                f"{server.url}/v1/chat/completions", json=body, timeout=300
            ),
        )
        assert r.status_code == 200, r.text
        payload = r.json()
        usage = payload["usage"]
        assert usage["by_model"] == payload["collaboration"]["usage_by_model"]
        check_remote_usage(usage["by_model"], local, delta)
        assert usage["prompt_tokens"] == sum(m["prompt_tokens"] for m in usage["by_model"].values())
    real_engine.assert_idle()


def test_http_plain_completion_on_the_remote_model(
    real_engine: RealEngine, server: LiveServer, vllm_server: VLLMServer
) -> None:
    body = {"model": "big", "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    r, delta = counted(
        vllm_server,
        lambda: httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120),
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["message"]["content"]
    assert out["usage"]["prompt_tokens"] == delta["vllm:prompt_tokens_total"]
    models = [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    assert "big" in models


def _demo() -> Any:
    from test_demos import load

    return load("hybrid_cascade")


def test_cancelling_a_collaboration_closes_the_remote_stream(
    real_engine: RealEngine, big: RemoteBridge, vllm_server: VLLMServer
) -> None:
    """A collaboration cancelled while the remote generates leaves no request on the server."""
    agents = [{"name": "far", "model": "big", "max_tokens": 400}]

    async def run() -> None:
        generating = anyio.Event()

        def on_event(event: Any) -> None:
            if event.type == "delta" and event.agent == "far":
                generating.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: collaborate(
                    real_engine.bridge,
                    "vote",
                    QUESTION,
                    agents,
                    engines={"big": big},
                    on_event=on_event,
                )
            )
            with anyio.fail_after(60):
                await generating.wait()  # the remote is streaming now
            assert big.live_requests()
            tg.cancel_scope.cancel()
        assert not big.live_requests()

    real_engine.call(run)

    async def drained() -> bool:
        with anyio.move_on_after(20):
            # the server's own gauge (another process): there is no event to wait on
            while _running(vllm_server):  # noqa: ASYNC110
                await anyio.sleep(0.1)
            return True
        return False

    assert real_engine.call(drained)


def _running(server: VLLMServer) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )
