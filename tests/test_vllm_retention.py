"""KV retention on the real vLLM engine: our scheduler in the EngineCore keeps a handle's blocks.

One small engine (12 blocks of 128 tokens, retention budget 6 blocks) so that a
flood of unrelated prompts evicts anything LRU holds; every check compares a
retained handle with an identical unretained one under the same flood.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from _engine import RealEngine, _context, _fork
from microagent.engine_bridge import (
    EngineDied,
    GenerationResult,
    KVHandle,
    Retain,
    RetentionStats,
    Sampling,
)
from microagent.engine_bridge._vllm import VLLMBridge

BLOCK = 128
BLOCKS = 12
ONE = Sampling(max_tokens=2, temperature=0.0)

pytestmark = pytest.mark.engine


def small_bridge(**kwargs: Any) -> VLLMBridge:
    return VLLMBridge(
        max_model_len=1024,
        max_num_seqs=4,
        engine_args={"num_gpu_blocks_override": BLOCKS},
        progress=False,
        **kwargs,
    )


async def flood(bridge: VLLMBridge) -> None:
    """Unrelated long prompts, more tokens than the whole cache: plain LRU keeps nothing."""
    filled = 0
    while filled <= 2 * BLOCKS * BLOCK:
        other = _fork(bridge, _context(bridge, 700), "One word?")
        await bridge.generate(other, Sampling(max_tokens=1))
        filled += len(other)


def full_blocks(prompt: KVHandle) -> int:
    return (len(prompt) - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def small(real_engine: RealEngine) -> Any:
    """The small engine, opened on the shared engine's event loop (closed after the module)."""
    bridge = small_bridge()
    real_engine.call(bridge.open)
    yield bridge
    real_engine.call(bridge.close)


def call(real_engine: RealEngine, fn: Callable[[], Awaitable[Any]]) -> Any:
    return real_engine.call(fn)


def test_a_retained_handle_survives_a_flood_that_evicts_lru(
    real_engine: RealEngine, small: VLLMBridge
) -> None:
    async def run() -> tuple[GenerationResult, GenerationResult, RetentionStats]:
        kept = _fork(small, _context(small, 450), "One word?")
        plain = _fork(small, _context(small, 450), "One word?")
        await small.generate(kept, ONE, retain=Retain("test/kept"))
        await small.generate(plain, ONE)
        await flood(small)
        stats = await small.retention_stats()
        again_kept = await small.generate(kept, ONE)
        again_plain = await small.generate(plain, ONE)
        await small.release("test/kept")
        return again_kept, again_plain, stats

    kept, plain, stats = call(real_engine, run)
    print(f"after a flood: retained {kept.cached_tokens} cached, plain {plain.cached_tokens}")
    assert stats.entries == 1 and 0 < stats.retained_blocks <= stats.budget_blocks == BLOCKS // 2
    assert kept.cached_tokens >= len(kept.prompt) - BLOCK
    assert kept.cached_tokens == full_blocks(kept.prompt) and not kept.cache_miss
    assert plain.cache_miss and plain.cached_tokens < full_blocks(plain.prompt)
    assert small.stats().retained_hit_tokens >= kept.cached_tokens
    real_engine.call(small.wait_idle, 5.0)


def test_a_released_handle_is_evictable_again(real_engine: RealEngine, small: VLLMBridge) -> None:
    async def run() -> tuple[GenerationResult, GenerationResult, RetentionStats]:
        prompt = _fork(small, _context(small, 450), "One word?")
        await small.generate(prompt, ONE, retain=Retain("test/released"))
        await small.release(prefix="test/")
        released = await small.retention_stats()
        right_after = await small.generate(prompt, ONE)  # still cached: ordinary LRU now
        await flood(small)
        evicted = await small.generate(prompt, ONE)
        return right_after, evicted, released

    right_after, evicted, stats = call(real_engine, run)
    assert stats.entries == 0 and stats.released["released"] >= 1
    assert right_after.cached_tokens == full_blocks(right_after.prompt)
    assert evicted.cache_miss and evicted.cached_tokens < full_blocks(evicted.prompt)


def test_the_budget_holds_and_a_full_cache_never_deadlocks(
    real_engine: RealEngine, small: VLLMBridge
) -> None:
    async def run() -> tuple[list[RetentionStats], GenerationResult]:
        seen = []
        for i in range(4):  # 4 handles of 4 blocks each: 16 > the 6-block budget
            prompt = _fork(small, _context(small, 450), "One word?")
            await small.generate(prompt, ONE, retain=Retain(f"test/budget-{i}"))
            seen.append(await small.retention_stats())
        # a request that needs more blocks than are free while retentions hold theirs
        big = _fork(small, _context(small, 900), "One word?")
        with anyio.fail_after(120):
            result = await small.generate(big, ONE)
        seen.append(await small.retention_stats())
        await small.release(prefix="test/")
        return seen, result

    seen, big = call(real_engine, run)
    assert all(s.retained_blocks <= s.budget_blocks for s in seen)
    assert seen[-2].released["budget"] >= 1  # past the budget, older entries were let go
    assert big.finish_reason in ("stop", "length")  # admitted: retentions made room
    assert seen[-1].released["admission"] + seen[-1].released["budget"] >= 2


def test_an_engine_restart_clears_retentions_and_handles_still_work(
    real_engine: RealEngine,
) -> None:
    bridge = small_bridge()

    async def run() -> tuple[RetentionStats, RetentionStats, GenerationResult, GenerationResult]:
        async with bridge:
            prompt = _fork(bridge, _context(bridge, 450), "One word?")
            await bridge.generate(prompt, ONE, retain=Retain("test/restart"))
            before = await bridge.retention_stats()
            pids = bridge.engine_core_pids()
            long = _fork(bridge, _context(bridge, 300), "Write a long story.")
            with pytest.raises(EngineDied):
                async with bridge.stream(long, Sampling(max_tokens=400, temperature=0.8)) as gen:
                    async for _ in gen:
                        for pid in pids:
                            os.kill(pid, signal.SIGKILL)
                        pids = []
            first = await bridge.generate(prompt, ONE)  # waits out the restart
            after = await bridge.retention_stats()
            second = await bridge.generate(prompt, ONE)
            return before, after, first, second

    before, after, first, second = call(real_engine, run)
    assert before.entries == 1
    assert after.entries == 0 and after.retained_blocks == 0  # a new engine holds nothing
    assert first.finish_reason in ("stop", "length") and first.cache_miss  # recomputed once
    assert second.cached_tokens == full_blocks(second.prompt)  # and resident again
    assert bridge.epoch == 1
