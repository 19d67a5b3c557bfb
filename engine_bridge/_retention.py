"""KV retention: keep the blocks of a live agent's handle resident until it is released.

vLLM's prefix cache is LRU: under load, an agent's context is evicted while
the agent waits for its peers, a tool or the next round, and is recomputed.
A request marked with ``Retain(key)`` keeps its blocks (prompt + output, full
blocks only) referenced after it finishes, under ``key``, so the next request
that extends the handle hits them. ``RetentionTable`` is the bookkeeping and
the policy, shared by the vLLM scheduler (``_vllm_retention``) and the
ScriptedEngine, so both engines follow one set of rules:

* One entry per key. Retaining a key again *supersedes* the old entry (a
  thread extended by a new turn: the new entry covers the old blocks).
* An entry ends when it is released (its owner ended: ``release(prefix=...)``),
  superseded, past its time-to-live, when the engine restarts, or to make room.
* The blocks held by entries never exceed ``budget`` (distinct blocks). Past
  it, and whenever a waiting request cannot be allocated, entries are released
  in this order: the one whose owner the scheduler serves last first (the
  largest ``rank``: the request priority that retained it; with collaboration
  scheduling, the youngest collaboration of the worst level, whose next use is
  furthest, KVFlow-style), then the furthest ``next_use`` hint (an entry
  without a hint counts as furthest), then the least recently retained.
* Admission takes back only what it outranks: a waiting request may release
  the entries of owners served after it (rank >= its priority), not those of
  owners served before it, whose next turn would pass it in the queue anyway
  and would then recompute what was taken. It may take every entry when no
  request is running (nothing else would ever free a block) or when it has
  waited longer than the patience: a request therefore never waits forever for
  a retention.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final, Generic, Literal, TypeVar, get_args

import attrs

B = TypeVar("B", bound=Hashable)

#: Why a retention ended.
ReleaseCause = Literal["released", "superseded", "expired", "budget", "admission", "restart"]
RELEASE_CAUSES: Final[tuple[str, ...]] = get_args(ReleaseCause)
#: Seconds a waiting request leaves retentions of owners served before it alone.
DEFAULT_PATIENCE: Final = 20.0


@attrs.frozen
class Retain:
    """Keep a request's KV blocks resident after it finishes, under ``key``, until released.

    Attributes:
        key: the retention's name; retaining the same key again replaces it.
            Owners use a prefix per owner (``"collab-7/agent-2"``) so that
            ``release(prefix="collab-7/")`` ends all of theirs.
        ttl: seconds it may live at most (None: the engine's default).
        next_use: a hint, seconds until the owner reads the handle again;
            under pressure the furthest next use is released first.
    """

    key: str
    ttl: float | None = None
    next_use: float | None = None

    def __attrs_post_init__(self) -> None:
        if not self.key:
            raise ValueError("a retention key must be a non-empty string")
        if self.ttl is not None and not self.ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {self.ttl}")
        if self.next_use is not None and self.next_use < 0:
            raise ValueError(f"next_use must be >= 0 seconds, got {self.next_use}")

    def to_wire(self) -> dict[str, object]:
        """The form that travels with a request to the engine (``SamplingParams.extra_args``)."""
        return {"key": self.key, "ttl": self.ttl, "next_use": self.next_use}

    @classmethod
    def from_wire(cls, data: object) -> Retain | None:
        """The retention a request's ``extra_args`` entry asks for (None when malformed)."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return None
        ttl, next_use = data.get("ttl"), data.get("next_use")
        try:
            return cls(
                data["key"],
                float(ttl) if isinstance(ttl, int | float) else None,
                float(next_use) if isinstance(next_use, int | float) else None,
            )
        except ValueError:
            return None


@attrs.frozen
class RetentionStats:
    """An engine's retention accounting.

    Attributes:
        enabled: whether the engine retains at all.
        entries: live retentions.
        retained_blocks: distinct KV blocks they hold.
        budget_blocks: the most they may hold.
        retains: requests whose blocks were retained.
        released: ended retentions by cause (``ReleaseCause``).
    """

    enabled: bool = False
    entries: int = 0
    retained_blocks: int = 0
    budget_blocks: int = 0
    retains: int = 0
    released: dict[str, int] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.define(eq=False)
class _Entry(Generic[B]):
    key: str
    blocks: tuple[B, ...]
    expires: float | None
    next_use: float | None
    retained_at: float
    order: int
    rank: int


@attrs.define(eq=False)
class RetentionTable(Generic[B]):
    """Retention entries over blocks of type ``B`` (vLLM block objects, or scripted hashes).

    ``free`` gives one entry's blocks back to the engine (one reference each,
    tail first): the engine decides when a block becomes evictable.

    Attributes:
        budget: most distinct blocks entries may hold (0 disables retention).
        default_ttl: seconds an entry lives when its ``Retain`` gives none (None: no limit).
        patience: seconds a waiting request respects the entries of owners
            served before it; past it, it may take any.
    """

    budget: int
    free: Callable[[Sequence[B]], None]
    default_ttl: float | None = None
    patience: float = DEFAULT_PATIENCE
    _entries: dict[str, _Entry[B]] = attrs.field(factory=dict, init=False)
    _holders: Counter[B] = attrs.field(factory=Counter, init=False)
    _released: Counter[str] = attrs.field(factory=Counter, init=False)
    _retains: int = attrs.field(default=0, init=False)
    _order: int = attrs.field(default=0, init=False)

    # -- reading -----------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The live entries' keys, oldest first."""
        return list(self._entries)

    def blocks_of(self, key: str) -> tuple[B, ...]:
        entry = self._entries.get(key)
        return () if entry is None else entry.blocks

    @property
    def held_blocks(self) -> int:
        """Distinct blocks held by live entries."""
        return len(self._holders)

    def holds(self, block: B) -> bool:
        return block in self._holders

    def stats(self) -> RetentionStats:
        return RetentionStats(
            enabled=self.budget > 0,
            entries=len(self._entries),
            retained_blocks=self.held_blocks,
            budget_blocks=self.budget,
            retains=self._retains,
            released={cause: self._released[cause] for cause in RELEASE_CAUSES},
        )

    # -- changing ------------------------------------------------------------------------
    def retain(self, retain: Retain, blocks: Iterable[B], now: float, rank: int = 0) -> bool:
        """Hold ``blocks`` (the table now owns one reference of each) under ``retain.key``.

        ``rank`` is the priority of the request that retained them (lower is
        served first): under pressure the largest rank goes first. Returns
        whether the entry is still live afterwards (False: the budget released
        it at once, or the table is disabled: its blocks are freed).
        """
        held = tuple(blocks)
        if self.budget <= 0 or not held:
            self.free(held)
            return False
        self._retains += 1
        self._order += 1
        ttl = retain.ttl if retain.ttl is not None else self.default_ttl
        entry = _Entry(
            retain.key,
            held,
            None if ttl is None else now + ttl,
            retain.next_use,
            now,
            self._order,
            rank,
        )
        previous = self._entries.pop(retain.key, None)
        self._entries[retain.key] = entry
        self._holders.update(held)
        if previous is not None:  # the new entry covers the old one's shared blocks
            self._drop(previous, "superseded")
        self.expire(now)
        while self.held_blocks > self.budget and (victim := self._victim()) is not None:
            self._drop(victim, "budget")
        return retain.key in self._entries

    def release(self, keys: Iterable[str] = (), *, prefix: str | None = None) -> int:
        """End the named entries (and those whose key starts with ``prefix``); returns how many."""
        names = set(keys)
        if prefix is not None:
            names.update(k for k in self._entries if k.startswith(prefix))
        ended = 0
        for name in names:
            entry = self._entries.get(name)
            if entry is not None:
                self._drop(entry, "released")
                ended += 1
        return ended

    def expire(self, now: float) -> int:
        """End the entries whose time-to-live has passed; returns how many."""
        due = [e for e in self._entries.values() if e.expires is not None and e.expires <= now]
        for entry in due:
            self._drop(entry, "expired")
        return len(due)

    def admission_floor(self, priority: int, waited: float, running: int) -> int | None:
        """The least rank a waiting request may release (None: any), by the admission rule."""
        if running == 0 or waited >= self.patience:
            return None
        return priority

    def make_room(self, enough: Callable[[], bool], *, outranked_by: int | None = None) -> int:
        """End entries (policy order) until ``enough()`` holds or none is left; returns how many.

        ``outranked_by``: only entries of rank >= this priority may go (a
        waiting request's own priority); None: any entry.
        """
        ended = 0
        while not enough():
            victim = self._victim(outranked_by)
            if victim is None:
                break
            self._drop(victim, "admission")
            ended += 1
        return ended

    def clear(self, cause: ReleaseCause = "restart", *, free: bool = True) -> int:
        """End every entry (an engine restart: ``free=False``, the pool is gone)."""
        entries = list(self._entries.values())
        for entry in entries:
            self._drop(entry, cause, free=free)
        return len(entries)

    # -- policy --------------------------------------------------------------------------
    def _victim(self, outranked_by: int | None = None) -> _Entry[B] | None:
        """The entry to release first: served last, then furthest next use, then oldest."""

        def order(e: _Entry[B]) -> tuple[int, float, int]:
            far = float("inf") if e.next_use is None else e.retained_at + e.next_use
            return (-e.rank, -far, e.order)

        candidates = [
            e for e in self._entries.values() if outranked_by is None or e.rank >= outranked_by
        ]
        return min(candidates, key=order, default=None)

    def _drop(self, entry: _Entry[B], cause: ReleaseCause, *, free: bool = True) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        self._holders.subtract(entry.blocks)
        for block in entry.blocks:
            if self._holders[block] <= 0:
                del self._holders[block]
        self._released[cause] += 1
        if free:
            self.free(entry.blocks[::-1])  # tail first: the head stays cached longest
