"""Engine death under load: a non-streaming request runs again, or gets a 503 that says when.

On the ScriptedEngine (``kill()`` fails every request in flight and restarts at
once) each rule is checked alone: a collaboration or a plain completion whose
engine died is run again and answers 200; one that executed a tool, or whose
deadline has passed, gets 503 with ``Retry-After``; a stream ends with an
``error`` event and ``[DONE]``; the metrics count each case. The acceptance test
kills the real EngineCore under 12 non-streaming and 4 streaming collaborations.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from microagent.collab import Tool
from microagent.server import EventBuffer, ServerLimits, create_app
from microagent.server._sse import SSEResponse
from microagent.testing import ScriptedEngine
from test_server_helpers import eventually, live_server

if TYPE_CHECKING:
    from _engine import RealEngine

USER = [{"role": "user", "content": "Is the answer yes or no?"}]
VOTE = {
    "messages": USER,
    "max_tokens": 24,
    "agents": [{"name": "voter", "count": 3}],
    "collaboration": {"mode": "vote", "early_stop": False},
}


@asynccontextmanager
async def serving(
    engine: ScriptedEngine, limits: ServerLimits | None = None, tools: tuple[Tool, ...] = ()
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    async with engine:
        app = create_app({"scripted": engine}, limits=limits, tools=tools)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=60
        ) as client:
            yield client, app


async def killed_while(
    client: httpx.AsyncClient,
    engine: ScriptedEngine,
    body: dict[str, Any],
    ready: Callable[[], object] | None = None,
) -> httpx.Response:
    """Post ``body``; kill the engine once ``ready()`` holds (default: a request is live)."""
    responses: list[httpx.Response] = []

    async def post() -> None:
        responses.append(await client.post("/v1/chat/completions", json=body))

    async with anyio.create_task_group() as tg:
        tg.start_soon(post)
        await eventually(ready or engine.live_requests)
        engine.kill("killed by the test")
    return responses[0]


def metric_lines(text: str, name: str) -> dict[str, float]:
    """``labels -> value`` of one metric family in a Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, value = line.rsplit(" ", 1)
            out[key[len(name) :]] = float(value)
    return out


def slow_engine() -> ScriptedEngine:
    return ScriptedEngine(decode_time_per_token=0.01, reply_words=(30, 40))


