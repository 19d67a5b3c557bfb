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

The policy never holds a block itself: held keys are only *ordered* last, and
vLLM's manager keeps its own guarantees (a block being read or written is never
evicted, the host store never exceeds its rows).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable

import attrs
from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from .._retention import expected_wait


@attrs.define(eq=False)
class _Session:
    keys: tuple[OffloadKey, ...]
    retained_at: float
    next_use: float | None
    expires: float | None


class SessionPolicy(LRUCachePolicy):
    """LRU over cold blocks; the blocks of waiting sessions last, furthest next use first."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._sessions: dict[str, _Session] = {}
        self._held: Counter[OffloadKey] = Counter()
        #: blocks evicted while cold / while a session held them
        self.cold_evictions = 0
        self.held_evictions = 0

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
        self.forget([owner])
        session = _Session(tuple(keys), now, next_use, expires)
        if session.keys:
            self._sessions[owner] = session
            self._held.update(session.keys)

    def forget(self, owners: Iterable[str] = (), *, prefix: str | None = None) -> int:
        """End the named sessions (and those whose owner starts with ``prefix``)."""
        names = set(owners)
        if prefix is not None:
            names.update(o for o in self._sessions if o.startswith(prefix))
        ended = 0
        for name in names:
            session = self._sessions.pop(name, None)
            if session is None:
                continue
            ended += 1
            self._held.subtract(session.keys)
            for key in session.keys:
                if self._held[key] <= 0:
                    del self._held[key]
        return ended

    def expire(self, now: float) -> int:
        """Forget the sessions past their time-to-live."""
        due = [o for o, s in self._sessions.items() if s.expires is not None and s.expires <= now]
        return self.forget(due)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def held_keys(self) -> int:
        return len(self._held)

    def is_held(self, key: OffloadKey) -> bool:
        return key in self._held

    # -- vLLM's CachePolicy ----------------------------------------------------------------
    def clear(self) -> None:
        super().clear()
        self._sessions.clear()
        self._held.clear()

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        if not self._held:
            return self._count(super().evict(n, protected), 0)
        cold = sum(1 for k in self._evictable if k not in self._held and k not in protected)
        if cold >= n:
            return self._count(super().evict(n, protected.union(self._held)), 0)
        order = self._held_order(time.monotonic())
        held = [k for k in order if k in self._evictable and k not in protected]
        if cold + len(held) < n:
            return None  # atomic, as vLLM's policies are: nothing changed
        evicted = super().evict(cold, protected.union(self._held)) if cold else []
        assert evicted is not None and len(evicted) == cold
        for key in held[: n - cold]:
            self._evictable.remove(key)
            self._ranks.pop(key, None)
            evicted.append((key, self.chunks.pop(key)))
        self._maybe_compact_heap()
        return self._count(evicted, n - cold)

    def _held_order(self, now: float) -> list[OffloadKey]:
        """Held keys, the one whose session comes back last first (ties: least recent)."""
        wait: dict[OffloadKey, float] = {}
        for session in self._sessions.values():
            w = expected_wait(session.retained_at, session.next_use, now)
            for key in session.keys:  # a key two sessions share goes with the sooner one
                wait[key] = min(w, wait.get(key, math.inf))
        return sorted(wait, key=lambda k: (-wait[k], self._ranks.get(k, 0)))

    def _count(
        self, evicted: list[tuple[OffloadKey, ChunkStatus]] | None, held: int
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if evicted is not None:
            self.held_evictions += held
            self.cold_evictions += len(evicted) - held
        return evicted
