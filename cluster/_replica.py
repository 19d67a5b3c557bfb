"""An engine replica: microagent's whole app over one engine, called by the ingress.

Each replica builds the app ``microagent serve`` would from the same options
(``server.served_app``), opens its engines in its constructor (Serve marks the
replica ready only then), and answers the ingress's forwarded requests through
the app in process (``exchange``). Quotas are the ingress's: the replica's
app reports each request's tokens back with the response (``Usage``), and the
replica's own app runs with none. A request whose client left before its
answer was whole never gets that far: the replica keeps what it used under the
ingress's ticket (``UsageLedger``), and the ingress asks for it (``usage_of``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence

import attrs

from ..server import USAGE_REPORT, serve_options, served_app
from ._asgi import Forwarded, Lifespan, ResponseStart, exchange
from ._route import RouteHint

__all__ = ["Accepted", "EngineReplica", "Usage", "UsageLedger", "replica_options"]

#: The response header naming the replica that served the request.
REPLICA_HEADER = b"x-microagent-replica"
#: Requests whose usage a replica keeps for the ingress to collect (the oldest go first).
USAGE_KEPT = 4096
#: Seconds ``usage_of`` waits for a request that is still winding down to report.
USAGE_WAIT = 10.0


@attrs.frozen
class Accepted:
    """The first part of a replica's answer: the replica that runs it (the ingress asks
    it what the request used if its client leaves first: ``EngineReplica.usage_of``)."""

    replica: str


@attrs.frozen
class Usage:
    """The last part of a replica's answer: the tokens the request used (for the quota)."""

    tokens: int


class UsageLedger:
    """What each request used, by the ingress's ticket, until the ingress collects it.

    A request's app settles its account when it ends, cut short or not (a JSON reply
    and a stream both meter what they use); the replica records that here, so a
    client that left the ingress is charged it rather than nothing. Bounded: at most
    ``kept`` tickets, the oldest dropped first.
    """

    def __init__(self, kept: int = USAGE_KEPT) -> None:
        self.kept = kept
        self._used: OrderedDict[str, int] = OrderedDict()
        self._ready: dict[str, asyncio.Event] = {}

    def __len__(self) -> int:
        return len(self._used)

    def record(self, ticket: str, tokens: int) -> None:
        """``ticket``'s request ended having used ``tokens``."""
        self._used[ticket] = tokens
        self._used.move_to_end(ticket)
        while len(self._used) > self.kept:
            self._used.popitem(last=False)
        ready = self._ready.pop(ticket, None)
        if ready is not None:
            ready.set()

    async def collect(self, ticket: str, timeout: float = USAGE_WAIT) -> int | None:
        """What ``ticket``'s request used, once it has ended (None: unknown here, or it
        did not end within ``timeout`` seconds); collected once."""
        if ticket not in self._used:
            ready = self._ready.setdefault(ticket, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), timeout)
            if self._ready.get(ticket) is ready:
                del self._ready[ticket]
        return self._used.pop(ticket, None)


def replica_options(serve_args: Sequence[str]) -> argparse.Namespace:
    """``microagent serve``'s options for a replica, with quotas left to the ingress.

    Raises:
        ValueError: options ``microagent serve`` would refuse (the message says which).
    """
    try:
        args = serve_options(serve_args)
    except ValueError as exc:
        raise ValueError(f"serve_args: {exc}") from None
    args.key_max_concurrent = None  # counted once, at the ingress
    args.key_tokens_per_minute = None
    return args


class EngineReplica:
    """The engine replica deployment's class (``build_app`` wraps it in ``serve.deployment``)."""

    async def __init__(self, serve_args: Sequence[str]) -> None:  # type: ignore[misc]
        from ray import serve

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.usage = UsageLedger()
        self.served = served_app(replica_options(serve_args), open_engines=True)
        self.lifespan = Lifespan(self.served.app)
        await self.lifespan.start()  # the engines open here: ready means serving

    async def __del__(self) -> None:
        await self.lifespan.stop()

    async def answer(
        self, request: Forwarded, route: RouteHint | None = None, ticket: str | None = None
    ) -> AsyncIterator[Accepted | ResponseStart | bytes | Usage]:
        """``request`` through the app: this replica's name, its start (naming this replica
        too), its body's chunks as they are made, then the tokens it used, also kept under
        ``ticket`` for ``usage_of`` when the caller leaves first. (``route`` is the
        router's: Serve's request router reads it from this call's arguments.)"""
        yield Accepted(self.replica_id)
        used: list[int] = []
        state = {**self.lifespan.state, USAGE_REPORT: used.append}
        try:
            async for part in exchange(self.served.app, request, state):
                if isinstance(part, ResponseStart):
                    headers = (*part.headers, (REPLICA_HEADER, self.replica_id.encode()))
                    part = ResponseStart(part.status, headers)
                yield part
        finally:  # the app settled its account (cut short or not) before this runs
            if ticket is not None:
                self.usage.record(ticket, sum(used))
        yield Usage(sum(used))

    async def usage_of(self, ticket: str, route: RouteHint | None = None) -> int | None:
        """What the request of ``ticket`` used (None: unknown here); the ingress asks when
        its client left before the answer was whole. (``route`` pins this replica.)"""
        return await self.usage.collect(ticket)
