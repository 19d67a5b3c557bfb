"""The host KV tier on the real vLLM engine: a prefix that left the device cache comes back by copy.

One small engine (12 device blocks of 128 tokens) with a host tier of 32
blocks: a flood of unrelated prompts (14 blocks) evicts a session's prefix from
the device cache but not from the host tier. Every engine check fails with the
tier off (``host_tier_bytes=0``): then the session's next turn recomputes its
prefix.

The file tier's engine tests use a second engine: 12 device blocks, a host
tier of 8 blocks, and a file tier of 40 blocks under a temporary
``MICROAGENT_HOME``. Each fails with ``disk_tier_bytes=0``.

The tests without an engine build the retaining scheduler from the config the
bridge gives vLLM, with async scheduling on (vLLM's GPU default, which with a
connector sets ``defer_block_free``), and drive it by hand, since no GPU runs
here; check the options; and check the file tier's directory key and format.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from _engine import _context, _fork
from _scheduler import build_scheduler
from anyio.from_thread import BlockingPortal, start_blocking_portal
from microagent.engine_bridge import (
    EngineDied,
    GenerationResult,
    KVHandle,
    Retain,
    Sampling,
    TierStats,
    VLLMBridge,
    cache_salt,
    resolve_model,
)
from microagent.engine_bridge.vllm._file_tier import (
    FileIndex,
    directory_key,
    file_bytes,
    read_block,
    write_block,
)

BLOCK = 128
BLOCKS = 12
#: bytes of one 128-token block of SmolLM2-135M (30 layers, K and V, bf16)
BLOCK_BYTES = 128 * 23_040
HOST_BLOCKS = 32
ONE = Sampling(max_tokens=2, temperature=0.0)
#: a model config small enough to build vLLM's scheduler without weights
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}
T = TypeVar("T")


class Engine:
    """A small bridge with the tier on, living on its own asyncio portal."""

    def __init__(self, portal: BlockingPortal, bridge: VLLMBridge) -> None:
        self.portal = portal
        self.bridge = bridge

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return self.portal.call(fn)


@pytest.fixture(scope="module")
def tiered() -> Iterator[Engine]:
    bridge = VLLMBridge(
        max_model_len=1024,
        max_num_seqs=4,
        engine_args={"num_gpu_blocks_override": BLOCKS},
        retention=0.5,
        host_tier_bytes=HOST_BLOCKS * BLOCK_BYTES,
        progress=False,
    )
    with start_blocking_portal("asyncio") as portal:
        portal.call(bridge.open)
        try:
            yield Engine(portal, bridge)
        finally:
            portal.call(bridge.close)


async def flood(bridge: VLLMBridge, blocks: int) -> None:
    """Unrelated prompts, ``blocks`` device blocks' worth: the device cache keeps nothing older."""
    filled = 0
    while filled < blocks * BLOCK:
        other = _fork(bridge, _context(bridge, 700), "One word?")
        await bridge.generate(other, Sampling(max_tokens=1))
        filled += len(other)


async def settled(bridge: VLLMBridge) -> TierStats:
    """The tier's numbers once its in-flight copies are done (stores land a step later)."""
    last = await bridge.tier_stats()
    with anyio.fail_after(30):
        while True:
            await anyio.sleep(0.3)
            now = await bridge.tier_stats()
            if now == last:
                return now
            last = now


def full_blocks(prompt: KVHandle) -> int:
    """Tokens of ``prompt`` that a cache can serve: full blocks, the last token excluded."""
    return (len(prompt) - 1) // BLOCK * BLOCK


