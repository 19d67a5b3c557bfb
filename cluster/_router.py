"""Ray Serve's request router for engine replicas: a request goes where its KV lives.

Serve calls ``choose_replicas`` for each request on the ingress's handle; the
request's ``RouteHint`` (a keyword argument of the call) carries its key. The
key's replica is chosen by rendezvous hashing (highest random weight) over the
replicas' ids: every ingress agrees without shared state, and when a replica
joins or leaves only the keys that mapped to it move. A preferred replica with
``affinity_max_queue`` requests in flight is overloaded: the request goes to the
less loaded of two other replicas (power of two choices) and its response says
``fallback``. Requests with no key go by power of two choices alone.
"""

from __future__ import annotations

import hashlib
import importlib
import random
from collections import OrderedDict
from types import ModuleType
from typing import TYPE_CHECKING

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from ._route import RouteHint

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["AffinityRouter", "rendezvous"]

#: The keyword argument of an engine replica's methods that carries the ``RouteHint``.
ROUTE_KWARG = "route"
#: ``RouteHint.ticket`` -> the replica its key maps to, as the router chose (the router runs
#: in the calling process: the ingress reads it here with ``preferred_for``). Bounded.
PREFERRED: OrderedDict[int, str | None] = OrderedDict()
PREFERRED_KEPT = 65536


#: This module's name. Serve ships a request router's class to the handles by value
#: (cloudpickle), with copies of its module's globals: a copy must reach the state above
#: through the module as imported in its process (``_home``).
HOME = "microagent.cluster._router"


def _home() -> ModuleType:
    return importlib.import_module(HOME)


def preferred_for(hint: RouteHint) -> str | None:
    """The replica the router preferred for ``hint`` (None: none, or not routed here)."""
    return PREFERRED.pop(hint.ticket, None)


def _record(hint: RouteHint, replica: str | None) -> None:
    PREFERRED[hint.ticket] = replica
    while len(PREFERRED) > PREFERRED_KEPT:
        PREFERRED.popitem(last=False)


def rendezvous(key: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` ordered by their rendezvous weight for ``key`` (the first is its home)."""

    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


class AffinityRouter(RequestRouter):
    """Session and prefix affinity with a power-of-two-choices fallback (see the module).

    Serve builds one per deployment handle; ``initialize_state`` takes the
    deployment's ``request_router_kwargs``.
    """

    def initialize_state(self, affinity_max_queue: int = 32, **_: object) -> None:
        self.affinity_max_queue = affinity_max_queue

    def _queue(self, replica: RunningReplica) -> int:
        """In-flight requests Serve last saw on ``replica`` (0 when it has not probed yet)."""
        known = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if known is None else known

    def _two_choices(self, replicas: Sequence[RunningReplica]) -> list[RunningReplica]:
        if len(replicas) <= 2:
            return sorted(replicas, key=self._queue)
        return sorted(random.sample(list(replicas), 2), key=self._queue)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        hint = None if pending_request is None else pending_request.kwargs.get(ROUTE_KWARG)
        if not candidate_replicas:
            return []
        # duck-typed: this class may be a by-value copy whose ``RouteHint`` is another class
        if hint is None or getattr(hint, "kind", "any") not in ("session", "prefix", "replica"):
            return [self._two_choices(candidate_replicas)]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if hint.kind == "replica":  # pinned: that replica, or any when it is gone
            pinned = by_id.get(hint.key)
            _home()._record(hint, None if pinned is None else hint.key)
            return [[pinned]] if pinned is not None else [self._two_choices(candidate_replicas)]
        order = rendezvous(hint.key, list(by_id))
        home = by_id[order[0]]
        _home()._record(hint, order[0])  # the ingress compares it with the replica that answered
        others = [by_id[i] for i in order[1:]]
        if self._queue(home) >= self.affinity_max_queue and others:
            return [self._two_choices(others), [home]]
        return [[home], self._two_choices(others)] if others else [[home]]
