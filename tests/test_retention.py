"""Retention rules: ``RetentionTable`` against a reference model, and the ScriptedEngine using it.

Properties: the budget is never exceeded; every reference the table takes is
given back exactly once; a released entry's blocks are evictable; a retained
block never is; admission never waits for a retention (no deadlock).
"""

from __future__ import annotations

from collections import Counter

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.engine_bridge import KVHandle, Retain, Sampling
from microagent.engine_bridge._retention import RELEASE_CAUSES, RetentionTable
from microagent.testing import ScriptedEngine, run_virtual

# -- the table ------------------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("retain"),
            st.sampled_from("abcdef"),
            st.lists(st.integers(0, 30), min_size=1, max_size=8, unique=True),
            st.one_of(st.none(), st.floats(0.5, 5.0)),
            st.one_of(st.none(), st.floats(0.0, 10.0)),
            st.integers(-3, 3),
        ),
        st.tuples(st.just("release"), st.sampled_from("abcdef")),
        st.tuples(st.just("prefix"), st.sampled_from(["", "a", "b", "z"])),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
        st.tuples(
            st.just("room"),
            st.integers(0, 20),
            st.integers(-3, 3),
            st.sampled_from([0.0, 30.0]),
            st.booleans(),
        ),
    ),
    max_size=40,
)


@given(budget=st.integers(0, 20), program=ops)
@settings(max_examples=300, deadline=None)
def test_table_keeps_its_budget_and_gives_every_reference_back(budget: int, program: list) -> None:  # type: ignore[type-arg]
    given_back: Counter[int] = Counter()
    taken: Counter[int] = Counter()
    table: RetentionTable[int] = RetentionTable(budget=budget, free=given_back.update)
    ranks: dict[str, int] = {}
    # the reference model's own record of each entry: (blocks, next_use, retained_at)
    seen: dict[str, tuple[int, float | None, float]] = {}
    now = 0.0

    def worth(key: str) -> bool:
        """The stated rule, written again: next use within max(30 s, 4 x recompute time)."""
        blocks, next_use, at = seen[key]
        if next_use is None:
            return False
        late_or_early = abs(at + next_use - now)
        return late_or_early <= max(30.0, 4.0 * blocks * 16 / 300.0)

    for op in program:
        kind = op[0]
        if kind == "retain":
            _, key, blocks, ttl, next_use, rank = op
            taken.update(blocks)
            live = table.retain(Retain(key, ttl=ttl, next_use=next_use), blocks, now, rank=rank)
            assert live == (key in table)
            ranks[key] = rank
            seen[key] = (len(blocks), next_use, now)
        elif kind == "release":
            table.release([op[1]])
            assert op[1] not in table
        elif kind == "prefix":
            table.release(prefix=op[1])
            assert not [k for k in table.names() if k.startswith(op[1])]
        elif kind == "tick":
            now += op[1]
            table.expire(now)
        else:
            _, target, priority, waited, idle = op
            table.expire(now)
            before = set(table.names())

            def may_take(k: str, p: int = priority, w: float = waited, i: bool = idle) -> bool:
                return i or w >= 20.0 or ranks[k] > p or not worth(k)

            allowed_before = {k for k in before if may_take(k)}
            table.admit(
                lambda t=target: table.held_blocks <= t,
                priority=priority,
                waited=waited,
                now=now,
                idle=idle,
            )
            gone = before - set(table.names())
            # only what the admission rule allows goes, and not one more than enough
            assert gone <= allowed_before
            held_now = Counter(b for k in table.names() for b in table.blocks_of(k))
            frees = [
                k
                for k in table.names()
                if may_take(k) and any(held_now[b] == 1 for b in table.blocks_of(k))
            ]
            assert table.held_blocks <= target or not frees
        # invariants after every step
        assert table.held_blocks <= budget
        held = Counter(b for k in table.names() for b in table.blocks_of(k))
        assert taken == given_back + held  # each reference: held, or given back once
        assert set(held) == {b for b in range(31) if table.holds(b)}
    table.clear(free=True)
    assert taken == given_back
    stats = table.stats()
    assert set(stats.released) == set(RELEASE_CAUSES) and stats.entries == 0


