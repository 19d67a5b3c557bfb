"""A host (RAM) KV tier below vLLM's device cache, through vLLM's KV-connector API.

Decision: reuse vLLM's ``OffloadingConnector`` and plug in our own offloading
spec (``spec_name`` / ``spec_module_path`` in ``kv_connector_extra_config``),
rather than write a connector of our own. The connector's scheduler side is
platform-neutral and already does what a tier needs: write-through stores of
every full block, lookups by block hash when a request is admitted, loads into
freshly allocated blocks, fences when a block being stored is reallocated,
reload after preemption. What does not run on CPU is only the stock spec's
worker: ``CPUOffloadingSpec`` refuses to start off CUDA/XPU and its
``swap_blocks`` kernels are CUDA-only. So ``HostTierSpec`` keeps vLLM's
``CPUOffloadingManager`` (the index: LRU over a fixed number of host blocks,
entries protected while they are read or written) and gives it
``HostTierWorker``, which copies whole block rows with torch indexing between
the device cache and one preallocated host tensor per KV tensor. The copies are
synchronous (a job is done when ``submit_*`` returns); the scheduler still sees
a load as asynchronous, which costs the loading request one engine step.

With a disk budget, a file tier (``_file_tier``) sits under the host store,
written through: the worker writes each block it stores in RAM to its file in
the same step. A lookup that misses RAM reads the file in the scheduler and
checks its digest there, so a bad file is a miss before anything is promised
(vLLM's connector has no way to fail a load); the checked bytes travel to the
worker in the load spec and are copied straight into the device blocks. The
file tier is limited to one worker, one KV cache group and one block per
host entry (vLLM's defaults for a plain model), and is refused otherwise.

Entries are keyed by vLLM's block hashes (``OffloadKey`` = hash + group), which
include the LoRA adapter and the request's ``cache_salt``: a tenant never hits
an entry it could not have hit in the device cache. The RAM budget is never
exceeded: the host store is sized once, in whole blocks, within the budget, and
the index never holds more blocks than it has rows (it evicts its least
recently used entry, or skips the store when every entry is being read).

``HostTierConnector`` is the stock connector plus a tally of what moved
(``TierStats``), read by the bridge through an EngineCore utility. Loaded by
``KVTransferConfig(kv_connector="HostTierConnector",
kv_connector_module_path=<this module>)``; the factory imports this module in
the front end, the EngineCore and the worker process (nothing here touches a
device at import).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.utils.math_utils import cdiv
from vllm.v1.engine.core import EngineCore
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.outputs import KVConnectorOutput

from .._tier_stats import TierStats
from ._file_tier import FileIndex, directory_key, write_block
from ._tier_policy import SessionPolicy

log = logging.getLogger(__name__)

#: ``kv_connector_extra_config`` key of the host budget in bytes (one engine, all workers).
BUDGET_KEY = "microagent_host_bytes"
#: ``kv_connector_extra_config`` keys of the file tier: its budget, its root folder, and
#: what the directory key takes that vLLM's offloading config does not carry
DISK_BUDGET_KEY = "microagent_disk_bytes"
DISK_ROOT_KEY = "microagent_disk_root"
REVISION_KEY = "microagent_revision"
HASH_ALGO_KEY = "microagent_hash_algo"
#: Name of the EngineCore utility that reports ``TierStats`` as a dict.
STATS_UTILITY = "microagent_tier_stats"
#: ``kv_connector_extra_config`` key of the host index's eviction policy: ``"sessions"``
#: (``SessionPolicy``: the agents' waiting sessions go last) or vLLM's stock ``"lru"``
POLICY_KEY = "microagent_tier_policy"
SESSIONS_POLICY = "sessions"
POLICIES = (SESSIONS_POLICY, "lru")
CONNECTOR_NAME = "HostTierConnector"
SPEC_NAME = "HostTierSpec"


class TierStoreSpec(CPULoadStoreSpec):
    """Host rows to store into, and for each block the file to write it to (None: none)."""

    def __init__(self, block_ids: list[int], files: list[tuple[str, bytes] | None]) -> None:
        super().__init__(block_ids)
        self.files = files


class TierLoadSpec(LoadStoreSpec):
    """Where each block to load comes from: a host row (``rows[i] >= 0``) or checked file bytes."""

    def __init__(self, rows: list[int], payloads: list[bytearray | None]) -> None:
        self.rows = np.array(rows, dtype=np.int64)
        self.payloads = payloads


class HostIndex(CPUOffloadingManager):
    """vLLM's CPU offloading index (LRU over ``num_chunks`` host rows), counting entries.

    ``entry_bytes``: what one entry (a chunk of ``blocks_per_chunk`` blocks, one by
    default) takes in the host store, over all workers. ``files``: the file tier
    below it (None: none); a key missing from RAM is looked up there.
    """

    def __init__(
        self,
        num_chunks: int,
        entry_bytes: int,
        files: FileIndex | None = None,
        policy: str = SESSIONS_POLICY,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"{POLICY_KEY} must be one of {POLICIES}, got {policy!r}")
        if policy == SESSIONS_POLICY:
            super().__init__(
                num_chunks=num_chunks,
                cache_policy=SessionPolicy.__name__,
                cache_policy_module_path=SessionPolicy.__module__,
            )
        else:
            super().__init__(num_chunks=num_chunks, cache_policy=policy)
        self.capacity = num_chunks
        self.entry_bytes = entry_bytes
        self.files = files
        self.entries = 0
        self.peak_entries = 0
        self.stored_blocks = 0
        self.loaded_blocks = 0
        self.evicted_blocks = 0
        #: request id -> file blocks checked by a lookup, held until its load is prepared
        self._staged: dict[str, dict[OffloadKey, bytearray]] = {}
        #: request id -> keys of its load that come from files (not host rows)
        self._file_loads: dict[str, set[OffloadKey]] = {}

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = super().lookup(key, req_context)
        if found is not LookupResult.MISS or self.files is None:
            return found
        staged = self._staged.setdefault(req_context.req_id, {})
        if key not in staged:
            data = self.files.read(key)
            if data is None:
                return LookupResult.MISS
            staged[key] = data
        return LookupResult.HIT

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        if self._policy.get(key) is None and key in self._staged.get(req_context.req_id, {}):
            return CacheHitSource.DISK
        return CacheHitSource.HOST

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is not None:
            self.entries += len(out.keys_to_store) - len(out.evicted_keys)
            self.evicted_blocks += len(out.evicted_keys)
            self.peak_entries = max(self.peak_entries, self.entries)
            if self.entries > self.capacity:  # the index's own bound; never expected
                raise AssertionError(f"host tier holds {self.entries} > {self.capacity} blocks")
        if out is None or self.files is None or not out.keys_to_store:
            return out
        files: list[tuple[str, bytes] | None] = []
        for key in out.keys_to_store:
            path = self.files.reserve(key)
            files.append(None if path is None else (str(path), bytes(key)))
        assert isinstance(out.store_spec, BlockIDsLoadStoreSpec)
        spec = TierStoreSpec(out.store_spec.block_ids.tolist(), files)
        return PrepareStoreOutput(out.keys_to_store, spec, out.evicted_keys)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        pending = 0
        for key in keys:
            chunk = self._policy.get(key)
            pending += chunk is not None and not chunk.is_ready
        super().complete_store(keys, req_context, success)
        if success:
            self.stored_blocks += pending
        else:
            self.entries -= pending
        if self.files is not None:
            self.files.complete(keys, success)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        self.loaded_blocks += len(keys)
        staged = self._staged.pop(req_context.req_id, {})
        in_ram = [k for k in keys if (c := self._policy.get(k)) is not None and c.is_ready]
        if len(in_ram) == len(keys):
            return super().prepare_load(keys, req_context)
        spec = super().prepare_load(in_ram, req_context)
        assert isinstance(spec, BlockIDsLoadStoreSpec)
        rows = iter(spec.block_ids.tolist())
        from_ram = set(in_ram)
        host_rows: list[int] = []
        payloads: list[bytearray | None] = []
        for key in keys:
            if key in from_ram:
                host_rows.append(next(rows))
                payloads.append(None)
                continue
            data = staged.get(key)
            if data is None:  # looked up in an earlier step and since dropped: read again
                assert self.files is not None
                data = self.files.read(key)
                if data is None:
                    raise RuntimeError(f"KV tier file for block {key.hex()} went bad after lookup")
            host_rows.append(-1)
            payloads.append(data)
        self._file_loads[req_context.req_id] = set(keys) - from_ram
        return TierLoadSpec(host_rows, payloads)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        from_files = self._file_loads.pop(req_context.req_id, set())
        super().complete_load([k for k in keys if k not in from_files], req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._staged.pop(req_context.req_id, None)
        super().on_request_finished(req_context)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.entries = 0
        self._staged.clear()
        if self.files is not None:
            self.files.clear()


class HostTierSpec(OffloadingSpec):
    """The offloading spec vLLM's connector builds from the extra config: our index and worker."""

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        """The CPU spec's metrics: our index is its manager and reports the same gauges."""
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        return CPUOffloadingSpec.build_metric_definitions(extra_config)

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.budget_bytes = int(self.extra_config.get(BUDGET_KEY, 0))
        if self.budget_bytes <= 0:
            raise ValueError(f"{BUDGET_KEY} must be > 0 bytes, got {self.budget_bytes}")
        workers = max(1, config.parallel.world_size)
        #: bytes one host row holds on one worker (a chunk: ``blocks_per_chunk`` blocks)
        self.chunk_bytes = config.worker_kv_bytes_per_block * self.blocks_per_chunk
        self.num_chunks = self.budget_bytes // max(1, self.chunk_bytes * workers)
        self.disk_bytes = int(self.extra_config.get(DISK_BUDGET_KEY, 0))
        self.directory = self._file_directory() if self.disk_bytes > 0 else None
        self._manager: HostIndex | None = None
        self._worker: HostTierWorker | None = None

    def _file_directory(self) -> Path:
        """The file tier's folder for this model and layout; refuses layouts it cannot key."""
        import vllm

        config = self.config
        limits = {
            "workers": (config.parallel.world_size, 1),
            "KV cache groups": (len(config.groups), 1),
            "blocks per host entry": (self.blocks_per_chunk, 1),
        }
        for what, (have, allowed) in limits.items():
            if have != allowed:
                raise ValueError(
                    f"the KV file tier supports {allowed} {what}, this engine has {have}"
                )
        root = self.extra_config.get(DISK_ROOT_KEY)
        if not root:
            raise ValueError(f"{DISK_ROOT_KEY} must name the file tier's root folder")
        key = directory_key(
            model=config.model.name,
            revision=self.extra_config.get(REVISION_KEY),
            dtype=str(config.model.dtype),
            block_size=config.cache.tokens_per_hash,
            vllm_version=vllm.__version__,
            hash_algo=str(self.extra_config.get(HASH_ALGO_KEY)),
            block_bytes=config.worker_kv_bytes_per_block,
        )
        return Path(root) / key

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            workers = max(1, self.config.parallel.world_size)
            files = None
            if self.directory is not None:
                files = FileIndex(
                    self.directory, self.disk_bytes, self.config.worker_kv_bytes_per_block
                )
            self._manager = HostIndex(
                self.num_chunks,
                self.chunk_bytes * workers,
                files,
                str(self.extra_config.get(POLICY_KEY, SESSIONS_POLICY)),
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostTierWorker(
                kv_caches, self.blocks_per_chunk, self.num_chunks, self.chunk_bytes
            )
        return self._worker


class HostTierWorker(OffloadingWorker):
    """Copies block rows between the device cache and preallocated host tensors.

    Each KV tensor of the device cache is seen as ``(num_blocks, page_bytes)``
    int8 rows; its host twin has ``num_chunks * blocks_per_chunk`` rows of the
    same width. Row ``c * blocks_per_chunk + j`` holds sub-block ``j`` of host
    chunk ``c``. A copy is one indexed read and one indexed write per tensor.
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_chunks: int,
        chunk_bytes: int,
    ) -> None:
        self._blocks_per_chunk = blocks_per_chunk
        self._device: list[torch.Tensor] = []
        for entry in kv_caches.tensors:
            rows = entry.tensor
            if rows.dtype != torch.int8 or rows.ndim != 2:
                rows = rows.view(torch.int8).view(-1, entry.page_size_bytes)
            self._device.append(rows)
        self._row_bytes = [int(t.shape[1]) for t in self._device]
        # checked before allocating: the store never takes more than the scheduler sized
        wanted = num_chunks * blocks_per_chunk * sum(self._row_bytes)
        if wanted > num_chunks * chunk_bytes:
            raise ValueError(
                f"the host tier would allocate {wanted} bytes for {num_chunks} entries "
                f"of {chunk_bytes} (the budget's unit): the KV layout is not what the "
                "scheduler sized it for"
            )
        self._host = [
            torch.zeros((num_chunks * blocks_per_chunk, width), dtype=torch.int8)
            for width in self._row_bytes
        ]
        # every group's tensors, each once (layers that alias one tensor copy it once)
        self._group_tensors: list[list[int]] = [
            sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs
        ]
        self._finished: list[TransferResult] = []

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        if isinstance(src_spec, TierLoadSpec):
            return self._load_mixed(job_id, src_spec, dst_spec)
        return self._transfer(job_id, dst_spec, src_spec, to_host=False)

    def _load_mixed(self, job_id: int, src: TierLoadSpec, device: GPULoadStoreSpec) -> bool:
        """Blocks from host rows and from checked file bytes (one group, one block per entry)."""
        t0 = time.perf_counter()
        assert self._blocks_per_chunk == 1 and len(self._group_tensors) == 1
        blocks = device.block_ids.astype(np.int64)
        assert len(blocks) == len(src.rows) == len(src.payloads)
        tensors = self._group_tensors[0]
        in_ram = src.rows >= 0
        moved = 0
        if in_ram.any():
            device_rows = torch.from_numpy(blocks[in_ram])
            host_rows = torch.from_numpy(src.rows[in_ram])
            for t in tensors:
                self._device[t][device_rows] = self._host[t][host_rows]
                moved += len(host_rows) * self._row_bytes[t]
        for block, payload in zip(blocks.tolist(), src.payloads, strict=True):
            if payload is None:
                continue
            data = torch.frombuffer(payload, dtype=torch.int8)
            offset = 0
            for t in tensors:
                width = self._row_bytes[t]
                self._device[t][block] = data[offset : offset + width]
                offset += width
            assert offset == len(data), "a file block's size does not match the KV layout"
            moved += offset
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=moved,
                transfer_time=time.perf_counter() - t0,
            )
        )
        return True

    def _write_files(self, rows: np.ndarray, files: list[tuple[str, bytes] | None]) -> None:
        """Write-through: each stored block's host rows (every tensor of group 0) to its file."""
        tensors = self._group_tensors[0]
        for row, target in zip(rows.tolist(), files, strict=True):
            if target is None:
                continue
            path, key = target
            parts = [self._host[t][row].numpy().data for t in tensors]
            try:
                write_block(Path(path), key, parts)
            except OSError as exc:  # a full disk, a folder removed: the read will miss
                log.warning("KV file tier: writing %s failed: %r", path, exc)

    def _transfer(
        self, job_id: int, device: GPULoadStoreSpec, host: LoadStoreSpec, *, to_host: bool
    ) -> bool:
        assert isinstance(host, BlockIDsLoadStoreSpec)
        t0 = time.perf_counter()
        per_chunk = self._blocks_per_chunk
        blocks = device.block_ids
        chunks = host.block_ids
        block_at = chunk_at = 0
        moved = 0
        for group, (count, first) in enumerate(
            zip(device.group_sizes, device.block_indices, strict=True)
        ):
            if not count:
                continue
            # a group's first host chunk may start mid-chunk (``first`` is a block index)
            skip = int(first) % per_chunk
            n_chunks = cdiv(count + skip, per_chunk)
            group_chunks = chunks[chunk_at : chunk_at + n_chunks].astype(np.int64)
            rows = (group_chunks[:, None] * per_chunk + np.arange(per_chunk)).reshape(-1)
            host_rows = torch.from_numpy(rows[skip : skip + count])
            device_rows = torch.from_numpy(blocks[block_at : block_at + count].astype(np.int64))
            for t in self._group_tensors[group]:
                if to_host:
                    self._host[t][host_rows] = self._device[t][device_rows]
                else:
                    self._device[t][device_rows] = self._host[t][host_rows]
                moved += count * self._row_bytes[t]
            block_at += count
            chunk_at += n_chunks
        assert block_at == len(blocks) and chunk_at == len(chunks)
        if to_host and isinstance(host, TierStoreSpec):
            assert per_chunk == 1 and len(self._group_tensors) == 1
            self._write_files(chunks.astype(np.int64), host.files)
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=moved,
                transfer_time=time.perf_counter() - t0,
            )
        )
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return None  # every copy is done when submit_* returns

    def shutdown(self) -> None:
        self._host.clear()
        self._device.clear()


