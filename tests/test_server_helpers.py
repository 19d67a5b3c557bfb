"""A live uvicorn server on 127.0.0.1 for the server tests, and tests of that helper.

``LiveServer`` runs ``create_app(...)`` under uvicorn inside an anyio blocking
portal (asyncio), on a socket bound to a free port. Engines must live on the
same event loop as the server: pass a factory, it is called on that loop (or
pass the portal of an engine fixture that already runs one).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.from_thread
import httpx
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
) -> Iterator[LiveServer]:
    """Serve ``make_engines()`` on 127.0.0.1 until the block ends (``send_buffer``: the
    connections' ``SO_SNDBUF``, so a client that stops reading stalls the server soon;
    ``presets``: collaborations served by name, as ``serve --preset``)."""
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