@pytest.mark.engine
def test_an_evicted_prefix_is_reloaded_from_the_host_tier_and_bytes_match(
    tiered: Engine,
) -> None:
    bridge = tiered.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats]:
        start = await settled(bridge)
        # nothing else runs: what the tier stores now is this session's first turn
        first = await bridge.generate(_fork(bridge, _context(bridge, 450), "One word?"), ONE)
        stored = await settled(bridge)
        await flood(bridge, BLOCKS + 2)
        before_load = await settled(bridge)
        second = await bridge.generate(_fork(bridge, first.handle, "And one more?"), ONE)
        after = await settled(bridge)
        return first, second, delta(stored, start), delta(after, before_load)

    first, second, stored, loaded = tiered.call(run)
    computed = second.prompt_tokens - second.cached_tokens
    print(
        f"turn 2: {second.prompt_tokens} prompt tokens, {second.cached_tokens} cached, "
        f"{computed} computed; turn 1 stored {stored.stored_blocks} blocks "
        f"({stored.stored_bytes} B), turn 2 loaded {loaded.loaded_blocks} blocks "
        f"({loaded.loaded_bytes} B, {loaded.load_seconds * 1e3:.1f} ms)"
    )
    assert second.cached_tokens >= full_blocks(first.handle)
    assert computed <= BLOCK + 1
    # the session's blocks went down once and came back once, byte for byte
    assert stored.stored_blocks == len(first.handle) // BLOCK
    assert loaded.loaded_blocks == stored.stored_blocks
    assert loaded.loaded_bytes == stored.stored_bytes == stored.stored_blocks * BLOCK_BYTES


def delta(after: TierStats, before: TierStats) -> TierStats:
    """What moved between two readings."""
    return TierStats(
        enabled=after.enabled,
        stored_blocks=after.stored_blocks - before.stored_blocks,
        stored_bytes=after.stored_bytes - before.stored_bytes,
        loaded_blocks=after.loaded_blocks - before.loaded_blocks,
        loaded_bytes=after.loaded_bytes - before.loaded_bytes,
        load_seconds=after.load_seconds - before.load_seconds,
    )


@pytest.mark.engine
def test_a_tenant_never_hits_another_tenants_tier_entries(tiered: Engine) -> None:
    bridge = tiered.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats]:
        prompt = _fork(bridge, _context(bridge, 450), "One word?")
        with cache_salt("tenant-alpha"):
            await bridge.generate(prompt, ONE)
        await flood(bridge, BLOCKS + 2)
        start = await settled(bridge)
        with cache_salt("tenant-beta"):  # the same tokens under another salt
            beta = await bridge.generate(prompt, ONE)
        after_beta = await settled(bridge)
        with cache_salt("tenant-alpha"):  # alpha's own entries are there
            alpha = await bridge.generate(prompt, ONE)
        after_alpha = await settled(bridge)
        return beta, alpha, delta(after_beta, start), delta(after_alpha, after_beta)

    beta, alpha, beta_moved, alpha_moved = tiered.call(run)
    print(
        f"same prompt after a flood: beta {beta.cached_tokens} cached "
        f"({beta_moved.loaded_blocks} blocks loaded), alpha {alpha.cached_tokens} cached "
        f"({alpha_moved.loaded_blocks} blocks loaded)"
    )
    assert beta.cached_tokens == 0 and beta_moved.loaded_blocks == 0
    assert alpha.cached_tokens == full_blocks(alpha.prompt)
    assert alpha_moved.loaded_blocks == full_blocks(alpha.prompt) // BLOCK


@pytest.mark.engine
def test_retention_keeps_working_with_the_tier_on(tiered: Engine) -> None:
    """A retained session stays on the device (nothing to load); a plain one comes from the tier."""
    bridge = tiered.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats]:
        kept = _fork(bridge, _context(bridge, 450), "One word?")
        plain = _fork(bridge, _context(bridge, 450), "One word?")
        await bridge.generate(kept, ONE, retain=Retain("tier/kept"))
        await bridge.generate(plain, ONE)
        await flood(bridge, BLOCKS + 2)
        start = await settled(bridge)
        again_kept = await bridge.generate(kept, ONE)
        after_kept = await settled(bridge)
        again_plain = await bridge.generate(plain, ONE)
        after_plain = await settled(bridge)
        await bridge.release("tier/kept")
        return again_kept, again_plain, delta(after_kept, start), delta(after_plain, after_kept)

    kept, plain, kept_moved, plain_moved = tiered.call(run)
    print(
        f"after a flood: retained {kept.cached_tokens} cached ({kept_moved.loaded_blocks} "
        f"loaded), plain {plain.cached_tokens} cached ({plain_moved.loaded_blocks} loaded)"
    )
    assert kept.cached_tokens == full_blocks(kept.prompt) and kept_moved.loaded_blocks == 0
    assert plain.cached_tokens == full_blocks(plain.prompt)
    assert plain_moved.loaded_blocks == full_blocks(plain.prompt) // BLOCK
    assert tiered.bridge.stats().retained_hit_tokens >= kept.cached_tokens