@pytest.mark.anyio
async def test_a_collaboration_whose_engine_died_runs_again_and_answers_200(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    engine = slow_engine()
    async with serving(engine) as (client, app):
        r = await killed_while(client, engine, VOTE)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        text = (await client.get("/metrics")).text
    retries = metric_lines(text, "microagent:engine_retries_total")
    assert retries == {'{kind="collaboration",outcome="ok"}': 1}
    assert metric_lines(text, "microagent:engine_lost_total") == {}
    assert metric_lines(text, "microagent:engine_deaths_total") == {'{model_name="scripted"}': 1}
    assert metric_lines(text, "microagent:engine_restarts_total") == {'{model_name="scripted"}': 1}
    # the client's collaboration is counted once, as it ended
    assert metric_lines(text, "microagent:collaborations_total") == {'{mode="vote",status="ok"}': 1}
    assert engine.stats().requests_failed >= 1  # the first run's requests died
    assert not engine.live_requests()
    assert app.state.microagent.requests == 0


@pytest.mark.anyio
async def test_a_plain_completion_whose_engine_died_runs_again(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    engine = slow_engine()
    async with serving(engine) as (client, _):
        r = await killed_while(client, engine, {"messages": USER, "max_tokens": 30, "n": 2})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
        assert r.json()["usage"]["completion_tokens"] > 0
        text = (await client.get("/metrics")).text
    assert metric_lines(text, "microagent:engine_retries_total") == {
        '{kind="completion",outcome="ok"}': 1
    }
    assert engine.epoch == 1 and not engine.live_requests()


@pytest.mark.anyio
async def test_a_collaboration_that_ran_a_tool_is_not_run_again(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    called = anyio.Event()

    async def probe(city: str) -> str:
        """Look a city up (this one has an effect: it is called)."""
        called.set()
        return f"{city}: 2 million"

    engine = slow_engine()
    body = {
        "messages": USER,
        "max_tokens": 30,
        "agents": [{"name": "analyst", "count": 2}],
        "collaboration": {
            "mode": "debate",
            "rounds": 1,
            "tools": ["probe"],
            "tool_choice": "required",
        },
    }
    async with serving(engine, tools=(Tool.from_function(probe),)) as (client, _):
        # killed while an agent generates after its tool call
        r = await killed_while(
            client, engine, body, ready=lambda: called.is_set() and engine.live_requests()
        )
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        error = r.json()["error"]
        assert error["code"] == "engine_unavailable"
        assert "tool ran" in error["message"]
        text = (await client.get("/metrics")).text
    assert metric_lines(text, "microagent:engine_lost_total") == {
        '{kind="collaboration",reason="tool_ran"}': 1
    }
    assert metric_lines(text, "microagent:engine_retries_total") == {}
    assert metric_lines(text, "microagent:collaborations_total") == {
        '{mode="debate",status="failed"}': 1
    }
    assert len(engine.history) > 0 and not engine.live_requests()


@pytest.mark.anyio
async def test_past_its_deadline_a_request_gets_503_with_retry_after(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    engine = slow_engine()
    async with serving(engine, ServerLimits(retry_deadline=0, retry_after=3)) as (client, _):
        r = await killed_while(client, engine, VOTE)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "3"
        assert "deadline" in r.json()["error"]["message"]
        ok = await client.post("/v1/chat/completions", json=VOTE)  # the new engine serves
        assert ok.status_code == 200
        text = (await client.get("/metrics")).text
    assert metric_lines(text, "microagent:engine_lost_total") == {
        '{kind="collaboration",reason="deadline"}': 1
    }


@pytest.mark.anyio
@pytest.mark.parametrize("agents", [True, False], ids=["collaboration", "completion"])
async def test_a_stream_whose_engine_died_ends_with_an_error_event_and_done(
    anyio_backend: tuple[str, dict[str, object]], agents: bool
) -> None:
    engine = slow_engine()
    body: dict[str, Any] = (
        {**VOTE, "stream": True}
        if agents
        else {
            "messages": USER,
            "max_tokens": 30,
            "stream": True,
        }
    )
    async with serving(engine) as (client, _):
        r = await killed_while(client, engine, body)
        assert r.status_code == 200
        lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        text = (await client.get("/metrics")).text
    assert lines[-1] == "[DONE]"
    first, last = json.loads(lines[0]), json.loads(lines[-2])
    assert first["choices"][0]["delta"]["role"] == "assistant"  # data went out before
    assert last["error"]["code"] == "engine_unavailable"
    kind = "collaboration" if agents else "completion"
    assert metric_lines(text, "microagent:engine_lost_total") == {
        f'{{kind="{kind}",reason="stream"}}': 1
    }


@pytest.mark.anyio
async def test_a_failing_producer_still_ends_its_stream(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    async def produce(buffer: EventBuffer) -> None:
        raise RuntimeError("a bug in the producer")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await SSEResponse(produce, EventBuffer(4))(scope, receive, send)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/")
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    error = json.loads(lines[0])["error"]
    assert error["type"] == "server_error" and "a bug in the producer" in error["message"]


def test_the_engine_failure_behind_an_error_is_found_wherever_it_is() -> None:
    from microagent.collab import CollaborationFailed
    from microagent.engine_bridge import EngineDied, EngineUnavailable
    from microagent.server._retry import engine_cause

    died = EngineDied("killed", 3)
    wrapped = RuntimeError("an actor failed")
    wrapped.cause = died  # type: ignore[attr-defined]  # how actor failures carry theirs
    assert engine_cause(CollaborationFailed("vote failed", (), wrapped)) is died
    assert engine_cause(ExceptionGroup("roles", [ValueError("x"), died])) is died
    try:
        raise ValueError("outer") from died
    except ValueError as exc:
        assert engine_cause(exc) is died
    gone = EngineUnavailable("3 restarts failed")
    assert engine_cause(gone) is gone
    assert engine_cause(CollaborationFailed("no voter produced an answer")) is None


@pytest.mark.anyio
async def test_a_death_is_seen_even_when_the_failure_does_not_name_it(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    from microagent.server._retry import death_counts, died_since

    engine, other = ScriptedEngine(), ScriptedEngine(model="other")
    before = death_counts([engine, other])
    assert died_since([engine, other], before) is None
    engine.kill()
    engine.kill()  # two deaths, two epochs
    assert died_since([engine, other], before) == (engine, 0)
    assert engine.deaths == engine.restarts == 2 and other.deaths == 0


@pytest.mark.anyio
async def test_a_request_runs_again_once_only(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    from microagent.engine_bridge import EngineDied
    from microagent.server import ServerMetrics
    from microagent.server._retry import EngineLost, run_retrying

    attempts: list[int] = []
    lost: list[int] = []

    async def always_dies() -> None:
        attempts.append(1)
        raise EngineLost(EngineDied("killed", len(attempts)), 4)

    metrics = ServerMetrics()
    with pytest.raises(EngineLost) as info:
        await run_retrying(
            always_dies,
            kind="completion",
            metrics=metrics,
            deadline=anyio.current_time() + 60,
            on_lost=lambda: lost.append(1),
        )
    assert len(attempts) == 2 and lost == [1]
    assert info.value.headers["retry-after"] == "4"
    assert metrics.value("microagent:engine_retries_total", kind="completion", outcome="failed")
    assert metrics.value("microagent:engine_lost_total", kind="completion", reason="retry_failed")


# -- the real engine ---------------------------------------------------------------------


@pytest.mark.engine
def test_killing_the_engine_core_under_load(real_engine: RealEngine) -> None:
    """12 non-streaming and 4 streaming collaborations in flight when the EngineCore dies."""
    bridge = real_engine.bridge
    deaths, restarts = bridge.deaths, bridge.restarts
    limits = ServerLimits(max_concurrent_collaborations=32, retry_deadline=400)
    body = {
        "messages": [{"role": "user", "content": "Name one colour of the sky. Explain briefly."}],
        "max_tokens": 32,
        "agents": [{"name": "voter", "count": 2, "temperature": 0.8}],
        "collaboration": {"mode": "vote", "early_stop": False},
    }
    with live_server(
        lambda: {bridge.model: bridge},
        portal=real_engine.portal,
        open_engines=False,
        limits=limits,
    ) as srv:
        plain: list[httpx.Response] = []
        streams: list[list[str]] = [[] for _ in range(4)]
        killed_at: list[float] = []

        async def post(client: httpx.AsyncClient) -> None:
            plain.append(await client.post("/v1/chat/completions", json=body))

        async def stream(client: httpx.AsyncClient, lines: list[str]) -> None:
            async with client.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True}
            ) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=600) as client:
                with anyio.fail_after(500):  # none hangs
                    async with anyio.create_task_group() as tg:
                        for _ in range(12):
                            tg.start_soon(post, client)
                        for lines in streams:
                            tg.start_soon(stream, client, lines)
                        await eventually(
                            lambda: (  # every voter of all 16 has its engine request
                                len(bridge.live_requests()) >= 32
                                and all(streams)
                                and bridge.stats().scheduler_running > 0
                            ),
                            300,
                        )
                        pids = bridge.engine_core_pids()
                        assert pids
                        killed_at.append(time.monotonic())
                        for pid in pids:
                            os.kill(pid, signal.SIGKILL)
                    done = time.monotonic()
                    after = await client.post(
                        "/v1/chat/completions",
                        json={"messages": USER, "max_tokens": 4},
                    )
                    assert after.status_code == 200, after.text
            print(
                f"all 16 ended {done - killed_at[0]:.1f} s after the kill; "
                f"non-streaming: {sorted(r.status_code for r in plain)}"
            )

        anyio.run(scenario)
        text = httpx.get(f"{srv.url}/metrics").text

    assert len(plain) == 12
    for r in plain:
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200:
            assert r.json()["choices"][0]["message"]["content"]
        else:
            assert int(r.headers["retry-after"]) >= 1
    for lines in streams:
        assert lines[-1] == "[DONE]"
        assert json.loads(lines[-2])["error"]["code"] == "engine_unavailable"
    assert (bridge.deaths, bridge.restarts) == (deaths + 1, restarts + 1)
    retries = metric_lines(text, "microagent:engine_retries_total")
    ok = int(retries.get('{kind="collaboration",outcome="ok"}', 0))
    failed = int(retries.get('{kind="collaboration",outcome="failed"}', 0))
    assert ok + failed == 12  # every one of them lost its requests, and ran again
    assert ok == sum(1 for r in plain if r.status_code == 200)
    lost = metric_lines(text, "microagent:engine_lost_total")
    assert lost['{kind="collaboration",reason="stream"}'] == 4
    assert sum(lost.values()) - 4 == sum(1 for r in plain if r.status_code == 503)
    print(f"ran again: {ok} answered 200, {failed} got 503")
    # the shared engine is healthy for the tests after this one
    real_engine.call(bridge.wait_ready, 120.0)
    real_engine.assert_idle(30)
    assert not bridge.engine.errored
