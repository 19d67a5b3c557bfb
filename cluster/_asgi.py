"""Calling an ASGI app in process: one HTTP exchange as a stream of parts, and its lifespan.

An engine replica serves the ingress's forwarded requests with microagent's own
app, unchanged (its routes, schemas, sessions, collaborations), by driving the
ASGI protocol directly: the response's start, then each body chunk as the app
sends it (a stream is passed on as it is made, not buffered). Closing the stream
early tells the app its client disconnected and cancels it, so every engine
request it started is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import attrs

__all__ = ["Forwarded", "Lifespan", "ResponseStart", "exchange"]

Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Any]


@attrs.frozen
class Forwarded:
    """An HTTP request as the ingress received it (its body read whole).

    Attributes:
        method: the HTTP method.
        path: the URL path.
        query: the raw query string.
        headers: the request headers, lower-case names.
        body: the request body.
        client: the caller's ``(host, port)``, when known.
    """

    method: str
    path: str
    query: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    client: tuple[str, int] | None = None


@attrs.frozen
class ResponseStart:
    """The first part of a response: its status and headers."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]


async def exchange(
    app: ASGIApp, request: Forwarded, state: dict[str, Any] | None = None
) -> AsyncIterator[ResponseStart | bytes]:
    """Run ``request`` through ``app``: yields a ``ResponseStart``, then the body's chunks.

    ``state`` becomes the request scope's ``state`` (the app's lifespan state and any
    per-request values, such as ``server._admit.USAGE_REPORT``). If the consumer stops
    early, the app sees ``http.disconnect`` and is cancelled.
    """
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query,
        "headers": list(request.headers),
        "client": request.client,
        "server": ("microagent-replica", 80),
        "state": dict(state or {}),
    }
    parts: asyncio.Queue[Message | BaseException | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await parts.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except BaseException as exc:
            await parts.put(exc)
        else:
            await parts.put(None)

    task = asyncio.create_task(run())
    try:
        while True:
            part = await parts.get()
            if part is None:
                return
            if isinstance(part, BaseException):
                raise part
            if part["type"] == "http.response.start":
                yield ResponseStart(
                    int(part["status"]),
                    tuple((bytes(k), bytes(v)) for k, v in part.get("headers", ())),
                )
            elif part["type"] == "http.response.body":
                chunk = bytes(part.get("body", b""))
                if chunk:
                    yield chunk
                if not part.get("more_body", False):
                    gone.set()  # the response is whole: the app may stop listening
                    await task
                    return
    finally:
        gone.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Lifespan:
    """An ASGI app's lifespan: ``start`` runs its startup (opening engines), ``stop`` its
    shutdown. Raises ``RuntimeError`` with the app's message when startup fails."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._outbox.put)
        except BaseException as exc:
            await self._outbox.put({"type": "lifespan.startup.failed", "message": repr(exc)})

    async def _step(self, ask: str, done: str) -> None:
        await self._inbox.put({"type": f"lifespan.{ask}"})
        reply = await self._outbox.get()
        if reply["type"] != f"lifespan.{done}.complete":
            raise RuntimeError(f"the app's {done} failed: {reply.get('message', '')}")

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        await self._step("startup", "startup")

    async def stop(self) -> None:
        if self._task is None or self._task.done():
            return
        try:
            await self._step("shutdown", "shutdown")
        finally:
            await self._task