@pytest.mark.engine
def test_the_host_budget_holds_under_a_flood(tiered: Engine) -> None:
    bridge = tiered.bridge

    async def run() -> tuple[TierStats, TierStats]:
        start = await settled(bridge)
        await flood(bridge, HOST_BLOCKS * 5 // 4)  # more blocks than the host holds
        return start, await settled(bridge)

    start, end = tiered.call(run)
    print(
        f"host tier after a flood: {end.entries}/{end.capacity_blocks} blocks "
        f"(peak {end.peak_entries}), {end.capacity_bytes} of {end.budget_bytes} B, "
        f"{end.stored_blocks - start.stored_blocks} stored, "
        f"{end.evicted_blocks - start.evicted_blocks} evicted"
    )
    assert end.budget_bytes == HOST_BLOCKS * BLOCK_BYTES
    assert end.capacity_blocks == HOST_BLOCKS and end.block_bytes == BLOCK_BYTES
    assert end.capacity_bytes <= end.budget_bytes
    assert end.entries <= end.peak_entries <= end.capacity_blocks
    # the flood really pressed the budget: the tier dropped entries to stay within it
    assert end.evicted_blocks > start.evicted_blocks
    assert end.stored_blocks - start.stored_blocks > HOST_BLOCKS


@pytest.mark.engine
def test_a_demoted_session_outlives_a_host_flood_and_reloads(tiered: Engine) -> None:
    """A session waiting on its tool is demoted when the device needs room (its retention
    ends, its host copy stays held), then a flood larger than the host tier passes through:
    vLLM's LRU would drop the session's blocks (the oldest), the session policy drops the
    flood's. Its next turn reloads every full block and computes at most one block."""
    bridge = tiered.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, dict[str, int]]:
        before = (await bridge.retention_stats()).released
        first = await bridge.generate(
            _fork(bridge, _context(bridge, 450), "One word?"),
            ONE,
            retain=Retain("tier/waiting", next_use=60.0),
        )
        await settled(bridge)
        # needs more device blocks than are free beside the retained session: it is demoted
        await bridge.generate(_fork(bridge, _context(bridge, 950), "One word?"), ONE)
        demoted = (await bridge.retention_stats()).released
        await flood(bridge, HOST_BLOCKS * 5 // 4)  # more than the host tier holds
        start = await settled(bridge)
        second = await bridge.generate(_fork(bridge, first.handle, "And one more?"), ONE)
        after = await settled(bridge)
        await bridge.release("tier/waiting")
        ended = {c: demoted.get(c, 0) - before.get(c, 0) for c in ("admission", "budget")}
        return first, second, delta(after, start), ended

    first, second, moved, ended = tiered.call(run)
    computed = second.prompt_tokens - second.cached_tokens
    print(
        f"demoted ({ended}), then a flood of {HOST_BLOCKS * 5 // 4} blocks into "
        f"{HOST_BLOCKS}: next turn {second.cached_tokens} cached, {computed} computed, "
        f"{moved.loaded_blocks} blocks loaded"
    )
    assert sum(ended.values()) >= 1  # the retention really ended to make room
    assert second.cached_tokens >= full_blocks(first.handle)
    assert computed <= BLOCK + 1
    assert moved.loaded_blocks == full_blocks(first.handle) // BLOCK
    assert moved.loaded_bytes == moved.loaded_blocks * BLOCK_BYTES


def test_retention_holds_with_the_connector_and_async_scheduling(tmp_path: Path) -> None:
    """With the tier's connector and async scheduling, a session that stops while its next
    step is in flight is retained (before: vLLM's deferred free took it, nothing was kept)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    bridge = VLLMBridge(
        str(tmp_path),
        max_model_len=512,
        host_tier_bytes=1 << 20,
        engine_args={"skip_tokenizer_init": True},
        progress=False,
    )
    bridge.model_path = tmp_path
    # the config the bridge gives vLLM, as a GPU would resolve it: async scheduling on
    config = AsyncEngineArgs(**bridge._engine_arguments()).create_engine_config()
    config.scheduler_config.async_scheduling = True
    block, blocks, stop = config.cache_config.block_size, 8, 2
    scheduler = build_scheduler(config, blocks=blocks, block=block)
    retention = scheduler.retention
    assert isinstance(scheduler, AsyncScheduler)  # vLLM overlaps only an AsyncScheduler's steps
    assert scheduler.defer_block_free and type(scheduler.connector).__name__ == "HostTierConnector"
    pool = scheduler.kv_cache_manager.block_pool
    empty = pool.get_num_free_blocks()

    init_none_hash(sha256)
    sampling = SamplingParams(
        max_tokens=8,
        stop_token_ids=[stop],
        extra_args={type(scheduler).retain_key: Retain("s").to_wire()},
    )
    request = Request(
        "r1",
        [100 + i % 300 for i in range(2 * block + 40)],  # 2 full blocks and a tail
        sampling,
        None,
        block_hasher=get_request_block_hasher(block, sha256),
    )
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    decode = scheduler.schedule()  # scheduled before the prefill's output is back
    assert decode.num_scheduled_tokens == {"r1": 1}

    def output(token: int) -> ModelRunnerOutput:
        return ModelRunnerOutput(
            req_ids=["r1"], req_id_to_index={"r1": 0}, sampled_token_ids=[[token]]
        )

    scheduler.update_from_output(prefill, output(stop))  # stops; the decode step is in flight
    stats = retention.stats()
    assert stats.entries == 1 and stats.retained_blocks == 2
    assert pool.get_num_free_blocks() == empty - 3  # the tail waits for the step in flight
    scheduler.update_from_output(decode, output(7))
    assert pool.get_num_free_blocks() == empty - 2  # the tail is back; the prefix is kept
    assert retention.release(["s"]) == 1
    assert pool.get_num_free_blocks() == empty  # nothing leaked


def test_on_a_gpu_the_sessions_policy_sits_over_vllms_own_cpu_offloading_spec() -> None:
    """Config level (no GPU here): without files, a GPU gets vLLM's CPUOffloadingSpec (its
    CUDA copy kernels) with our policy loaded by name; its manager runs SessionPolicy, and
    ``"lru"`` leaves vLLM's own (test_vllm_retention: the scheduler finds the policy)."""
    from microagent.engine_bridge.vllm import _tier
    from microagent.engine_bridge.vllm._tier_policy import SessionPolicy
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = _tier.connector_config(10 * BLOCK_BYTES, stock_spec=True)
    extra = config["kv_connector_extra_config"]
    assert OffloadingSpecFactory.get_spec_cls(extra) is CPUOffloadingSpec
    assert extra["cpu_bytes_to_use"] == 10 * BLOCK_BYTES and not extra["offload_prompt_only"]
    manager = CPUOffloadingManager(
        num_chunks=10,
        cache_policy=extra["eviction_policy"],
        cache_policy_module_path=extra["cache_policy_module_path"],
    )
    assert isinstance(manager._policy, SessionPolicy)
    stock = _tier.connector_config(10 * BLOCK_BYTES, policy="lru", stock_spec=True)
    assert stock["kv_connector_extra_config"]["eviction_policy"] == "lru"
    with pytest.raises(ValueError, match="no file tier"):
        _tier.connector_config(10 * BLOCK_BYTES, disk_bytes=BLOCK_BYTES, stock_spec=True)


