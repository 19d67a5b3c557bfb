"""A live uvicorn server on 127.0.0.1 for the server tests, and tests of that helper.

``LiveServer`` runs ``create_app(...)`` under uvicorn inside an anyio blocking
portal (asyncio), on a socket bound to a free port. Engines must live on the
same event loop as the server: pass a factory, it is called on that loop (or
pass the portal of an engine fixture that already runs one).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
import uvicorn
from microagent.collab import Tool
from microagent.collab.trace import OtlpTracing
from microagent.engine_bridge import EngineBridge
from microagent.server import ServerLimits, SessionSettings, create_app
from microagent.testing import ScriptedEngine


class LiveServer:
    """A running server: ``url``, ``app``, ``engines`` and the ``portal`` it runs on."""

    def __init__(
        self,
        portal: anyio.from_thread.BlockingPortal,
        app: Any,
        engines: Mapping[str, EngineBridge],
        port: int,
    ) -> None:
        self.portal = portal
        self.app = app
        self.engines = dict(engines)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.headers = {}
        self.admin_headers = {}
        self.health_latencies = []

    @property
    def state(self) -> Any:
        return self.app.state.microagent

    def metric(self, name: str) -> float:
        """A metric's value as /metrics shows it, summed over its label sets (each
        engine's ``model_name``); KeyError when the family has no sample."""
        text = httpx.get(f"{self.url}/metrics", headers=self.admin_headers).text
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + " ", name + "{"))
        ]
        if not values:
            raise KeyError(name)
        return sum(values)

    headers: dict[str, str]
    #: what reads /metrics: the admin key when the server has one
    admin_headers: dict[str, str]
    #: with ``live_server(watch_health=True)``: each ``GET /health``'s latency, in seconds
    #: (filled when the server's block ends)
    health_latencies: list[float]


#: the most a ``GET /health`` may take while a hostile request runs (issue 36's acceptance)
HEALTH_BOUND_S = 1.0

#: polls ``GET <argv[1]>`` every 250 ms until its stdin closes, printing each status and
#: latency
_POLLER = """
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with httpx.Client(timeout=120) as client:
    while not stop.is_set():
        start = time.monotonic()
        status = client.get(sys.argv[1]).status_code
        print(status, time.monotonic() - start, flush=True)
        stop.wait(0.25)
"""


