"""Which host-tier blocks go first: the agents' own sessions decide, not recency alone.

vLLM's offloading index evicts its least recently used block (``LRUCachePolicy``).
Under pressure the tier is written through by everyone: new programs' first
turns, finished programs, one-shot prompts. LRU then drops the blocks of an
agent that has waited longest on its tool, exactly the session that is about
to come back. microagent runs the agent loop, so it *knows* which sessions are
waiting and when each expects its tool to return (``Retain.next_use``, or the
gap the program's turns showed).

``SessionPolicy`` is vLLM's LRU policy plus that knowledge, plugged in through
the offloading spec's ``cache_policy`` (no vLLM code is changed):

* The retaining scheduler ``hold``s a session's block keys when it retains them
  (the request finished and its owner waits on a tool), with the session's
  expected next use. The keys stay held while the session is *demoted* (its
  device blocks released to make room): the host copy is now its only copy.
* The owner releasing the session, its time-to-live running out, or a restart
  ``forget``s them.
* Eviction takes cold blocks first (held by no session), least recently used
  first, as vLLM would. Only when no cold block is left does it take held ones,
  the session whose next use is furthest away first (KVFlow's steps-to-next-use;
  a late session is expected to be as late again), so no store ever starves.

The sessions' bookkeeping and the choice itself live in ``.._tier_order.TierSessions``
(no vLLM there), which the ScriptedEngine's host store runs too: one set of rules.
This class only keeps vLLM's LRU structures and hands the choice their order.

The policy never holds a block itself: held keys are only *ordered* last, and
vLLM's manager keeps its own guarantees (a block being read or written is never
evicted, the host store never exceeds its rows).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Iterator

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from .._tier_order import TierSessions


class SessionPolicy(LRUCachePolicy):
    """LRU over cold blocks; the blocks of waiting sessions last, furthest next use first."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        #: the sessions held and the eviction choice (shared with the ScriptedEngine)
        self.order: TierSessions[OffloadKey] = TierSessions()

    # -- what the scheduler tells it -------------------------------------------------------
    def hold(
        self,
        owner: str,
        keys: Iterable[OffloadKey],
        *,
        now: float,
        next_use: float | None,
        expires: float | None,
    ) -> None:
        """``owner``'s session now covers ``keys`` (replacing what it held before)."""
        self.order.hold(owner, keys, now=now, next_use=next_use, expires=expires)

    def forget(self, owners: Iterable[str] = (), *, prefix: str | None = None) -> int:
        """End the named sessions (and those whose owner starts with ``prefix``)."""
        return self.order.forget(owners, prefix=prefix)

    def expire(self, now: float) -> int:
        """Forget the sessions past their time-to-live."""
        return self.order.expire(now)

    @property
    def sessions(self) -> int:
        return self.order.sessions

    @property
    def held_keys(self) -> int:
        return self.order.held_keys

    @property
    def cold_evictions(self) -> int:
        """Blocks evicted while no session held them."""
        return self.order.cold_evictions

    @property
    def held_evictions(self) -> int:
        """Blocks evicted while a session held them."""
        return self.order.held_evictions

    def is_held(self, key: OffloadKey) -> bool:
        return self.order.is_held(key)

    # -- vLLM's CachePolicy ----------------------------------------------------------------
    def clear(self) -> None:
        super().clear()
        self.order.clear()

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        chosen = self.order.choose(n, self._lru_order(), protected, time.monotonic())
        if chosen is None:
            return None  # atomic, as vLLM's policies are: nothing changed
        evicted = []
        for key in chosen:
            self._evictable.remove(key)
            self._ranks.pop(key, None)
            chunk = self.chunks.pop(key)
            assert chunk.ref_cnt == 0
            evicted.append((key, chunk))
        self._maybe_compact_heap()
        return evicted

    def _lru_order(self) -> Iterator[OffloadKey]:
        """The evictable keys, least recently used first, read lazily off a copy of
        vLLM's heap (stale and repeated entries skipped, as ``LRUCachePolicy.evict`` does)."""
        heap = list(self._heap)
        seen: set[OffloadKey] = set()
        while heap:
            entry = heapq.heappop(heap)
            key = entry[1]
            if key not in seen and self._is_current(entry):
                seen.add(key)
                yield key
