"""Server-Sent Events with back-pressure that never reaches the actors.

Producers (a collaboration's ``on_event``, a plain completion's token loop)
``put`` into an ``EventBuffer`` without ever waiting. A token delta merges into
the same owner's pending delta when there is one; when the buffer is full, a
delta that cannot merge is dropped and counted (the final chunk reports the
count). Everything else — agent start/finish, votes, the answer — is kept, up to
the buffer's bound in bytes (``max_bytes``: pending text plus ``SSE_ITEM_BYTES``
per event): past it the client is not reading, so the buffer drops what waits,
queues the stream's last words (an ``error`` event, ``stream_backlog_exceeded``)
and cancels the producer. Memory per stream stays under the bound whatever the
client does. ``SSEResponse`` sends the buffer to the client and, when the client
disconnects, its backlog overflows, or one write waits longer than
``send_timeout`` (a client that reads nothing), cancels the producer: that
cancels the collaboration, and with it every engine request it started.

A stream is never cut without a last word: a producer that fails, or one the
server cancels while it shuts down (``track``), ends with an ``error`` event and
``[DONE]``.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import anyio
import attrs
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ._errors import ApiError

log = logging.getLogger(__name__)

DONE = "[DONE]"

#: What one pending event counts toward a buffer's bound besides its text (its JSON frame).
SSE_ITEM_BYTES = 256
#: A stream's default bound on what waits unsent (``ServerLimits.max_sse_bytes``).
DEFAULT_MAX_BYTES = 1 << 20
#: Seconds one write may wait for the client by default (``ServerLimits.sse_send_timeout``).
DEFAULT_SEND_TIMEOUT = 30.0

Payload = dict[str, Any] | str


@attrs.define
class StreamItem:
    """One pending SSE message; ``build(text)`` makes its payload when it is sent.

    Attributes:
        build: makes the chunk (a dict, sent as JSON, or a raw string) from ``text``.
        text: the delta text carried so far (merged deltas concatenate here).
        owner: who the delta belongs to (an agent name, a choice index); None for none.
        mergeable: a later delta of the same owner may be appended to this one.
        droppable: may be dropped when the buffer is full.
    """

    build: Callable[[str], Payload]
    text: str = ""
    owner: str | None = None
    mergeable: bool = False
    droppable: bool = False


class EventBuffer:
    """A bounded, never-blocking buffer between producers and one slow consumer.

    Args:
        capacity: pending events past which droppable deltas are dropped.
        max_bytes: what may wait unsent (text plus ``SSE_ITEM_BYTES`` per event); an
            event past it overflows the buffer (see ``overflow``).
    """

    def __init__(self, capacity: int, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if max_bytes < 4 * SSE_ITEM_BYTES:
            raise ValueError(f"max_bytes must be >= {4 * SSE_ITEM_BYTES}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.dropped = 0
        self.merged = 0
        #: what waits unsent now, and the most that ever did (never above ``max_bytes``)
        self.pending_bytes = 0
        self.peak_bytes = 0
        self.overflowed = False
        #: called once when the buffer overflows (``SSEResponse`` cancels the producer)
        self.on_overflow: Callable[[], None] | None = None
        self._items: deque[StreamItem] = deque()
        self._closed = False
        self._waiter: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: StreamItem) -> None:
        """Queue ``item`` now: merge it, keep it, or (a droppable delta, buffer full) drop
        it; an event that would take the backlog past ``max_bytes`` overflows the buffer."""
        if self._closed:
            return
        size = len(item.text)
        if item.mergeable and item.owner is not None:
            for pending in reversed(self._items):
                if pending.owner == item.owner:
                    if pending.mergeable:
                        if self._fits(size, item):
                            pending.text += item.text
                            self.merged += 1
                            self._count(size)
                        return
                    break
        if item.droppable and len(self._items) >= self.capacity:
            self.dropped += 1
            return
        if self._fits(size + SSE_ITEM_BYTES, item):
            self._items.append(item)
            self._count(size + SSE_ITEM_BYTES)
            self._wake()

    def _fits(self, size: int, item: StreamItem) -> bool:
        """Whether ``size`` more bytes fit; if not, a droppable item is dropped and anything
        else overflows the buffer."""
        if self.pending_bytes + size <= self.max_bytes:
            return True
        if item.droppable:
            self.dropped += 1
        else:
            self.overflow()
        return False

    def _count(self, size: int) -> None:
        self.pending_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.pending_bytes)

    def overflow(self) -> None:
        """The client is not reading: drop what waits, queue the stream's last words (an
        ``error`` event and ``[DONE]``), take nothing more and tell ``on_overflow``."""
        if self.overflowed or self._closed:
            return
        self.overflowed = True
        self._items.clear()
        self.pending_bytes = 0
        error = ApiError(
            429,
            f"the client read too slowly: more than {self.max_bytes} bytes of this stream "
            "waited unsent, so it ends here and its work was cancelled",
            code="stream_backlog_exceeded",
            type="rate_limit_error",
        )
        _last_word(self, error)
        self._closed = True
        self._wake()
        if self.on_overflow is not None:
            self.on_overflow()

    def close(self) -> None:
        """No more items; the consumer drains what is queued and stops."""
        self._closed = True
        self._wake()

    async def get(self) -> StreamItem | None:
        """The next item, or None once the buffer is closed and empty."""
        while not self._items:
            if self._closed:
                return None
            self._waiter = anyio.Event()
            await self._waiter.wait()
        item = self._items.popleft()
        self.pending_bytes = max(0, self.pending_bytes - len(item.text) - SSE_ITEM_BYTES)
        return item

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()


def sse_error_ending(error: ApiError) -> bytes:
    """The last words of a stream that failed after it started: its ``error`` event, then
    ``[DONE]`` (what every stream of this server ends with when it fails)."""
    return encode(error.body()) + encode(DONE)


def encode(payload: Payload) -> bytes:
    """One SSE message: ``data: <json or raw>`` and a blank line."""
    import json

    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class SSEResponse(Response):
    """Streams ``produce(buffer)``'s items; a client disconnect cancels ``produce``.

    ``produce`` must put its own final items (``[DONE]`` included) and handle its
    own errors; the buffer is closed when it returns. ``on_disconnect`` runs when
    the client left before the stream ended, ``on_close`` always, at the end.
    ``track`` runs ``produce`` inside a cancel scope someone else may cancel (a
    graceful shutdown): then the stream ends with an ``error`` event and ``[DONE]``.
    A buffer that overflows cancels ``produce`` (its last words are queued); a write
    that waits ``send_timeout`` seconds for the client ends the stream there, the
    client treated as gone.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        produce: Callable[[EventBuffer], Awaitable[None]],
        buffer: EventBuffer,
        *,
        on_disconnect: Callable[[], None] | None = None,
        on_close: Callable[[], None] | None = None,
        track: Callable[[], AbstractContextManager[anyio.CancelScope]] | None = None,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
    ) -> None:
        # no super().__init__: it would add ``content-length: 0`` to a streamed body
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self._produce = produce
        self._buffer = buffer
        self._on_disconnect = on_disconnect
        self._on_close = on_close
        self._track = track or _untracked
        self._send_timeout = send_timeout
        self.disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()

    async def _stream(self, receive: Receive, send: Send) -> None:
        buffer = self._buffer
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async with anyio.create_task_group() as tg:
            producer = anyio.CancelScope()
            buffer.on_overflow = producer.cancel

            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        self._client_left()
                        tg.cancel_scope.cancel()
                        return

            async def produce() -> None:
                try:
                    with producer:  # cancelled when the buffer overflows
                        with self._track() as scope:
                            await self._produce(buffer)
                        if scope.cancelled_caught:  # the server is shutting down
                            _last_word(buffer, _SHUTDOWN)
                except Exception as exc:  # a producer's bug must not cut the stream either
                    log.exception("stream producer failed")
                    error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}")
                    _last_word(buffer, error)
                finally:
                    buffer.close()

            tg.start_soon(watch)
            tg.start_soon(produce)
            try:
                if not await self._send_all(buffer, send):
                    log.warning(
                        "a stream's client read nothing for %g s: the stream ends, its work "
                        "is cancelled",
                        self._send_timeout,
                    )
                    self._client_left()
            except OSError:  # the transport is gone (uvicorn's ClientDisconnected is one)
                self._client_left()
            tg.cancel_scope.cancel()

    async def _send_all(self, buffer: EventBuffer, send: Send) -> bool:
        """Send every item, then the body's end; False when a write waited too long."""
        while (item := await buffer.get()) is not None:
            if not await self._send(send, encode(item.build(item.text)), more=True):
                return False
        return await self._send(send, b"", more=False)

    async def _send(self, send: Send, body: bytes, *, more: bool) -> bool:
        """One write, given at most ``send_timeout`` seconds (False: the client stalled)."""
        with anyio.move_on_after(self._send_timeout):
            await send({"type": "http.response.body", "body": body, "more_body": more})
            return True
        return False

    def _client_left(self) -> None:
        if not self.disconnected:
            self.disconnected = True
            if self._on_disconnect is not None:
                self._on_disconnect()


_SHUTDOWN = ApiError(
    503,
    "the server shut down before the stream finished; retry on another instance",
    code="shutting_down",
)


@contextlib.contextmanager
def _untracked() -> Iterator[anyio.CancelScope]:
    with anyio.CancelScope() as scope:
        yield scope


def _last_word(buffer: EventBuffer, error: ApiError) -> None:
    """End a cut stream the way every stream ends: an ``error`` event, then ``[DONE]``."""
    body = error.body()
    buffer.put(StreamItem(build=lambda _t: body))
    buffer.put(StreamItem(build=lambda _t: DONE))
