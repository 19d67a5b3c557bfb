"""KV retention on the real vLLM engine: our scheduler in the EngineCore keeps a handle's blocks.

One small engine (12 blocks of 128 tokens, retention budget 6 blocks) so that a
flood of unrelated prompts evicts anything LRU holds; every check compares a
retained handle with an identical unretained one under the same flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
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
    VLLMBridge,
    cache_salt,
)
from microagent.engine_bridge._retention import DEFAULT_PATIENCE

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
        **{"retention": 0.5, **kwargs},
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


def test_salted_tenants_never_share_blocks_and_a_salted_session_survives_a_flood(
    real_engine: RealEngine, small: VLLMBridge
) -> None:
    """A key's retained turn survives a flood from another key; the other key's identical
    prompt hits neither it nor the ordinary cache; the same key hits it."""

    async def run() -> tuple[GenerationResult, GenerationResult, GenerationResult]:
        memo = _fork(small, _context(small, 450), "One word?")
        with cache_salt("tenant-alpha"):
            await small.generate(memo, ONE, retain=Retain("test/alpha", scope="alpha"))
        with cache_salt("tenant-beta"):
            other = await small.generate(memo, ONE)
            await flood(small)
        with cache_salt("tenant-alpha"):
            again = await small.generate(memo, ONE)
        unsalted = await small.generate(memo, ONE)
        await small.release(prefix="test/")
        return other, again, unsalted

    other, again, unsalted = call(real_engine, run)
    assert other.cached_tokens == 0
    assert again.cached_tokens == full_blocks(again.prompt) and not again.cache_miss
    assert unsalted.cached_tokens == 0  # the shared cache never saw alpha's blocks


def test_a_utility_call_the_killed_engine_never_answers_still_ends(
    real_engine: RealEngine,
) -> None:
    """The EngineCore is stopped with a release in flight, then killed: vLLM never answers
    that call, and before ``call_utility`` ended it the release (under the shielded clean-up
    of a collaboration) waited forever; now it ends once vLLM sees the engine dead."""
    bridge = small_bridge()

    async def run() -> tuple[int | None, GenerationResult]:
        async with bridge:
            prompt = _fork(bridge, _context(bridge, 200), "One word?")
            await bridge.generate(prompt, ONE, retain=Retain("test/dying"))
            pids = bridge.engine_core_pids()
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)  # it takes no message from now on
            engine: Any = bridge._engine
            release = asyncio.ensure_future(bridge.release("test/dying"))
            with anyio.fail_after(30):  # the call is in flight: its future is registered
                while not engine.engine_core.utility_results:  # noqa: ASYNC110 - no event there
                    await asyncio.sleep(0.01)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            released: int | None = None
            with anyio.fail_after(60):
                with contextlib.suppress(Exception):  # the engine died: nothing to release
                    released = await release
            after = await bridge.generate(prompt, ONE)  # the bridge restarted its engine
            return released, after

    released, after = call(real_engine, run)
    assert released in (None, 0)
    assert after.finish_reason in ("stop", "length") and bridge.epoch == 1


def test_a_ttl_ends_on_an_idle_engine(real_engine: RealEngine, small: VLLMBridge) -> None:
    async def run() -> tuple[RetentionStats, RetentionStats]:
        start = await small.retention_stats()
        prompt = _fork(small, _context(small, 300), "One word?")
        await small.generate(prompt, ONE, retain=Retain("test/ttl", ttl=1.0))
        live = await small.retention_stats()
        # nothing runs from here on: only the bridge's expiry call can end the entry
        with anyio.fail_after(15):
            while True:
                now = await small.retention_stats()
                if now.released["expired"] > start.released["expired"]:
                    return live, now
                await anyio.sleep(0.2)

    live, after = call(real_engine, run)
    assert live.entries >= 1 and after.entries == live.entries - 1
    assert small.live_requests() == frozenset()


def test_sessions_hold_a_full_retention_budget_but_never_an_idle_engine(
    real_engine: RealEngine, small: VLLMBridge
) -> None:
    """Sessions about to come back fill the budget; a new program's request that needs their
    blocks is admitted at once on an idle engine (not after the patience), and they go."""

    async def run() -> tuple[RetentionStats, RetentionStats, GenerationResult, float]:
        for i in range(2):  # 2 sessions of 3 blocks each: the whole 6-block budget
            prompt = _fork(small, _context(small, 400), "One word?")
            await small.generate(
                prompt, ONE, retain=Retain(f"test/session-{i}", next_use=1.0), priority=0
            )
        full = await small.retention_stats()
        newcomer = _fork(small, _context(small, 900), "One word?")
        start = anyio.current_time()
        with anyio.fail_after(120):
            result = await small.generate(newcomer, ONE, priority=1000)
        took = anyio.current_time() - start
        after = await small.retention_stats()
        await small.release(prefix="test/")
        return full, after, result, took

    full, after, result, took = call(real_engine, run)
    assert full.entries == 2 and full.retained_blocks == full.budget_blocks
    assert result.finish_reason in ("stop", "length")
    assert after.released["admission"] > full.released["admission"]
    assert took < DEFAULT_PATIENCE  # admitted at once, not after the patience


def _http(srv: Any, key: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "default", "max_tokens": 2, "temperature": 0.0, **body},
        headers={"authorization": f"Bearer {key}"},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _memo(tag: str) -> list[dict[str, str]]:
    from _engine import _document

    return [{"role": "user", "content": f"Memo {tag}:\n{_document(tag, 220)}\nOne word?"}]


def test_http_sessions_are_kept_per_key_and_shared_only_when_asked(
    real_engine: RealEngine, small: VLLMBridge
) -> None:
    """Over HTTP with two API keys: alpha's session turn survives a flood by beta; beta's
    identical prompt hits neither it nor the cache; alpha's next turn does. With
    ``shared_cache`` on, beta hits alpha's prompt."""
    from microagent.server import SessionSettings
    from test_server_helpers import live_server

    keys = ["alpha-key", "beta-key"]
    served = {"default": small}
    with live_server(
        lambda: served, portal=real_engine.portal, open_engines=False, api_key=keys
    ) as srv:
        memo = _memo(uuid.uuid4().hex)
        one = _http(srv, keys[0], {"messages": memo, "prompt_cache_key": "memo"})
        other = _http(srv, keys[1], {"messages": memo})
        for i in range(5):  # beta floods: more tokens than the whole cache
            _http(srv, keys[1], {"messages": _memo(f"flood-{i}-{uuid.uuid4().hex}")})
        reply = one["choices"][0]["message"]["content"]
        turn = [*memo, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        two = _http(srv, keys[0], {"messages": turn, "prompt_cache_key": "memo"})
        stats = real_engine.call(small.retention_stats)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    prompt = one["usage"]["prompt_tokens"]
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt // BLOCK * BLOCK
    assert stats.released["superseded"] >= 1  # turn 2 took over turn 1's retention

    with live_server(
        lambda: served,
        portal=real_engine.portal,
        open_engines=False,
        api_key=keys,
        sessions=SessionSettings(shared_cache=True),
    ) as shared:
        memo = _memo(uuid.uuid4().hex)
        _http(shared, keys[0], {"messages": memo})
        again = _http(shared, keys[1], {"messages": memo})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= BLOCK
    real_engine.call(lambda: small.release(prefix="http/"))


def test_the_scheduler_finds_the_sessions_policy_behind_any_offloading_manager() -> None:
    """The retaining scheduler drives the tier's ``SessionPolicy`` whether our spec or vLLM's
    stock CPU spec (a GPU) built the manager; with vLLM's LRU there is nothing to drive."""
    from microagent.engine_bridge.vllm._retention import _session_policy
    from microagent.engine_bridge.vllm._tier_policy import SessionPolicy
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    class Side:  # what the scheduler reads: connector.connector_scheduler.manager
        def __init__(self, manager: CPUOffloadingManager) -> None:
            self.connector_scheduler = type("S", (), {"manager": manager})()

    ours = CPUOffloadingManager(
        num_chunks=4,
        cache_policy=SessionPolicy.__name__,
        cache_policy_module_path=SessionPolicy.__module__,
    )
    assert _session_policy(Side(ours)) is ours._policy
    assert _session_policy(Side(CPUOffloadingManager(num_chunks=4, cache_policy="lru"))) is None
    assert _session_policy(None) is None