def test_the_tier_is_off_by_default_and_one_way_to_ask_for_it() -> None:
    """Budget 0 adds no connector; a budget loads ours; a second tier in engine_args is refused."""
    plain = VLLMBridge(progress=False)._engine_arguments()
    assert "kv_transfer_config" not in plain
    tiered = VLLMBridge(host_tier_bytes=10 * BLOCK_BYTES, progress=False)._engine_arguments()
    transfer = tiered["kv_transfer_config"]
    assert transfer.kv_connector == "HostTierConnector" and transfer.kv_role == "kv_both"
    assert transfer.kv_connector_extra_config["microagent_host_bytes"] == 10 * BLOCK_BYTES
    for doubled in ({"kv_offloading_size": 4.0}, {"kv_transfer_config": transfer}):
        with pytest.raises(ValueError, match="KV tier"):
            VLLMBridge(host_tier_bytes=1, engine_args=doubled, progress=False)
    with pytest.raises(ValueError, match="host_tier_bytes"):
        VLLMBridge(host_tier_bytes=-1, progress=False)


# -- the file tier -------------------------------------------------------------------------

FILE_HOST_BLOCKS = 8
DISK_BLOCKS = 40
#: a block file: header, the block key (32-byte sha256_cbor hash + 4-byte group), the block
FILE_BYTES = file_bytes(bytes(36), BLOCK_BYTES)
#: the engine's own switch, so the tier-off check is one edit: 0 turns the file tier off
DISK_BUDGET = DISK_BLOCKS * FILE_BYTES


