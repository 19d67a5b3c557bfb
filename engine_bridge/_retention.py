"""KV retention: keep the blocks of a live agent's handle resident until it is released.

vLLM's prefix cache is LRU: under load, an agent's context is evicted while
the agent waits for its peers, a tool or the next round, and is recomputed.
A request marked with ``Retain(key)`` keeps its blocks (prompt + output, full
blocks only) referenced after it finishes, under ``key``, so the next request
that extends the handle hits them. ``RetentionTable`` is the bookkeeping and
the policy, shared by the vLLM scheduler (``vllm._retention``) and the
ScriptedEngine, so both engines follow one set of rules:

* One entry per key. Retaining a key again *supersedes* the old entry (a
  thread extended by a new turn: the new entry covers the old blocks). An
  entry with a ``scope`` also supersedes the entries of its scope whose blocks
  it covers: an HTTP session's next turn extends the last one, whatever its key.
* An entry ends when it is released (its owner ended: ``release(prefix=...)``),
  superseded, past its time-to-live, when the engine restarts, or to make room.
* The blocks held by entries never exceed ``budget`` (distinct blocks), and those of
  one ``account`` (an API key's sessions) never exceed its ``share`` of it: past it,
  the account's own older entries go (victim order), never another account's; only
  its newest entry alone may hold more (one turn larger than the share). So one
  tenant's warm sessions leave the rest of the budget to the others, and count toward
  the newcomers' headroom (``reserve``) for at most their share.
* **Admission is by program.** A request that waits for blocks may release an
  entry only when (1) the entry's owner is served after it (``rank >`` its
  priority: with program-level first-come-first-served priorities, a newer
  program), or (2) the entry is *not worth keeping* — its expected next use is
  further away than ``keep_factor`` times what recomputing it would take
  (Continuum's cost rule: hold while the recompute saved outweighs the hold),
  or (3) the request has waited longer than the patience (aging: nothing
  starves), or (4) nothing is running (an idle engine never holds a request
  back for a retention). So a new program's first turn waits while admitting
  it would evict sessions that are about to come back, and is admitted as soon
  as the cache has room, the engine is idle, or those sessions are late.
* **Headroom.** A request that fits may still wait: a new program's first turn
  (its cached prefix continues no live entry) is held back while admitting it
  would leave fewer free blocks than the sessions worth keeping will add on
  their next turns (``reserve``: the blocks an average turn has added, learned
  from supersessions, per such session). Without it newcomers fill every free
  block and each returning session must evict another (measured: 2.8x the
  workload floor at 1.6x pressure, 1.2x with it). The same four exceptions
  apply: a returning session, an idle engine, past the patience.
* Victims go in this order: entries not worth keeping first, then the owner
  served last (largest ``rank``), then the furthest expected next use
  (KVFlow), then the least recently retained; an entry whose blocks are all
  shared with another entry frees nothing and is skipped (room counts blocks).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final, Generic, Literal, TypeVar, get_args

import attrs

B = TypeVar("B", bound=Hashable)

#: Why a retention ended.
ReleaseCause = Literal["released", "superseded", "expired", "budget", "admission", "restart"]
RELEASE_CAUSES: Final[tuple[str, ...]] = get_args(ReleaseCause)
#: Seconds a waiting request respects the entries worth keeping of owners served before it.
DEFAULT_PATIENCE: Final = 20.0
#: An entry is worth keeping while its next use is at most this many times its recompute time.
DEFAULT_KEEP_FACTOR: Final = 4.0
#: ... or at most this many seconds away: a tool wait under half a minute is always worth
#: holding (a GPU recomputes a context in milliseconds, but under pressure that recompute
#: is what overloads it; chosen on the simulator, bench/agents_sim.py).
DEFAULT_MIN_HOLD: Final = 30.0


@attrs.frozen
class Retain:
    """Keep a request's KV blocks resident after it finishes, under ``key``, until released.

    Attributes:
        key: the retention's name; retaining the same key again replaces it.
            Owners use a prefix per owner (``"collab-7/agent-2"``) so that
            ``release(prefix="collab-7/")`` ends all of theirs.
        ttl: seconds it may live at most (None: the engine's default).
        next_use: a hint, seconds until the owner reads the handle again (a
            tool's expected duration); under pressure the furthest next use is
            released first, and an entry whose next use is far beyond what
            recomputing it costs is not held against a waiting request.
        scope: entries of the same scope whose blocks this one covers are
            superseded by it (a session's next turn extends its last one).
        account: the owner whose entries share one ``share`` of the budget (a
            server's API key); None: only the whole budget bounds it.
        share: the fraction of the budget the ``account``'s entries may hold together.
    """

    key: str
    ttl: float | None = None
    next_use: float | None = None
    scope: str | None = None
    account: str | None = None
    share: float = 1.0

    def __attrs_post_init__(self) -> None:
        if not self.key:
            raise ValueError("a retention key must be a non-empty string")
        if self.ttl is not None and not self.ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {self.ttl}")
        if self.next_use is not None and self.next_use < 0:
            raise ValueError(f"next_use must be >= 0 seconds, got {self.next_use}")
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share}")

    def to_wire(self) -> dict[str, object]:
        """The form that travels with a request to the engine (``SamplingParams.extra_args``)."""
        return {
            "key": self.key,
            "ttl": self.ttl,
            "next_use": self.next_use,
            "scope": self.scope,
            "account": self.account,
            "share": self.share,
        }

    @classmethod
    def from_wire(cls, data: object) -> Retain | None:
        """The retention a request's ``extra_args`` entry asks for (None when malformed)."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return None
        ttl, next_use, scope = data.get("ttl"), data.get("next_use"), data.get("scope")
        account, share = data.get("account"), data.get("share")
        try:
            return cls(
                data["key"],
                float(ttl) if isinstance(ttl, int | float) else None,
                float(next_use) if isinstance(next_use, int | float) else None,
                scope if isinstance(scope, str) else None,
                account if isinstance(account, str) else None,
                float(share) if isinstance(share, int | float) else 1.0,
            )
        except ValueError:
            return None


def expected_wait(retained_at: float, next_use: float | None, now: float) -> float:
    """Seconds until an owner that expected to come back ``next_use`` seconds after
    ``retained_at`` reads its handle again (inf: no hint).

    A late owner (past its expected next use) is expected to be as late again:
    under heavy-tailed tool durations the time already waited is the best guess
    of the time still to wait.
    """
    if next_use is None:
        return float("inf")
    due = retained_at + next_use
    return due - now if due >= now else now - due


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
    scope: str | None = None
    account: str | None = None
    #: the most blocks the account's entries may hold together (None: no share)
    cap: int | None = None

    def remaining(self, now: float) -> float:
        """Expected seconds until the owner reads it again (``expected_wait``)."""
        return expected_wait(self.retained_at, self.next_use, now)


@attrs.define(eq=False)
class RetentionTable(Generic[B]):
    """Retention entries over blocks of type ``B`` (vLLM block objects, or scripted hashes).

    ``free`` gives one entry's blocks back to the engine (one reference each,
    tail first): the engine decides when a block becomes evictable.

    Attributes:
        budget: most distinct blocks entries may hold (0 disables retention).
        default_ttl: seconds an entry lives when its ``Retain`` gives none (None: no limit).
        patience: seconds a waiting request respects the entries worth keeping
            of owners served before it; past it, it may take any.
        block_tokens: tokens per block (what recomputing an entry costs).
        prefill_rate: prompt tokens the engine computes per second.
        keep_factor: an entry is worth keeping while its expected next use is
            at most this many times its recompute time away.
        min_hold: ... or at most this many seconds away.
        copy_rate: with a KV tier below the cache, the tokens per second it copies
            back (None: no tier). An entry whose blocks the tier holds
            (``copied(blocks)``) costs a copy to lose, not a recompute: it is worth
            keeping only while its next use is within ``keep_factor`` copy times,
            so a session waiting on its tool gives its device blocks to the work
            that is ready (demoted, not dropped), and ``min_hold`` does not apply.
        ended: told each entry's key and cause when the entry ends (the tier's
            policy forgets a released session, keeps a demoted one).
    """

    budget: int
    free: Callable[[Sequence[B]], None]
    default_ttl: float | None = None
    patience: float = DEFAULT_PATIENCE
    block_tokens: int = 16
    prefill_rate: float = 300.0
    keep_factor: float = DEFAULT_KEEP_FACTOR
    min_hold: float = DEFAULT_MIN_HOLD
    copy_rate: float | None = None
    copied: Callable[[Sequence[B]], bool] | None = None
    ended: Callable[[str, ReleaseCause], None] | None = None
    _entries: dict[str, _Entry[B]] = attrs.field(factory=dict, init=False)
    _holders: Counter[B] = attrs.field(factory=Counter, init=False)
    _released: Counter[str] = attrs.field(factory=Counter, init=False)
    _retains: int = attrs.field(default=0, init=False)
    _order: int = attrs.field(default=0, init=False)
    _growth: float = attrs.field(default=0.0, init=False)  # blocks a session adds per turn
    _ends: dict[B, set[str]] = attrs.field(factory=dict, init=False)  # last block -> keys

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

    def next_expiry(self) -> float | None:
        """When the first live entry's time-to-live ends (None: none will)."""
        return min(
            (e.expires for e in self._entries.values() if e.expires is not None), default=None
        )

    def worth_keeping(self, key: str, now: float) -> bool:
        """Whether holding ``key`` against a waiting request beats recomputing it later."""
        entry = self._entries.get(key)
        return entry is not None and self._worth(entry, now)

    def extended_by(self, hits: Iterable[B]) -> bool:
        """Whether a prompt whose cached blocks are ``hits`` continues a live entry (all of
        its blocks): a returning session, not a new program sharing only a prefix."""
        hit = set(hits)
        for block in hit & self._ends.keys():
            for key in self._ends[block]:
                entry = self._entries.get(key)
                if entry is not None and hit.issuperset(entry.blocks):
                    return True
        return False

    def reserve(self, now: float) -> int:
        """Free blocks the live sessions worth keeping are expected to need on their next
        turn (each grows by the blocks an average turn has added so far); an account's
        sessions count for at most its share of the budget."""
        live: Counter[str | None] = Counter()
        caps: dict[str | None, int | None] = {}
        for e in self._entries.values():
            if self._worth(e, now):
                live[e.account] += 1
                caps[e.account] = e.cap
        total = 0.0
        for account, n in live.items():
            cap = caps[account]
            want = self._growth * n
            total += want if account is None or cap is None else min(want, cap)
        return math.ceil(total)

    def account_blocks(self, account: str) -> int:
        """Distinct blocks held by ``account``'s entries."""
        return len({b for e in self._entries.values() if e.account == account for b in e.blocks})

    def holds_back(
        self, free_after: int, *, reserve: int, extends: bool, waited: float, idle: bool = False
    ) -> bool:
        """Whether a request that could be admitted waits instead: a new program's first
        turn (``extends`` nothing live) while admitting it would leave fewer than
        ``reserve`` (``reserve(now)``, computed once per scheduling pass) blocks free for
        the sessions about to come back. Never on an idle engine, never past the patience
        (aging), never a returning session."""
        if extends or idle or waited >= self.patience or not self._entries:
            return False
        return free_after < reserve

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
        cap = math.floor(self.budget * retain.share) if retain.account is not None else None
        entry = _Entry(
            retain.key,
            held,
            None if ttl is None else now + ttl,
            retain.next_use,
            now,
            self._order,
            rank,
            retain.scope,
            retain.account,
            cap,
        )
        previous = self._entries.pop(retain.key, None)
        self._entries[retain.key] = entry
        self._ends.setdefault(held[-1], set()).add(retain.key)
        self._holders.update(held)
        grown = []
        if previous is not None:  # the new entry covers the old one's shared blocks
            grown.append(len(held) - len(previous.blocks))
            self._drop(previous, "superseded")
        if retain.scope is not None:
            mine = set(held)
            covered = [
                e
                for e in self._entries.values()
                if e is not entry and e.scope == retain.scope and mine.issuperset(e.blocks)
            ]
            for old in covered:
                grown.append(len(held) - len(old.blocks))
                self._drop(old, "superseded")
        if grown:  # what a session's turn added: the headroom its next turn will want
            step = max(0, min(grown))
            self._growth = step if not self._growth else 0.9 * self._growth + 0.1 * step
        self.expire(now)
        account = retain.account
        if account is not None and cap is not None:  # its own older entries go, never others'
            while self.account_blocks(account) > cap and (
                victim := self._victim(now, lambda e: e.account == account and e is not entry)
            ):
                self._drop(victim, "budget")
        while self.held_blocks > self.budget and (victim := self._victim(now)) is not None:
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

    def admit(
        self,
        enough: Callable[[], bool],
        *,
        priority: int,
        waited: float,
        now: float,
        idle: bool = False,
    ) -> int:
        """Make room for a waiting request, by the admission rule; returns entries ended.

        The request (its ``priority``, seconds ``waited``) may end entries of
        owners served after it, entries not worth keeping, and past the
        patience any entry, in victim order, until ``enough()`` holds. On an
        ``idle`` engine (nothing running) it may end any entry at once: holding
        blocks while the compute waits is the cap's trap, and no running request
        would ever give blocks back.
        """
        self.expire(now)
        if idle or waited >= self.patience:
            return self._make_room(enough, now, lambda e: True)
        return self._make_room(enough, now, lambda e: e.rank > priority or not self._worth(e, now))

    def make_room(self, enough: Callable[[], bool], *, now: float = 0.0) -> int:
        """End entries (victim order, any of them) until ``enough()`` holds or none is left."""
        return self._make_room(enough, now, lambda e: True)

    def release_victim(self, now: float) -> bool:
        """End the first entry in victim order that frees a block (for a running request
        whose next blocks do not fit); returns whether one ended."""
        return self._make_room(lambda: False, now, lambda e: True, limit=1) == 1

    def clear(self, cause: ReleaseCause = "restart", *, free: bool = True) -> int:
        """End every entry (an engine restart: ``free=False``, the pool is gone)."""
        entries = list(self._entries.values())
        for entry in entries:
            self._drop(entry, cause, free=free)
        return len(entries)

    # -- policy --------------------------------------------------------------------------
    def _worth(self, entry: _Entry[B], now: float) -> bool:
        tokens = len(entry.blocks) * self.block_tokens
        if self.copy_rate and (self.copied is None or self.copied(entry.blocks)):
            horizon = self.keep_factor * tokens / self.copy_rate
        else:
            horizon = max(self.min_hold, self.keep_factor * tokens / self.prefill_rate)
        return entry.remaining(now) <= horizon

    def _victim(
        self, now: float, allowed: Callable[[_Entry[B]], bool] | None = None
    ) -> _Entry[B] | None:
        """The entry to release first (among ``allowed`` ones that free a block)."""

        def order(e: _Entry[B]) -> tuple[bool, int, float, int]:
            return (self._worth(e, now), -e.rank, -e.remaining(now), e.order)

        candidates = [
            e
            for e in self._entries.values()
            if (allowed is None or allowed(e)) and any(self._holders[b] == 1 for b in e.blocks)
        ]
        return min(candidates, key=order, default=None)

    def _make_room(
        self,
        enough: Callable[[], bool],
        now: float,
        allowed: Callable[[_Entry[B]], bool],
        limit: int | None = None,
    ) -> int:
        ended = 0
        while not enough() and (limit is None or ended < limit):
            victim = self._victim(now, allowed)
            if victim is None:
                break
            self._drop(victim, "admission")
            ended += 1
        return ended

    def _drop(self, entry: _Entry[B], cause: ReleaseCause, *, free: bool = True) -> None:
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        current = self._entries.get(entry.key)  # a successor under the same key stays indexed
        ends = self._ends.get(entry.blocks[-1])
        if ends is not None and (current is None or current.blocks[-1] != entry.blocks[-1]):
            ends.discard(entry.key)
            if not ends:
                del self._ends[entry.blocks[-1]]
        self._holders.subtract(entry.blocks)
        for block in entry.blocks:
            if self._holders[block] <= 0:
                del self._holders[block]
        self._released[cause] += 1
        if self.ended is not None:
            self.ended(entry.key, cause)
        if free:
            self.free(entry.blocks[::-1])  # tail first: the head stays cached longest