def test_policy_releases_the_furthest_next_use_first_then_the_oldest() -> None:
    freed: list[tuple[int, ...]] = []
    table: RetentionTable[int] = RetentionTable(budget=100, free=lambda b: freed.append(tuple(b)))
    table.retain(Retain("soon", next_use=1.0), [1], 0.0)
    table.retain(Retain("later", next_use=50.0), [2], 0.0)
    table.retain(Retain("unknown-old"), [3], 0.0)
    table.retain(Retain("unknown-new"), [4], 1.0)
    order = []
    while len(table):
        table.make_room(lambda n=len(table): len(table) < n, now=0.0)
        order.append(freed[-1])
    # no hint and a next use 50 s away are not worth keeping (1 block recomputes in 0.05 s)
    assert order == [(3,), (4,), (2,), (1,)]


def test_admission_is_by_program_and_bounded_by_the_patience() -> None:
    """A newer program (higher priority value) waits for sessions that come back soon; an
    older program's continuation takes a newer one's blocks; late sessions go; patience ends it."""
    freed: list[tuple[int, ...]] = []
    table: RetentionTable[int] = RetentionTable(
        budget=100, free=lambda b: freed.append(tuple(b)), min_hold=2.0
    )
    table.retain(Retain("old-session", next_use=1.0), [1], 0.0, rank=10)
    table.retain(Retain("young-session", next_use=1.0), [2], 0.0, rank=20)
    # a new program (priority 30) may take neither: both come back within their horizon
    assert table.admit(lambda: False, priority=30, waited=1.0, now=0.5) == 0
    # the old program's continuation (priority 10) takes the young one's, never its elders'
    assert table.admit(lambda: False, priority=10, waited=0.0, now=0.5) == 1
    assert freed == [(2,)] and table.names() == ["old-session"]
    # late by more than the horizon (2 s here): not worth keeping, a newcomer takes it
    assert table.worth_keeping("old-session", now=2.5)
    assert not table.worth_keeping("old-session", now=3.5)
    table.retain(Retain("again", next_use=1.0), [3], 3.5, rank=5)
    assert table.admit(lambda: False, priority=30, waited=0.0, now=3.5) == 1
    assert table.names() == ["again"]
    # on an idle engine any entry goes at once: the compute never waits for a retention
    table.retain(Retain("idle", next_use=1.0), [4], 3.5, rank=5)
    assert table.admit(lambda: False, priority=30, waited=0.0, now=3.5) == 0
    assert table.admit(lambda: len(table) < 2, priority=30, waited=0.0, now=3.5, idle=True) == 1
    # past the patience, any entry goes: nothing waits longer than that
    assert table.admit(lambda: False, priority=30, waited=table.patience, now=3.5) == 1
    assert len(table) == 0


def test_a_scoped_retention_supersedes_the_turns_it_covers_and_no_other() -> None:
    table: RetentionTable[int] = RetentionTable(budget=100, free=lambda b: None)
    table.retain(Retain("s/turn1", scope="tenant-a"), [1, 2], 0.0)
    table.retain(Retain("s/parallel", scope="tenant-a"), [1, 5], 0.0)  # shares a block only
    table.retain(Retain("other-tenant", scope="tenant-b"), [1, 2], 0.0)
    table.retain(Retain("s/turn2", scope="tenant-a"), [1, 2, 3], 1.0)  # extends turn 1
    assert table.names() == ["s/parallel", "other-tenant", "s/turn2"]
    assert table.stats().released["superseded"] == 1


def test_room_counts_blocks_an_entry_that_frees_none_is_kept() -> None:
    table: RetentionTable[int] = RetentionTable(budget=100, free=lambda b: None)
    table.retain(Retain("inner"), [1], 0.0)
    table.retain(Retain("outer", next_use=1.0), [1, 2], 0.0)
    # the first victim by order is "inner" (no hint), but it frees no block while "outer" lives
    table.make_room(lambda: table.held_blocks <= 1, now=0.0)
    assert table.names() == ["inner"] and table.held_blocks == 1


def test_superseding_keeps_the_shared_blocks_held() -> None:
    freed: Counter[int] = Counter()
    table: RetentionTable[int] = RetentionTable(budget=10, free=freed.update)
    table.retain(Retain("thread"), [1, 2], 0.0)
    table.retain(Retain("thread"), [1, 2, 3], 1.0)  # the thread grew by a block
    assert table.blocks_of("thread") == (1, 2, 3)
    assert freed == Counter({1: 1, 2: 1})  # the old entry's own references only
    assert all(table.holds(b) for b in (1, 2, 3))
    assert table.stats().released["superseded"] == 1