class HostTierConnector(OffloadingConnector):
    """vLLM's offloading connector over ``HostTierSpec``, tallying the bytes it moves."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored_bytes = 0
        self.loaded_bytes = 0
        self.load_seconds = 0.0

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        stats = getattr(meta, "transfer_stats", None)
        if stats is not None:
            self.stored_bytes += int(stats.store.bytes)
            self.loaded_bytes += int(stats.load.bytes)
            self.load_seconds += float(stats.load.time)
        super().update_connector_output(connector_output)

    def tier_stats(self) -> TierStats:
        index = self.scheduler.manager
        transfer = self._vllm_config.kv_transfer_config
        extra = transfer.kv_connector_extra_config if transfer is not None else {}
        if not isinstance(index, HostIndex):  # vLLM's stock spec (a GPU): what it shows
            assert isinstance(index, CPUOffloadingManager)
            budget = int(extra.get(BUDGET_KEY, 0))
            chunks = index._num_chunks
            return TierStats(
                enabled=True,
                budget_bytes=budget,
                capacity_bytes=budget // max(1, chunks) * chunks,
                block_bytes=budget // max(1, chunks),
                capacity_blocks=chunks,
                entries=len(getattr(index._policy, "chunks", ())),
                stored_bytes=self.stored_bytes,
                loaded_bytes=self.loaded_bytes,
                load_seconds=self.load_seconds,
                **_policy_stats(index),
            )
        return TierStats(
            enabled=True,
            budget_bytes=int(extra.get(BUDGET_KEY, 0)),
            capacity_bytes=index.capacity * index.entry_bytes,
            block_bytes=index.entry_bytes,
            capacity_blocks=index.capacity,
            entries=index.entries,
            peak_entries=index.peak_entries,
            stored_blocks=index.stored_blocks,
            stored_bytes=self.stored_bytes,
            loaded_blocks=index.loaded_blocks,
            loaded_bytes=self.loaded_bytes,
            evicted_blocks=index.evicted_blocks,
            load_seconds=self.load_seconds,
            **_policy_stats(index),
            **_file_stats(index.files),
        )


def _policy_stats(index: CPUOffloadingManager) -> dict[str, Any]:
    policy = index._policy
    if not isinstance(policy, SessionPolicy):
        return {"policy": "lru"}
    return {
        "policy": SESSIONS_POLICY,
        "held_sessions": policy.sessions,
        "held_blocks": policy.held_keys,
        "cold_evicted_blocks": policy.cold_evictions,
        "held_evicted_blocks": policy.held_evictions,
    }


def _file_stats(files: FileIndex | None) -> dict[str, Any]:
    if files is None:
        return {}
    return {
        "disk_budget_bytes": files.budget_bytes,
        "disk_directory": str(files.directory),
        "disk_entries": files.entries,
        "disk_bytes": files.used_bytes,
        "disk_peak_bytes": files.peak_bytes,
        "disk_written_blocks": files.written_blocks,
        "disk_read_blocks": files.loaded_blocks,
        "disk_evicted_blocks": files.evicted_blocks,
        "disk_rejected_blocks": files.rejected_blocks,
    }


def connector_config(
    budget_bytes: int,
    disk_bytes: int = 0,
    disk_root: str | None = None,
    revision: str | None = None,
    hash_algo: str | None = None,
    policy: str = SESSIONS_POLICY,
    stock_spec: bool = False,
) -> dict[str, Any]:
    """``KVTransferConfig`` fields that load the host tier (and the file tier below it).

    ``stock_spec`` (a GPU, no file tier): vLLM's own ``CPUOffloadingSpec`` (pinned host
    memory, its CUDA copy kernels, asynchronous transfers) with our eviction policy
    plugged in by name (``eviction_policy`` / ``cache_policy_module_path``), instead of
    ``HostTierSpec``, whose synchronous torch-indexing worker exists because the stock
    spec does not start on CPU. Configured here, never run on a GPU.
    """
    if stock_spec:
        if disk_bytes:
            raise ValueError("the stock CPU offloading spec has no file tier under it")
        stock: dict[str, Any] = {"cpu_bytes_to_use": int(budget_bytes), "eviction_policy": "lru"}
        if policy == SESSIONS_POLICY:
            stock |= {
                "eviction_policy": SessionPolicy.__name__,
                "cache_policy_module_path": SessionPolicy.__module__,
            }
        return {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": __name__,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "CPUOffloadingSpec",
                BUDGET_KEY: int(budget_bytes),
                POLICY_KEY: policy,
                "offload_prompt_only": False,
                **stock,
            },
        }
    files: dict[str, Any] = {}
    if disk_bytes:
        files = {
            DISK_BUDGET_KEY: int(disk_bytes),
            DISK_ROOT_KEY: disk_root,
            REVISION_KEY: revision,
            HASH_ALGO_KEY: hash_algo,
        }
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": __name__,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": SPEC_NAME,
            "spec_module_path": __name__,
            BUDGET_KEY: int(budget_bytes),
            POLICY_KEY: policy,
            # an agent's own output is the next turn's prefix: store it too
            "offload_prompt_only": False,
            **files,
        },
    }


def _stats(core: EngineCore) -> dict[str, object]:
    connector = getattr(core.scheduler, "connector", None)
    if not isinstance(connector, HostTierConnector):
        return {}
    return connector.tier_stats().to_dict()


# Travels by name (``getattr(EngineCore, name)`` in the core process); the connector
# factory imports this module there.
setattr(EngineCore, STATS_UTILITY, _stats)
