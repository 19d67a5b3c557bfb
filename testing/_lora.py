"""Tiny random LoRA adapters for a local base model (tests and demos).

vLLM keys cached KV blocks by adapter name *and* path, so two adapters — even
identical ones — never share blocks. Random adapters are enough to show that,
and to exercise adapter routing, without any training or download.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engine_bridge import ModelPreparationError


def make_random_lora(
    base_model_dir: Path | str,
    out_dir: Path | str,
    *,
    rank: int = 8,
    alpha: int | None = None,
    seed: int = 0,
    target_modules: Sequence[str] = ("q_proj", "v_proj"),
) -> Path:
    """Write a randomly initialised peft LoRA adapter for ``base_model_dir`` into ``out_dir``.

    Both LoRA matrices are random (``init_lora_weights=False``), so the adapter
    really changes the model's outputs. An existing adapter in ``out_dir`` is
    kept (the call is idempotent).

    Args:
        base_model_dir: a local HF model directory (e.g. ``resolve_model("default")``).
        out_dir: where to save ``adapter_config.json`` and the weights.
        rank: LoRA rank (the bridge's ``max_lora_rank`` must be at least this).
        alpha: LoRA alpha (default: ``rank``).
        seed: torch seed for the random weights.
        target_modules: the projection layers to adapt.

    Raises:
        ModelPreparationError: ``peft``/``transformers`` missing or the base model unreadable.
    """
    out = Path(out_dir)
    if (out / "adapter_config.json").is_file():
        return out
    try:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise ModelPreparationError(
            f"making a LoRA adapter needs peft and transformers: {exc}"
        ) from exc
    torch.manual_seed(seed)
    try:
        base: Any = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    except Exception as exc:
        raise ModelPreparationError(
            f"cannot load base model {str(base_model_dir)!r}: {exc!r}"
        ) from exc
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    model: Any = get_peft_model(base, config)
    tmp = out.with_name(f".{out.name}.tmp")
    model.save_pretrained(str(tmp))
    tmp.replace(out)
    return out