def test_a_ttl_ends_an_entry() -> None:
    table: RetentionTable[int] = RetentionTable(budget=10, free=lambda b: None, default_ttl=5.0)
    table.retain(Retain("a"), [1], 0.0)
    table.retain(Retain("b", ttl=1.0), [2], 0.0)
    assert table.expire(2.0) == 1 and table.names() == ["a"]
    assert table.expire(5.0) == 1 and len(table) == 0


def test_retain_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="key"):
        Retain("")
    with pytest.raises(ValueError, match="ttl"):
        Retain("a", ttl=0)
    assert Retain.from_wire({"key": 3}) is None
    assert Retain.from_wire(Retain("k", ttl=2.0).to_wire()) == Retain("k", ttl=2.0)


# -- the ScriptedEngine --------------------------------------------------------------------

BS = 16


def prompt_of(engine: ScriptedEngine, tag: str, blocks: int) -> KVHandle:
    words = " ".join(["token"] * (blocks * BS - 8))
    return engine.chat.prompt([{"role": "user", "content": f"{tag} {words}"}])


async def flood(engine: ScriptedEngine) -> None:
    for i in range(8):
        await engine.generate(prompt_of(engine, f"other{i}", 6), Sampling(max_tokens=1))


def test_scripted_retained_handle_survives_a_flood_and_release_makes_it_evictable() -> None:
    async def main() -> tuple[int, int, int, int]:
        async with ScriptedEngine(num_blocks=16, block_size=BS, retention_budget=0.5) as engine:
            kept, plain = prompt_of(engine, "kept", 4), prompt_of(engine, "plain", 4)
            one = Sampling(max_tokens=2)
            await engine.generate(kept, one, retain=Retain("c/kept"))
            await engine.generate(plain, one)
            await flood(engine)
            kept_after = (await engine.generate(kept, one)).cached_tokens
            plain_after = (await engine.generate(plain, one)).cached_tokens
            await engine.release(prefix="c/")
            await flood(engine)
            released_after = (await engine.generate(kept, one)).cached_tokens
            return kept_after, plain_after, released_after, (len(kept) - 1) // BS * BS

    kept, plain, released, full = run_virtual(main)
    assert kept == full and plain < full and released < full


@given(
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=12),
    retain_every=st.integers(1, 3),
    budget=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    priorities=st.lists(st.integers(-3, 3), min_size=12, max_size=12),
)
@settings(max_examples=60, deadline=None)
def test_scripted_budget_holds_and_nothing_deadlocks(
    sizes: list[int], retain_every: int, budget: float, priorities: list[int]
) -> None:
    """Random prompt sizes up to most of the pool, many retained, at random priorities (so
    admission may only take what it outranks until nothing runs): every request finishes."""

    async def main() -> list[int]:
        held = []
        engine = ScriptedEngine(num_blocks=12, block_size=BS, retention_budget=budget)
        async with engine:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i, size in enumerate(sizes):
                        retain = Retain(f"k{i % 4}") if i % retain_every == 0 else None

                        async def one(
                            i: int = i, size: int = size, retain: Retain | None = retain
                        ) -> None:
                            await engine.generate(
                                prompt_of(engine, f"p{i}", size),
                                Sampling(max_tokens=3),
                                retain=retain,
                                priority=priorities[i],
                            )
                            held.append(engine.retained_blocks())

                        tg.start_soon(one)
            assert engine.live_requests() == frozenset()
            held.append(engine.retained_blocks())
            await engine.release(prefix="k")
            held.append(engine.retained_blocks())
        return held

    held = run_virtual(main)
    assert all(h <= int(12 * budget) for h in held)
    assert held[-1] == 0


def test_scripted_restart_clears_retentions() -> None:
    async def main() -> tuple[int, int, str]:
        async with ScriptedEngine(num_blocks=16, block_size=BS) as engine:
            await engine.generate(
                prompt_of(engine, "x", 4), Sampling(max_tokens=2), retain=Retain("x")
            )
            before = engine.retained_blocks()
            engine.kill()
            stats = await engine.retention_stats()
            return before, engine.retained_blocks(), str(stats.released["restart"])

    before, after, restarts = run_virtual(main)
    assert before > 0 and after == 0 and restarts == "1"


