"""An engine replica: microagent's whole app over one engine, called by the ingress.

Each replica builds the app ``microagent serve`` would from the same options
(``server.served_app``), opens its engines in its constructor (Serve marks the
replica ready only then), and answers the ingress's forwarded requests through
the app in process (``exchange``). Quotas are the ingress's: the replica's
app reports each request's tokens back with the response (``Usage``), and the
replica's own app runs with none.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence

import attrs

from ..server import USAGE_REPORT, serve_options, served_app
from ._asgi import Forwarded, Lifespan, ResponseStart, exchange
from ._route import RouteHint

__all__ = ["EngineReplica", "Usage", "replica_options"]

#: The response header naming the replica that served the request.
REPLICA_HEADER = b"x-microagent-replica"


@attrs.frozen
class Usage:
    """The last part of a replica's answer: the tokens the request used (for the quota)."""

    tokens: int


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
        self.served = served_app(replica_options(serve_args), open_engines=True)
        self.lifespan = Lifespan(self.served.app)
        await self.lifespan.start()  # the engines open here: ready means serving

    async def __del__(self) -> None:
        await self.lifespan.stop()

    async def answer(
        self, request: Forwarded, route: RouteHint | None = None
    ) -> AsyncIterator[ResponseStart | bytes | Usage]:
        """``request`` through the app: its start (naming this replica), its body's chunks
        as they are made, then the tokens it used. (``route`` is the router's: Serve's
        request router reads it from this call's arguments.)"""
        used: list[int] = []
        state = {**self.lifespan.state, USAGE_REPORT: used.append}
        async for part in exchange(self.served.app, request, state):
            if isinstance(part, ResponseStart):
                headers = (*part.headers, (REPLICA_HEADER, self.replica_id.encode()))
                part = ResponseStart(part.status, headers)
            yield part
        yield Usage(sum(used))
