"""vLLM's scheduler built from an engine config without an engine: the tests that drive
the retaining scheduler by hand (seeded prefills, async scheduling with a KV connector)."""

from __future__ import annotations

from typing import Any


def build_scheduler(config: Any, *, blocks: int, block: int) -> Any:
    """The scheduler class ``config`` names, as the EngineCore builds it, over a KV cache of
    ``blocks`` blocks of ``block`` tokens (one full-attention layer); sets the config's
    ``num_gpu_blocks`` to match."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    config.cache_config.num_gpu_blocks = blocks
    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=32, dtype=torch.bfloat16)
    page = spec.page_size_bytes
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[
            KVCacheTensor(
                size=page * blocks, layers=["layer"], layer_stride=page * blocks, block_stride=page
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    cls: Any = config.scheduler_config.get_scheduler_cls()  # as the EngineCore does
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block,
        hash_block_size=block,
    )