def test_a_running_request_takes_one_victim_at_a_time() -> None:
    """``release_victim`` ends exactly the first entry in victim order that frees a block."""
    freed: list[tuple[int, ...]] = []
    table: RetentionTable[int] = RetentionTable(budget=100, free=lambda b: freed.append(tuple(b)))
    table.retain(Retain("soon", next_use=1.0), [1], 0.0, rank=0)
    table.retain(Retain("no-hint"), [2], 0.0, rank=0)
    assert table.release_victim(0.5) and table.names() == ["soon"]  # not worth keeping first
    assert freed == [(2,)]
    assert table.release_victim(0.5) and len(table) == 0  # then any entry
    assert not table.release_victim(0.5)


def test_headroom_holds_a_new_program_back_for_the_sessions_about_to_come_back() -> None:
    """Two sessions each grew by 3 blocks a turn (learned when their next turn superseded
    the last): a newcomer that would leave fewer than 6 free blocks waits; a returning
    session, an idle engine and a newcomer past the patience never do."""
    table: RetentionTable[int] = RetentionTable(budget=100, free=lambda blocks: None)
    for key, base in (("a", 0), ("b", 50)):
        table.retain(Retain(key, next_use=1.0), range(base, base + 4), 0.0)
        table.retain(Retain(key, next_use=1.0), range(base, base + 7), 0.0)  # grew by 3
    assert table.reserve(0.0) == 6
    assert table.extended_by(range(0, 7)) and table.extended_by(range(50, 58))
    assert not table.extended_by(range(0, 4))  # a shared prefix only: a new program
    reserve = table.reserve(0.0)
    assert table.holds_back(5, reserve=reserve, extends=False, waited=0.0)
    assert not table.holds_back(6, reserve=reserve, extends=False, waited=0.0)
    assert not table.holds_back(0, reserve=reserve, extends=True, waited=0.0)
    assert not table.holds_back(0, reserve=reserve, extends=False, waited=0.0, idle=True)
    assert not table.holds_back(0, reserve=reserve, extends=False, waited=table.patience)
    # sessions not worth keeping (their owners far overdue) reserve nothing
    assert table.reserve(1000.0) == 0
    table.release(["a", "b"])
    assert table.reserve(0.0) == 0 and not table.holds_back(0, reserve=6, extends=False, waited=0)
    assert not table.extended_by(range(0, 7))


def test_scripted_headroom_admits_the_returning_session_before_a_new_program() -> None:
    """A 12-block pool: a session retains 5 blocks and grows by 3 a turn while a long request
    runs beside it; a 4-block newcomer fits but would leave the session's next turn too
    little room, so it waits while the session's tool runs, the session's next turn
    hits every retained block, and the newcomer runs once the engine has room."""

    async def main() -> tuple[int, float, float]:
        engine = ScriptedEngine(
            num_blocks=12,
            block_size=BS,
            retention_budget=0.9,
            decode_time_per_token=0.05,
            reply_words=(60, 60),  # every reply runs to its max_tokens
        )
        async with engine:
            key = Retain("s", next_use=1.0, scope="s")
            once = Sampling(max_tokens=8, temperature=0.0)
            r1 = await engine.generate(prompt_of(engine, "session", 2), once, retain=key)
            p2 = engine.handle([*r1.handle.token_ids, *range(500, 532)])
            r2 = await engine.generate(p2, once, retain=key)
            done: dict[str, float] = {}
            kept: list[int] = []

            running = anyio.Event()

            async def runner() -> None:  # something runs: an idle engine holds nothing back
                await engine.generate(
                    prompt_of(engine, "runner", 1),
                    Sampling(max_tokens=40),
                    on_delta=lambda delta: running.set(),
                )

            async def newcomer() -> None:
                await running.wait()
                # a newer program: served after the session (first come, first served)
                await engine.generate(
                    prompt_of(engine, "new", 4), Sampling(max_tokens=2), priority=1
                )
                done["new"] = anyio.current_time()

            async def returning() -> None:
                await anyio.sleep(1.0)  # the tool
                p3 = engine.handle([*r2.handle.token_ids, *range(600, 632)])
                r3 = await engine.generate(p3, Sampling(max_tokens=2), retain=key)
                kept.append(r3.cached_tokens)
                done["session"] = anyio.current_time()

            async with anyio.create_task_group() as tg:
                tg.start_soon(runner)
                tg.start_soon(newcomer)
                tg.start_soon(returning)
            return kept[0], done["session"], done["new"]

    cached, session_done, new_done = run_virtual(main)
    assert cached >= 64 and session_done < new_done
