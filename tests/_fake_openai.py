"""A small OpenAI-compatible endpoint of the tests' own, over a real socket, with scripted faults.

Each request takes the next ``Reply`` (the last one repeats): a normal SSE
stream of chat completion chunks, an error status (with ``Retry-After``, say),
a delay before any byte, a stream cut after some chunks, or a stream that
hangs until the client closes the connection (``closed`` is then set).
Every request's path, headers and JSON body are kept in ``requests``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import attrs


@attrs.define
class Reply:
    """One scripted reply."""

    pieces: tuple[str, ...] = ("Hello", " world", ".")
    status: int = 200
    headers: dict[str, str] = attrs.field(factory=dict)
    body: str = ""  # the error body (status != 200)
    delay: float = 0.0  # before the status line
    cut_after: int | None = None  # close after this many pieces, no finish, no terminator
    hang_after: int | None = None  # after this many pieces, wait for the client to leave
    finish: str = "stop"
    usage: tuple[int, int, int] | None = (11, 3, 0)  # prompt, completion, cached


@attrs.define
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@attrs.define(eq=False)
class FakeEndpoint:
    replies: list[Reply]
    port: int = 0
    requests: list[Seen] = attrs.field(factory=list)
    closed: anyio.Event = attrs.field(factory=anyio.Event)
    arrived: anyio.Event = attrs.field(factory=anyio.Event)  # set by the first request
    served: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _next(self) -> Reply:
        reply = self.replies[min(self.served, len(self.replies) - 1)]
        self.served += 1
        return reply

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive()
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        size = int(headers.get("content-length", "0"))
        while len(rest) < size:
            rest += await stream.receive()
        self.requests.append(Seen(path, headers, json.loads(rest) if rest else {}))
        self.arrived.set()
        reply = self._next()
        if reply.delay:  # nothing sent meanwhile; a client that leaves is seen (EndOfStream)
            with anyio.move_on_after(reply.delay):
                while await stream.receive():
                    pass
        if reply.status != 200:
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            data = reply.body.encode()
            await stream.send(
                f"HTTP/1.1 {reply.status} Fault\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\nconnection: close\r\n{extra}\r\n".encode()
                + data
            )
            return
        await stream.send(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )

        async def event(payload: dict[str, Any] | str) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            data = f"data: {text}\n\n".encode()
            await stream.send(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake"}
        for i, piece in enumerate(reply.pieces):
            if reply.cut_after == i:
                return  # the connection drops mid-stream
            if reply.hang_after == i:
                with anyio.fail_after(30):
                    while await stream.receive():  # b"" never comes: EndOfStream does
                        pass
            delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            await event({**base, "choices": [delta]})
        done = {"index": 0, "delta": {}, "finish_reason": reply.finish}
        await event({**base, "choices": [done]})
        if reply.usage is not None:
            p, c, cached = reply.usage
            usage = {
                "prompt_tokens": p,
                "completion_tokens": c,
                "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            await event({**base, "choices": [], "usage": usage})
        await event("[DONE]")
        await stream.send(b"0\r\n\r\n")


@asynccontextmanager
async def fake_endpoint(*replies: Reply) -> AsyncIterator[FakeEndpoint]:
    """Serve ``replies`` on a free local port until the block ends."""
    fake = FakeEndpoint(list(replies) or [Reply()])
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async with listener, anyio.create_task_group() as tg:
        fake.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(listener.serve, _watching(fake))
        try:
            yield fake
        finally:
            tg.cancel_scope.cancel()


def _watching(fake: FakeEndpoint) -> Any:
    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await fake._handle(stream)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                fake.closed.set()  # the client closed the connection while we served it

    return handle
