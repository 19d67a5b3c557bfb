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

import time
from collections.abc import Collection
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
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.outputs import KVConnectorOutput

from ._tier_stats import TierStats

#: ``kv_connector_extra_config`` key of the host budget in bytes (one engine, all workers).
BUDGET_KEY = "microagent_host_bytes"
#: Name of the EngineCore utility that reports ``TierStats`` as a dict.
STATS_UTILITY = "microagent_tier_stats"
CONNECTOR_NAME = "HostTierConnector"
SPEC_NAME = "HostTierSpec"


class HostIndex(CPUOffloadingManager):
    """vLLM's CPU offloading index (LRU over ``num_chunks`` host rows), counting entries.

    ``entry_bytes``: what one entry (a chunk of ``blocks_per_chunk`` blocks, one by
    default) takes in the host store, over all workers.
    """

    def __init__(self, num_chunks: int, entry_bytes: int) -> None:
        super().__init__(num_chunks=num_chunks, cache_policy="lru")
        self.capacity = num_chunks
        self.entry_bytes = entry_bytes
        self.entries = 0
        self.peak_entries = 0
        self.stored_blocks = 0
        self.loaded_blocks = 0
        self.evicted_blocks = 0

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
        return out

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

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        self.loaded_blocks += len(keys)
        return super().prepare_load(keys, req_context)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.entries = 0


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
        self._manager: HostIndex | None = None
        self._worker: HostTierWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            workers = max(1, self.config.parallel.world_size)
            self._manager = HostIndex(self.num_chunks, self.chunk_bytes * workers)
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
        return self._transfer(job_id, dst_spec, src_spec, to_host=False)

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
        assert isinstance(index, HostIndex)
        transfer = self._vllm_config.kv_transfer_config
        extra = transfer.kv_connector_extra_config if transfer is not None else {}
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
        )


def connector_config(budget_bytes: int) -> dict[str, Any]:
    """``KVTransferConfig`` fields that load the host tier with this RAM budget."""
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": __name__,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": SPEC_NAME,
            "spec_module_path": __name__,
            BUDGET_KEY: int(budget_bytes),
            # an agent's own output is the next turn's prefix: store it too
            "offload_prompt_only": False,
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