@contextlib.contextmanager
def health_watch(url: str) -> Iterator[list[float]]:
    """Poll ``url``'s ``/health`` every 250 ms from another process while the block runs.

    A process of its own: a request that holds the GIL (a backtracking match, a huge
    integer) would freeze a poller thread of the server's process too. The poller has
    answered once before the block starts. When the block ends without an exception,
    every answer must have been a 200 within ``HEALTH_BOUND_S``; the yielded list holds
    the latencies then."""
    latencies: list[float] = []
    with subprocess.Popen(
        [sys.executable, "-c", _POLLER, f"{url}/health"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as poller:
        assert poller.stdin is not None and poller.stdout is not None
        first = poller.stdout.readline()  # it polls: the block starts beside it
        try:
            yield latencies
        finally:
            out, _ = poller.communicate("", timeout=30)
            answers = [line.split() for line in (first + out).splitlines()]
            latencies.extend(float(took) for _, took in answers)
    assert answers and all(status == "200" for status, _ in answers), answers
    assert max(latencies) < HEALTH_BOUND_S, latencies


@contextlib.contextmanager
def live_server(
    make_engines: Callable[[], Mapping[str, EngineBridge]],
    *,
    portal: anyio.from_thread.BlockingPortal | None = None,
    api_key: str | Sequence[str] | None = None,
    admin_key: str | None = None,
    limits: ServerLimits | None = None,
    open_engines: bool = True,
    tools: Sequence[Tool] = (),
    mcp_servers: Mapping[str, Any] | None = None,
    sessions: SessionSettings | None = None,
    tracing: OtlpTracing | None = None,
    send_buffer: int | None = None,
    presets: Mapping[str, Any] | None = None,
    watch_health: bool = False,
) -> Iterator[LiveServer]:
    """Serve ``make_engines()`` on 127.0.0.1 until the block ends (``send_buffer``: the
    connections' ``SO_SNDBUF``, so a client that stops reading stalls the server soon;
    ``presets``: collaborations served by name, as ``serve --preset``; ``watch_health``:
    a ``health_watch`` runs for the whole block, so every ``GET /health`` meanwhile must
    answer 200 within ``HEALTH_BOUND_S``, the acceptance of every hostile request)."""
    with contextlib.ExitStack() as stack:
        if portal is None:
            portal = stack.enter_context(anyio.from_thread.start_blocking_portal("asyncio"))

        async def build() -> tuple[Any, Mapping[str, EngineBridge]]:
            engines = make_engines()
            return create_app(
                engines,
                api_key=api_key,
                admin_key=admin_key,
                limits=limits,
                open_engines=open_engines,
                tools=tools,
                mcp_servers=mcp_servers,
                sessions=sessions,
                tracing=tracing,
                presets=presets,
            ), engines

        app, engines = portal.call(build)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer is not None:  # accepted connections inherit it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        future = portal.start_task_soon(server.serve, [sock])
        try:
            with anyio.from_thread.start_blocking_portal("asyncio") as waiter:
                waiter.call(_wait_started, server)
            live = LiveServer(portal, app, engines, port)
            if isinstance(api_key, str):
                live.headers = {"authorization": f"Bearer {api_key}"}
            if admin_key is not None:
                live.admin_headers = {"authorization": f"Bearer {admin_key}"}
            if watch_health:
                with health_watch(live.url) as live.health_latencies:
                    yield live
            else:
                yield live
        finally:
            server.should_exit = True
            future.result(timeout=30)
            sock.close()


async def eventually(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds: state owned by another thread or process has no event."""
    with anyio.fail_after(timeout):
        while True:
            if predicate():
                return
            await anyio.sleep(0.01)


async def _wait_started(server: uvicorn.Server) -> None:
    await eventually(lambda: server.started, 30)


def real_server(real_engine: Any, **kwargs: Any) -> contextlib.AbstractContextManager[LiveServer]:
    """``live_server`` over the test session's shared real engine (left open afterwards)."""
    bridge = real_engine.bridge
    return live_server(
        lambda: {bridge.model: bridge}, portal=real_engine.portal, open_engines=False, **kwargs
    )


def scripted(**kwargs: Any) -> Callable[[], Mapping[str, EngineBridge]]:
    """A factory of one ScriptedEngine served as ``scripted``."""
    return lambda: {"scripted": ScriptedEngine(**kwargs)}


def test_live_server_serves_health_and_models() -> None:
    with live_server(scripted()) as srv:
        assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
        models = httpx.get(f"{srv.url}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["scripted"]
        assert srv.metric("microagent:engine_requests_running") == 0


def test_the_health_watch_fails_when_the_servers_loop_freezes() -> None:
    """The watch the hostile tests rely on can fail: a loop blocked for 1.5 s (as a
    backtracking match on it did) makes an answer late, and the block's end says so."""

    async def freeze() -> None:
        time.sleep(1.5)  # noqa: ASYNC251  # it blocks the server's loop, as a match on it did

    with (
        pytest.raises(AssertionError) as info,
        live_server(scripted(), watch_health=True) as srv,
    ):
        srv.portal.call(freeze)
        assert httpx.get(f"{srv.url}/health").status_code == 200
    assert max(srv.health_latencies) >= HEALTH_BOUND_S, info.value
    with live_server(scripted(), watch_health=True) as srv:  # the control: no freeze
        assert httpx.get(f"{srv.url}/health").status_code == 200
    assert srv.health_latencies and max(srv.health_latencies) < HEALTH_BOUND_S