@pytest.fixture(scope="module")
def filed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """Device 12 blocks, host 8 blocks, files 40 blocks under a home of its own."""
    home = tmp_path_factory.mktemp("home")
    bridge = VLLMBridge(
        str(resolve_model("default", progress=False)),  # the prepared model, not home's
        max_model_len=1024,
        max_num_seqs=4,
        engine_args={"num_gpu_blocks_override": BLOCKS},
        retention=0.5,
        host_tier_bytes=FILE_HOST_BLOCKS * BLOCK_BYTES,
        disk_tier_bytes=DISK_BUDGET,
        home=home,
        progress=False,
    )
    with start_blocking_portal("asyncio") as portal:
        portal.call(bridge.open)
        try:
            yield Engine(portal, bridge)
        finally:
            portal.call(bridge.close)


def tier_files(bridge_home: Path) -> dict[Path, int]:
    """Every block file under the home's ``kv`` folder, with its size."""
    return {p: p.stat().st_size for p in (bridge_home / "kv").rglob("*.kv")}


def block_keys(prompt: KVHandle, blocks: int) -> list[bytes]:
    """vLLM's offload keys of ``prompt``'s first blocks (sha256_cbor, no salt or LoRA)."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256_cbor)
    keys, parent = [], None
    for i in range(blocks):
        tokens = prompt.token_ids[i * BLOCK : (i + 1) * BLOCK]
        parent = kv_cache_utils.hash_block_tokens(sha256_cbor, parent, tokens)
        keys.append(bytes(parent) + (0).to_bytes(4, "big"))  # KV group 0
    return keys


def home_of(bridge: VLLMBridge) -> Path:
    return Path(bridge._home or "")


@pytest.mark.engine
def test_a_prefix_gone_from_device_and_host_is_loaded_from_its_files(filed: Engine) -> None:
    bridge = filed.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats]:
        first = await bridge.generate(_fork(bridge, _context(bridge, 450), "One word?"), ONE)
        await settled(bridge)
        await flood(bridge, BLOCKS + 2)  # 15 blocks: past the device (12) and the host (8)
        before = await settled(bridge)
        second = await bridge.generate(_fork(bridge, first.handle, "And one more?"), ONE)
        after = await settled(bridge)
        return first, second, before, after

    first, second, before, after = filed.call(run)
    read = after.disk_read_blocks - before.disk_read_blocks
    print(
        f"turn 2 after a 15-block flood: {second.prompt_tokens} prompt tokens, "
        f"{second.cached_tokens} cached, {second.prompt_tokens - second.cached_tokens} "
        f"computed; {read} blocks read from files; files {after.disk_entries} blocks, "
        f"{after.disk_bytes} B; host {after.entries}/{after.capacity_blocks} blocks"
    )
    assert second.cached_tokens >= full_blocks(first.handle)
    assert second.prompt_tokens - second.cached_tokens <= BLOCK + 1
    assert read == len(first.handle) // BLOCK  # from files, not from RAM
    assert after.disk_rejected_blocks == before.disk_rejected_blocks


@pytest.mark.engine
def test_an_altered_tier_file_is_a_miss_never_wrong_kv(filed: Engine) -> None:
    """The second of three block files gets bytes flipped: the first block loads, the rest is
    computed (and written again), and the output is the greedy output of the first time."""
    bridge = filed.bridge
    home = home_of(bridge)
    sampling = Sampling(max_tokens=8, temperature=0.0)

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats, Path]:
        prompt = _fork(bridge, _context(bridge, 450), "One word?")
        first = await bridge.generate(prompt, sampling)
        await settled(bridge)
        # the files are named by vLLM's block hashes: block 2's is the one to alter
        (folder,) = (home / "kv").iterdir()
        files = [folder / f"{key.hex()}.kv" for key in block_keys(prompt, 3)]
        assert all(f.exists() for f in files), files
        victim = files[1]
        data = bytearray(victim.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
        victim.write_bytes(bytes(data))
        await flood(bridge, BLOCKS + 2)
        before = await settled(bridge)
        again = await bridge.generate(prompt, sampling)
        after = await settled(bridge)
        return first, again, before, after, victim

    first, again, before, after, victim = filed.call(run)
    print(
        f"one altered file of three: {again.cached_tokens} of {again.prompt_tokens} cached "
        f"(first block from its file), {after.disk_rejected_blocks - before.disk_rejected_blocks} "
        f"file rejected and deleted; output {again.output_ids} vs computed {first.output_ids}"
    )
    assert after.disk_rejected_blocks - before.disk_rejected_blocks == 1
    # deleted when found bad; the recomputed block was stored again, and its new file is whole
    assert read_block(victim, bytes.fromhex(victim.stem), BLOCK_BYTES) is not None
    assert again.cached_tokens == BLOCK  # block 1 from its file; blocks 2 and 3 recomputed
    assert again.output_ids == first.output_ids


@pytest.mark.engine
def test_after_the_engine_core_dies_a_session_reloads_its_prefix_from_files(
    filed: Engine,
) -> None:
    bridge = filed.bridge

    async def run() -> tuple[GenerationResult, GenerationResult, TierStats, TierStats]:
        first = await bridge.generate(_fork(bridge, _context(bridge, 450), "One word?"), ONE)
        written = await settled(bridge)
        epoch = bridge.epoch
        for pid in bridge.engine_core_pids():
            os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(600):
            while bridge.epoch == epoch:  # a request finds the engine dead and restarts it
                try:
                    await bridge.wait_ready(600)
                    await bridge.generate(_fork(bridge, _context(bridge, 10), "Hi?"), ONE)
                except EngineDied:
                    pass
                await anyio.sleep(0.5)
        second = await bridge.generate(_fork(bridge, first.handle, "And one more?"), ONE)
        return first, second, written, await settled(bridge)

    first, second, written, after = filed.call(run)
    print(
        f"after a SIGKILL of the EngineCore and a restart: turn 2 {second.cached_tokens} of "
        f"{second.prompt_tokens} cached, {after.disk_read_blocks} blocks read from files "
        f"(the new engine indexed {after.disk_entries} files, {after.disk_bytes} B)"
    )
    assert written.disk_written_blocks >= len(first.handle) // BLOCK
    assert second.cached_tokens >= full_blocks(first.handle)
    assert after.disk_read_blocks >= len(first.handle) // BLOCK


@pytest.mark.engine
def test_the_disk_budget_holds_under_a_flood(filed: Engine) -> None:
    bridge = filed.bridge
    home = home_of(bridge)

    async def run() -> tuple[TierStats, TierStats]:
        start = await settled(bridge)
        await flood(bridge, DISK_BLOCKS * 5 // 4)  # more blocks than the files hold
        return start, await settled(bridge)

    start, end = filed.call(run)
    on_disk = sum(tier_files(home).values())
    print(
        f"file tier after a 50-block flood: {end.disk_entries} files, {end.disk_bytes} B "
        f"(peak {end.disk_peak_bytes}) of {end.disk_budget_bytes} B; {on_disk} B on disk; "
        f"{end.disk_written_blocks - start.disk_written_blocks} written, "
        f"{end.disk_evicted_blocks - start.disk_evicted_blocks} evicted"
    )
    assert end.disk_budget_bytes == DISK_BUDGET
    assert end.disk_peak_bytes <= end.disk_budget_bytes
    assert on_disk == end.disk_bytes <= end.disk_budget_bytes
    assert end.disk_entries == len(tier_files(home)) <= DISK_BLOCKS
    assert end.disk_evicted_blocks > start.disk_evicted_blocks  # the flood pressed the budget
    assert end.disk_written_blocks - start.disk_written_blocks > DISK_BLOCKS


def test_another_model_dtype_block_size_or_version_is_another_directory(tmp_path: Path) -> None:
    """Every field of the directory key changes the folder: their files are never found."""
    base = {
        "model": "/models/SmolLM2-135M-Instruct",
        "revision": None,
        "dtype": "torch.bfloat16",
        "block_size": 128,
        "vllm_version": "0.32.0",
        "hash_algo": "sha256_cbor",
        "block_bytes": BLOCK_BYTES,
    }
    key: Any = directory_key(**base)
    assert directory_key(**base) == key
    for field, other in {
        "model": "/models/Qwen2.5-0.5B",
        "revision": "abc123",
        "dtype": "torch.float16",
        "block_size": 16,
        "vllm_version": "0.33.0",
        "hash_algo": "sha256",
        "block_bytes": BLOCK_BYTES // 2,
    }.items():
        assert directory_key(**{**base, field: other}) != key, field
    # a file written under one key is not in another key's index
    block = bytes(range(256)) * 4
    mine = FileIndex(tmp_path / key, 1 << 20, len(block))
    path = mine.reserve(b"k" * 36)
    assert path is not None
    write_block(path, b"k" * 36, [block])
    mine.complete([b"k" * 36], success=True)
    other = FileIndex(tmp_path / directory_key(**{**base, "dtype": "torch.float16"}), 1 << 20, 1024)
    assert other.read(b"k" * 36) is None and mine.read(b"k" * 36) == block
    # and a restarted index finds it again by name, content checked on read
    assert FileIndex(tmp_path / key, 1 << 20, len(block)).read(b"k" * 36) == block


def test_a_truncated_renamed_or_altered_block_file_is_refused(tmp_path: Path) -> None:
    block = os.urandom(4096)
    path = tmp_path / "a.kv"
    size = write_block(path, b"key-a", [block[:1000], block[1000:]])
    assert size == path.stat().st_size == file_bytes(b"key-a", len(block))
    assert read_block(path, b"key-a", len(block)) == block
    assert read_block(path, b"key-b", len(block)) is None  # another block's name
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    assert read_block(path, b"key-a", len(block)) is None  # truncated
    altered = bytearray(whole)
    altered[-10] ^= 1
    path.write_bytes(bytes(altered))
    assert read_block(path, b"key-a", len(block)) is None  # one bit flipped
    index = FileIndex(tmp_path / "idx", 3 * file_bytes(b"k0", 10), 10)
    for i in range(5):
        target = index.reserve(f"k{i}".encode())
        assert target is not None
        write_block(target, f"k{i}".encode(), [bytes(10)])
        index.complete([f"k{i}".encode()], success=True)
    assert index.entries == 3 and index.evicted_blocks == 2
    assert index.used_bytes == index.peak_bytes == 3 * file_bytes(b"k0", 10)
    assert len(list((tmp_path / "idx").iterdir())) == 3


def test_the_file_tier_needs_the_host_tier_and_a_stable_prefix_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="host_tier_bytes"):
        VLLMBridge(disk_tier_bytes=1 << 30, progress=False)
    with pytest.raises(ValueError, match="disk_tier_bytes"):
        VLLMBridge(host_tier_bytes=1 << 30, disk_tier_bytes=-1, progress=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for algo in ("xxhash", "xxhash_cbor"):
        with pytest.raises(ValueError, match="PYTHONHASHSEED"):
            VLLMBridge(
                host_tier_bytes=1 << 30,
                disk_tier_bytes=1 << 30,
                engine_args={"prefix_caching_hash_algo": algo},
                progress=False,
            )
    monkeypatch.setenv("PYTHONHASHSEED", "7")  # seeded: every process hashes alike
    VLLMBridge(
        host_tier_bytes=1 << 30,
        disk_tier_bytes=1 << 30,
        engine_args={"prefix_caching_hash_algo": "xxhash"},
        progress=False,
    )
    bridge = VLLMBridge(host_tier_bytes=1 << 30, disk_tier_bytes=1 << 30, progress=False)
    args = bridge._engine_arguments()
    assert args["prefix_caching_hash_algo"] == "sha256_cbor"
    extra = args["kv_transfer_config"].kv_connector_extra_config
    assert extra["microagent_disk_bytes"] == 1 << 30
    assert extra["microagent_disk_root"].endswith("/kv")
    assert "prefix_caching_hash_algo" not in VLLMBridge(progress=False)._engine_arguments()
