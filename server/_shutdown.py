"""Graceful shutdown: stop taking work, let the work in flight finish, then cancel it.

A ``Drain`` is shared by the app (``create_app(drain=...)``) and the process
that serves it. Every chat request runs inside one of its cancel scopes (a
stream's producer too). ``drain()`` turns new requests away (503 with
``Retry-After``, and ``/health`` says ``draining``), waits up to ``grace``
seconds for the requests in flight, then cancels the rest: cancelling a
collaboration aborts every engine request it started; a non-streaming request
is answered 503, a stream ends with an ``error`` event and ``[DONE]``.

``DrainingServer`` is uvicorn's server with SIGTERM wired to the drain: the
process exits with status 0 once the drain is over (a second SIGTERM stops at
once, uvicorn's way).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import anyio
import attrs
import uvicorn

from ._errors import ApiError

#: How often ``drain()`` looks at the work in flight (request slots have no event).
_POLL = 0.05
#: Seconds cancelled work gets to end (its final stream events included).
_CANCEL_WAIT = 10.0


@attrs.define(eq=False)
class Drain:
    """The server's graceful-shutdown state.

    Attributes:
        grace: seconds the requests in flight get to finish once draining starts.
        retry_after: seconds suggested in ``Retry-After`` to requests turned away.
        draining: set by ``drain()``: new requests get 503.
        pending: requests holding a slot (the app sets it; a stream holds its slot
            until its last byte is sent, after its producer's scope has ended).
        cancelled: requests cancelled when the grace period ran out.
    """

    grace: float = 30.0
    retry_after: int = 5
    draining: bool = False
    pending: Callable[[], int] = lambda: 0
    cancelled: int = 0
    _scopes: set[anyio.CancelScope] = attrs.field(factory=set, init=False)

    @property
    def in_flight(self) -> int:
        """Work still running: tracked scopes, or requests holding a slot."""
        return max(len(self._scopes), self.pending())

    def refusal(self) -> ApiError:
        """The 503 a request gets while the server drains."""
        return ApiError(
            503,
            "the server is shutting down; retry on another instance or after its restart",
            code="shutting_down",
            headers={"retry-after": str(self.retry_after)},
        )

    def check(self) -> None:
        """Raise the 503 ``refusal()`` once draining started."""
        if self.draining:
            raise self.refusal()

    @contextlib.contextmanager
    def track(self) -> Iterator[anyio.CancelScope]:
        """Run a block of work as in flight; ``drain()`` cancels it when the grace runs out.

        The yielded scope's ``cancelled_caught`` tells the block it was cut short.
        """
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    async def drain(self) -> int:
        """Refuse new work, wait ``grace`` seconds for the rest, then cancel it.

        Returns how many requests were cancelled (also in ``cancelled``).
        """
        self.draining = True
        with anyio.move_on_after(self.grace):
            await self._until_idle()
        cut = list(self._scopes)
        for scope in cut:
            scope.cancel()
        self.cancelled += len(cut)
        with anyio.move_on_after(_CANCEL_WAIT):
            await self._until_idle()
        return len(cut)

    async def _until_idle(self) -> None:
        while self.in_flight:  # noqa: ASYNC110 (request slots are counters, with no event)
            await anyio.sleep(_POLL)


class DrainingServer(uvicorn.Server):
    """uvicorn's server; SIGTERM drains ``drain`` first, then the server stops (status 0).

    Draining keeps the socket open so new requests get a 503 with ``Retry-After``
    rather than a refused connection while the requests in flight finish.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self._drain_requested and self._loop is not None:
            # Not recorded as captured: uvicorn raises captured signals again once it
            # has stopped, and the process would end by SIGTERM instead of status 0.
            self._drain_requested = True
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.drain.drain()
        finally:
            self.should_exit = True
