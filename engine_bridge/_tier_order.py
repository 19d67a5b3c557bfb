"""Which host-tier blocks go first: the sessions' bookkeeping and the eviction choice.

One set of rules for both engines: vLLM's host tier (``vllm._tier_policy.SessionPolicy``,
a ``CachePolicy`` over vLLM's offload keys) and the ScriptedEngine's host store (over
its block hashes) keep their own blocks, recency and pins, and ask ``TierSessions``
which keys to evict. Kept free of vLLM so the test double runs the same code the
real engine does, and a property test of the double checks the real policy's choice.

* A retained session's keys are ``hold``\\ ed with its expected next use; they stay
  held while the session is demoted (its device blocks given up to make room: the
  host copy is then its only copy), and are ``forget``\\ ten when its owner releases
  it, its time-to-live runs out (``expire``), or the engine restarts.
* ``choose`` takes cold keys first (held by no session), least recently used first,
  as vLLM's LRU policy would; only when no cold key is left, held ones, the session
  whose next use is furthest away first (a late session is expected to be as late
  again: ``expected_wait``), ties least recently used first. Held keys are only
  ordered last, never pinned, so a store never starves.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Container, Hashable, Iterable, Set
from typing import Final, Generic, TypeVar

import attrs

from ._retention import ReleaseCause, expected_wait

K = TypeVar("K", bound=Hashable)

#: Tokens per second a host tier copies back into the device cache (the vLLM scheduler's
#: default: 3 blocks of 128 tokens in 10-60 ms on the 2-core CPU; a GPU's PCIe is faster).
DEFAULT_COPY_RATE: Final = 10_000.0
#: Why a retention may end while its session still waits: it was demoted to the tier.
DEMOTIONS: Final[tuple[ReleaseCause, ...]] = ("admission", "budget")


@attrs.define(eq=False)
class _Session(Generic[K]):
    keys: tuple[K, ...]
    retained_at: float
    next_use: float | None
    expires: float | None


@attrs.define(eq=False)
class TierSessions(Generic[K]):
    """The sessions a host tier keeps blocks for, and the order its blocks go in.

    Attributes:
        cold_evictions: keys ``choose`` gave up while no session held them.
        held_evictions: keys it gave up while a session held them (only once no
            cold key was left).
    """

    cold_evictions: int = attrs.field(default=0, init=False)
    held_evictions: int = attrs.field(default=0, init=False)
    _sessions: dict[str, _Session[K]] = attrs.field(factory=dict, init=False)
    _held: Counter[K] = attrs.field(factory=Counter, init=False)

    # -- what the scheduler tells it ---------------------------------------------------
    def hold(
        self,
        owner: str,
        keys: Iterable[K],
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

    def ended(self, owner: str, cause: ReleaseCause) -> None:
        """A retention ended (``RetentionTable.ended``): a demoted session keeps its host
        copy held, any other cause (released, superseded, expired, restart) forgets it."""
        if cause not in DEMOTIONS:
            self.forget([owner])

    def expire(self, now: float) -> int:
        """Forget the sessions past their time-to-live."""
        due = [o for o, s in self._sessions.items() if s.expires is not None and s.expires <= now]
        return self.forget(due)

    def clear(self) -> None:
        """Forget every session (the store they were held in is gone)."""
        self._sessions.clear()
        self._held.clear()

    # -- reading -------------------------------------------------------------------------
    @property
    def sessions(self) -> int:
        """Sessions held now."""
        return len(self._sessions)

    @property
    def held_keys(self) -> int:
        """Distinct keys held now."""
        return len(self._held)

    @property
    def held(self) -> Set[K]:
        """The keys held now (a live view)."""
        return self._held.keys()

    def is_held(self, key: K) -> bool:
        return key in self._held

    def owners(self) -> list[str]:
        """The sessions held now, oldest first."""
        return list(self._sessions)

    def keys_of(self, owner: str) -> tuple[K, ...]:
        session = self._sessions.get(owner)
        return () if session is None else session.keys

    # -- the choice ----------------------------------------------------------------------
    def choose(
        self, n: int, evictable: Iterable[K], protected: Container[K], now: float
    ) -> list[K] | None:
        """The ``n`` keys to evict, or None (atomic: fewer than ``n`` may go).

        ``evictable`` lists the keys that may go (not being read or written), least
        recently used first; it is read lazily and only as far as needed. ``protected``
        keys never go. The caller evicts exactly what is returned (the counts
        ``cold_evictions`` / ``held_evictions`` assume so).
        """
        if n <= 0:
            return []
        cold: list[K] = []
        held: list[K] = []
        for key in evictable:
            if key in protected:
                continue
            if key in self._held:
                held.append(key)
                continue
            cold.append(key)
            if len(cold) == n:
                self.cold_evictions += n
                return cold
        if len(cold) + len(held) < n:
            return None
        wait = self._waits(now)
        position = {k: i for i, k in enumerate(held)}  # the LRU order breaks ties
        held.sort(key=lambda k: (-wait[k], position[k]))
        taken = held[: n - len(cold)]
        self.cold_evictions += len(cold)
        self.held_evictions += len(taken)
        return cold + taken

    def _waits(self, now: float) -> dict[K, float]:
        """Each held key's expected wait (a key two sessions share goes with the sooner)."""
        wait: dict[K, float] = {}
        for session in self._sessions.values():
            w = expected_wait(session.retained_at, session.next_use, now)
            for key in session.keys:
                wait[key] = min(w, wait.get(key, math.inf))
        return wait
