"""The ScriptedEngine's host tier: the same session-driven choice as vLLM's, against a reference.

The double writes every computed block through to a bounded host store and loads a
prompt's missing prefix back from it; which host block goes first is
``TierSessions.choose``, the code vLLM's ``SessionPolicy`` runs. Checked here: the
real engine's demotion check, reproduced (a demoted session outlives a flood larger
than the tier with ``"sessions"``, is lost with ``"lru"``), and a property test of
random multi-turn sessions and floods against a reference: no block lost, none freed
twice, no budget exceeded, no request starved.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import attrs
import pytest
import trio
import trio.testing
from hypothesis import event, given, settings
from hypothesis import strategies as st
from microagent.engine_bridge import GenerationResult, KVHandle, Retain, Sampling, TierStats
from microagent.engine_bridge._tier_order import TierSessions
from microagent.engine_bridge.scripted._engine import _block_hash
from microagent.testing import ScriptedEngine

BS = 4
#: every reply of the property test (so the reference knows each block before it exists)
REPLY = "the agent answer is yes"
#: virtual seconds any request may take, waits for retentions' patience included
BOUND = 200.0


def run_virtual(fn: Any, *args: Any) -> Any:
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def full_blocks(handle: KVHandle) -> int:
    """Blocks a finished request left computed (the last sampled token never is)."""
    return (len(handle) - 1) // BS


class WatchedEngine(ScriptedEngine):
    """The double, with every host eviction checked and logged (the reference's view)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evictions: Counter[int] = Counter()

    def _evict_host(self, h: int) -> None:
        assert h not in self._loading, "a block being loaded was evicted"
        super()._evict_host(h)
        self.evictions[h] += 1


def check_pool(engine: ScriptedEngine) -> None:
    """The device pool's books balance: every block is free, cached or a request's own,
    exactly once; a cached block's count is its users (requests and retentions), never
    negative, and it is idle in the LRU exactly when nobody uses it. The host store and
    the retentions are within their budgets, and what is being loaded is still there."""
    users: Counter[int] = Counter()
    uncached = 0
    for request in engine._requests.values():
        if request.epoch != engine.epoch or request.state == "done":
            continue
        for h in request.blocks:
            if h is None:
                uncached += 1
            else:
                users[h] += 1
    table = engine._retention
    for key in table.names():
        users.update(table.blocks_of(key))
    assert engine._empty >= 0
    assert engine._empty + len(engine._refs) + uncached == engine.num_blocks
    for h, refs in engine._refs.items():
        assert refs == users[h] >= 0, (h, refs, users[h])
        assert (refs == 0) == (h in engine._lru)
    assert set(engine._lru) <= set(engine._refs)
    assert set(users) <= set(engine._refs)
    assert table.held_blocks <= table.budget
    assert len(engine._host) <= engine.host_tier_blocks
    assert set(engine._loading) <= set(engine._host)


@attrs.define
class Reference:
    """Every block any request could have computed: hash -> (parent hash, tokens)."""

    blocks: dict[int, tuple[int | None, tuple[int, ...]]] = attrs.Factory(dict)

    def learn(self, engine: ScriptedEngine, tokens: tuple[int, ...]) -> None:
        parent: int | None = None
        for i in range(len(tokens) // BS):
            chunk = tokens[i * BS : (i + 1) * BS]
            h = _block_hash(parent, chunk, None)
            self.blocks[h] = (parent, chunk)
            parent = h

    def check_host(self, engine: ScriptedEngine) -> None:
        """No lost or foreign block: each host entry is a block some request computed,
        with that block's content."""
        for h, block in engine.host_blocks().items():
            assert h in self.blocks, "the host holds a block no request computed"
            assert (block.parent, block.tokens) == self.blocks[h]
            assert _block_hash(block.parent, block.tokens, block.adapter) == h


def leading_in_host(engine: ScriptedEngine, handle: KVHandle) -> list[int]:
    """The hashes of ``handle``'s leading computed blocks the host tier holds now."""
    host = engine.host_blocks()
    out = []
    for h in engine._hashes(handle.token_ids, None, full_blocks(handle)):
        if h not in host:
            break
        out.append(h)
    return out


# -- the real engine's demotion check, on the double ------------------------------------------
def demotion(policy: str) -> tuple[GenerationResult, GenerationResult, TierStats, dict[str, int]]:
    """A session retained while it waits on its tool is demoted by a large request, then a
    flood of 5/4 the host tier passes; its next turn follows."""
    host = 16
    engine = ScriptedEngine(
        block_size=BS,
        num_blocks=32,
        host_tier_blocks=host,
        tier_policy=policy,  # type: ignore[arg-type]
        prefill_time_per_token=0.001,
        decode_time_per_token=0.001,
    )
    one = Sampling(max_tokens=1)

    async def main() -> tuple[GenerationResult, GenerationResult, TierStats, dict[str, int]]:
        async with engine:
            first = await engine.generate(
                engine.handle(range(1, 42)), one, retain=Retain("tier/waiting", next_use=60.0)
            )
            assert engine.retained_blocks() == full_blocks(first.handle)
            # more device blocks than are free beside the retention: it is demoted
            await engine.generate(engine.handle(range(1000, 1100)), one)
            released = (await engine.retention_stats()).released
            for k in range(5):  # 5 x 4 blocks: 5/4 of the host tier
                await engine.generate(engine.handle(range(2000 + 100 * k, 2017 + 100 * k)), one)
            start = await engine.tier_stats()
            second = await engine.generate(first.handle.extend([7, 8]), one)
            after = await engine.tier_stats()
            await engine.release("tier/waiting")
            moved = attrs.evolve(after, loaded_blocks=after.loaded_blocks - start.loaded_blocks)
            return first, second, moved, released

    result: tuple[GenerationResult, GenerationResult, TierStats, dict[str, int]]
    result = run_virtual(main)
    return result


def test_a_demoted_session_outlives_a_flood_with_sessions_and_is_lost_with_lru() -> None:
    first, second, moved, released = demotion("sessions")
    assert released["admission"] + released["budget"] >= 1  # it really was demoted
    assert second.cached_tokens == full_blocks(first.handle) * BS
    assert second.computed_tokens <= BS + 2
    assert moved.loaded_blocks == full_blocks(first.handle)  # from the host, not the device
    assert moved.policy == "sessions" and moved.held_evicted_blocks == 0
    assert moved.cold_evicted_blocks > 0
    assert moved.peak_entries == moved.capacity_blocks == 16

    first, lost, moved, released = demotion("lru")
    assert released["admission"] + released["budget"] >= 1
    assert lost.cached_tokens == 0  # the flood pushed the oldest blocks, the session's, out
    assert moved.loaded_blocks == 0 and moved.policy == "lru"


def test_the_tier_is_off_by_default_and_changes_nothing() -> None:
    async def main() -> TierStats:
        async with ScriptedEngine(block_size=BS, num_blocks=8) as engine:
            for k in range(4):
                await engine.generate(
                    engine.handle(range(100 * k, 100 * k + 20)), Sampling(max_tokens=4)
                )
            assert engine.host_blocks() == {}
            return await engine.tier_stats()

    assert run_virtual(main) == TierStats()


def test_a_host_full_of_held_sessions_still_takes_stores() -> None:
    """Every host block held by a waiting session: a store takes the session due back last
    (never blocks, never exceeds the tier), and every request completes."""
    engine = WatchedEngine(
        block_size=BS, num_blocks=24, host_tier_blocks=6, prefill_time_per_token=0.001
    )

    async def main() -> TierStats:
        async with engine:
            with anyio.fail_after(BOUND):
                for k in range(6):
                    await engine.generate(
                        engine.handle(range(100 * k, 100 * k + 13)),
                        Sampling(max_tokens=1),
                        retain=Retain(f"s/{k}", next_use=10.0 * (k + 1)),
                    )
                    check_pool(engine)
            stats = await engine.tier_stats()
            held = engine.tier_sessions
            # each store took a cold block (the running turn's own earlier ones, held only
            # once it is retained) or the held session due back last: the soonest session
            # kept every block, the later ones lost their heads
            host = engine.host_blocks()
            assert all(h in host for h in held.keys_of("s/0"))
            assert not any(h in host for k in range(2, 6) for h in held.keys_of(f"s/{k}")[:2])
            await engine.release(prefix="s/")
            assert engine.tier_sessions.sessions == 0
            return stats

    stats = run_virtual(main)
    assert stats.entries == stats.capacity_blocks == 6
    assert stats.held_evicted_blocks > 0  # a store never waited for a session to end


def test_a_block_being_loaded_is_never_evicted_a_store_is_skipped_instead() -> None:
    """A demoted session's next turn loads its two host blocks (the whole tier) and
    prefills for seconds; meanwhile another request computes blocks: with nothing but the
    blocks being loaded in the tier, its stores are skipped (the tier never grows past its
    blocks, and never loses what a request is reading)."""
    engine = WatchedEngine(
        block_size=BS,
        num_blocks=16,
        host_tier_blocks=2,
        prefill_time_per_token=1.0,
        decode_time_per_token=0.1,
    )

    async def main() -> tuple[GenerationResult, list[int]]:
        async with engine:
            first = await engine.generate(
                engine.handle(range(100, 109)),
                Sampling(max_tokens=1),
                retain=Retain("s", next_use=9.0),
            )
            # 16 requests of a partial block each (nothing to store) take the whole pool:
            # the retention ends (demoted, still held) and its device blocks are evicted
            async with anyio.create_task_group() as tg:
                for k in range(16):
                    prompt = engine.handle(range(1000 + 10 * k, 1003 + 10 * k))
                    tg.start_soon(engine.generate, prompt, Sampling(max_tokens=1))
            assert engine.resident_tokens(first.handle) == 0
            kept = leading_in_host(engine, first.handle)
            assert len(kept) == 2

            async def other() -> None:
                await anyio.sleep(0.5)
                await engine.generate(engine.handle(range(5000, 5003)), Sampling(max_tokens=12))

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                second = await engine.generate(
                    first.handle.extend(range(200, 208)), Sampling(max_tokens=1)
                )
            check_pool(engine)
            return second, kept

    second, kept = run_virtual(main)
    assert second.cached_tokens == 2 * BS
    # the other request's three blocks came while both were loading (the hook checks that
    # nothing being loaded went); the session's own new blocks then took their places
    assert engine._tier_counts["skipped"] == 3
    assert len(kept) == 2 and len(engine.host_blocks()) == 2


def test_the_choice_orders_cold_lru_then_furthest_next_use() -> None:
    """``TierSessions.choose``, the rule both engines run, on plain integers."""
    order: TierSessions[int] = TierSessions()
    order.hold("soon", [0, 1], now=0.0, next_use=5.0, expires=None)
    order.hold("late", [2, 3], now=0.0, next_use=50.0, expires=10.0)
    lru = [0, 2, 4, 1, 3, 5]
    assert order.choose(2, iter(lru), set(), now=1.0) == [4, 5]
    assert order.choose(4, iter(lru), {5}, now=1.0) == [4, 2, 3, 0]
    assert order.choose(6, iter(lru), {5}, now=1.0) is None
    assert (order.cold_evictions, order.held_evictions) == (3, 3)
    order.ended("late", "admission")  # demoted: still held
    assert order.is_held(2)
    assert order.expire(10.0) == 1 and not order.is_held(2)
    order.ended("soon", "released")
    assert order.sessions == 0 and order.choose(1, iter(lru), set(), now=1.0) == [0]


# -- the property test ---------------------------------------------------------------------
@attrs.frozen
class Turn:
    new: int  # tokens the tool's result adds
    wait: float  # seconds the tool takes afterwards
    hint: float | None  # the next_use the turn's retention names
    max_tokens: int


@attrs.frozen
class Session:
    start: float
    context: int
    turns: tuple[Turn, ...]


@attrs.frozen
class Flood:
    start: float
    tokens: int
    max_tokens: int


turns = st.builds(
    Turn,
    new=st.integers(1, 4),
    wait=st.floats(1.0, 8.0),
    hint=st.none() | st.floats(0.0, 60.0),
    max_tokens=st.integers(1, 4),
)
sessions = st.builds(
    Session,
    start=st.floats(0.0, 3.0),
    context=st.integers(2, 12),
    turns=st.lists(turns, min_size=2, max_size=3).map(tuple),
)
floods = st.builds(
    Flood, start=st.floats(0.0, 15.0), tokens=st.integers(8, 40), max_tokens=st.integers(1, 4)
)


@settings(max_examples=100, deadline=None)
@given(
    program=st.tuples(
        st.lists(sessions, min_size=1, max_size=4), st.lists(floods, min_size=2, max_size=8)
    ),
    policy=st.sampled_from(["sessions", "lru"]),
    host=st.integers(2, 40),
    device=st.integers(12, 20),
    retention=st.sampled_from([0.0, 0.25, 0.5]),
    max_num_seqs=st.integers(1, 4),
)
def test_the_tier_against_a_reference(
    program: tuple[list[Session], list[Flood]],
    policy: str,
    host: int,
    device: int,
    max_num_seqs: int,
    retention: float,
) -> None:
    """Random multi-turn sessions (each turn extends the last handle, retained with its
    next use, released at the end) among unrelated floods, on a small pool and tier:
    checked all along, the pool's books balance (nothing freed twice), the host and the
    retentions stay in budget, nothing being loaded is evicted, every host block is one
    some request computed, with its content; a session whose host blocks were never
    evicted gets them back as cached; every request completes within ``BOUND``."""
    sessions_, floods_ = program
    engine = WatchedEngine(
        block_size=BS,
        num_blocks=device,
        max_num_seqs=max_num_seqs,
        retention_budget=retention,
        host_tier_blocks=host,
        tier_policy=policy,
        prefill_time_per_token=0.01,
        decode_time_per_token=0.01,
        script=[REPLY],
    )
    reference = Reference()
    done: list[int] = []
    reply = (*engine.tokenize(REPLY), engine.eot_token_id)

    def check() -> None:
        check_pool(engine)
        reference.check_host(engine)

    async def serve(prompt: KVHandle, max_tokens: int, retain: Retain | None) -> GenerationResult:
        # what it will compute, learned first: the watcher may look while it decodes
        output = reply[:max_tokens]
        reference.learn(engine, prompt.token_ids + output)
        with anyio.fail_after(BOUND):  # no starvation
            result = await engine.generate(prompt, Sampling(max_tokens=max_tokens), retain=retain)
        assert result.output_ids == output
        check()
        done.append(1)
        return result

    async def session(i: int, spec: Session) -> None:
        await anyio.sleep(spec.start)
        base = 100_000 * (i + 1)
        handle = engine.handle(range(base, base + spec.context))
        kept: list[int] = []
        seen: dict[int, int] = {}
        for t, turn in enumerate(spec.turns):
            new = range(base + 1000 * t, base + 1000 * t + turn.new)
            prompt = handle if t == 0 else handle.extend(new)
            last = t == len(spec.turns) - 1
            retain = None if last else Retain(f"p{i}/s", next_use=turn.hint)
            result = await serve(prompt, turn.max_tokens, retain)
            if kept and all(engine.evictions[h] == seen[h] for h in kept):
                # its host blocks stayed: whatever the device lost came back from the host
                limit = (len(prompt) - 1) // BS
                assert result.cached_tokens >= min(len(kept), limit) * BS, (t, kept)
                event("a turn found its host blocks kept")
            handle = result.handle
            kept = leading_in_host(engine, handle)
            seen = {h: engine.evictions[h] for h in kept}
            await anyio.sleep(turn.wait)
        await engine.release(prefix=f"p{i}/")

    async def flood(k: int, spec: Flood) -> None:
        await anyio.sleep(spec.start)
        base = 10_000_000 + 1000 * k
        await serve(engine.handle(range(base, base + spec.tokens)), spec.max_tokens, None)

    async def watch() -> None:
        while True:
            check()
            await anyio.sleep(0.05)

    async def main() -> TierStats:
        async with engine:
            with anyio.fail_after(BOUND * 4):
                async with anyio.create_task_group() as outer:
                    outer.start_soon(watch)
                    async with anyio.create_task_group() as tg:
                        for i, spec in enumerate(sessions_):
                            tg.start_soon(session, i, spec)
                        for k, f in enumerate(floods_):
                            tg.start_soon(flood, k, f)
                    outer.cancel_scope.cancel()
            check()
            assert engine.tier_sessions.sessions == 0  # every owner released its own
            assert (await engine.retention_stats()).entries == 0
            return await engine.tier_stats()

    stats = run_virtual(main)
    assert len(done) == sum(len(s.turns) for s in sessions_) + len(floods_)
    assert stats.enabled and stats.policy == policy
    assert stats.entries == stats.stored_blocks - stats.evicted_blocks  # nothing lost
    assert stats.entries <= stats.peak_entries <= host
    assert stats.evicted_blocks == sum(engine.evictions.values())
    assert stats.cold_evicted_blocks + stats.held_evicted_blocks == stats.evicted_blocks
    if policy == "lru":
        assert stats.held_evicted_blocks == 0 and stats.held_sessions == 0
    event(f"blocks loaded: {stats.loaded_blocks > 0}")
    event(f"held blocks evicted: {stats.held_evicted_blocks > 0}")


@pytest.mark.parametrize("policy", ["sessions", "lru"])
def test_a_restart_loses_the_host_tier(policy: str) -> None:
    """The host store lives in the engine: a restart empties it (old handles miss)."""

    async def main() -> tuple[int, int]:
        async with ScriptedEngine(
            block_size=BS,
            num_blocks=16,
            host_tier_blocks=8,
            tier_policy=policy,  # type: ignore[arg-type]
        ) as engine:
            await engine.generate(
                engine.handle(range(30)), Sampling(max_tokens=2), retain=Retain("k")
            )
            before = len(engine.host_blocks())
            engine.kill()
            again = await engine.generate(engine.handle(range(30)), Sampling(max_tokens=2))
            assert engine.tier_sessions.sessions == 0
            return before, again.cached_tokens

    before, cached = run_virtual(main)
    assert before > 0 and cached == 0
