"""The engines under test: microagent's in-process bridge and vLLM's own HTTP servers.

Both get the same scheduler settings (``SETTINGS``) and the same KV cache
size (``VLLM_CPU_KVCACHE_SPACE``). Token and cache numbers come from each
engine's own counters: the bridge's ``stats()`` for microagent, ``/metrics``
for the servers. The servers are ``microagent.testing.VLLMServer`` (the tests'
remote model too) with these settings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from microagent import VLLMBridge
from microagent.engine_bridge import Generation
from microagent.engine_bridge.vllm._compat import cpu_dtype
from microagent.testing import VLLMServer

SETTINGS: dict[str, Any] = {
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 16,
    "max_model_len": 4096,
    "kv_cache_gib": "1",
}
SERVED_NAME = "bench"


class RecordingBridge(VLLMBridge):  # type: ignore[misc]
    """A ``VLLMBridge`` that keeps every ``Generation`` it started (for prompts and timings).

    Instrumentation only: ``Outcome`` does not expose the engine requests'
    prompt token ids or timings, which the ideal-prefill arithmetic and the
    time split need.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generations: list[Generation] = []

    def stream(self, *args: Any, **kwargs: Any) -> Generation:
        gen = super().stream(*args, **kwargs)
        self.generations.append(gen)
        return gen


def scheduler_args() -> list[str]:
    """``SETTINGS``' scheduler limits as command-line options (``vllm serve`` and
    ``microagent serve`` spell them alike)."""
    return [
        "--max-num-batched-tokens",
        str(SETTINGS["max_num_batched_tokens"]),
        "--max-num-seqs",
        str(SETTINGS["max_num_seqs"]),
        "--max-model-len",
        str(SETTINGS["max_model_len"]),
    ]


def bridge_arguments() -> dict[str, Any]:
    """``SETTINGS`` as ``VLLMBridge`` keyword arguments; the KV cache size goes in the
    environment, where vLLM's CPU backend reads it."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = SETTINGS["kv_cache_gib"]
    return {
        "max_num_batched_tokens": SETTINGS["max_num_batched_tokens"],
        "max_num_seqs": SETTINGS["max_num_seqs"],
        "max_model_len": SETTINGS["max_model_len"],
        "progress": False,
    }


def make_bridge() -> RecordingBridge:
    return RecordingBridge("default", served_name=SERVED_NAME, **bridge_arguments())


class Server(VLLMServer):
    """vLLM's own server on the default model with the benchmark's settings (``SETTINGS``)."""

    def __init__(
        self,
        model_dir: Path,
        port: int,
        *,
        prefix_caching: bool,
        log: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            model_dir,
            port,
            log=log,
            served_name=SERVED_NAME,
            prefix_caching=prefix_caching,
            dtype=cpu_dtype(),  # the same as the in-process engine's
            args=[*scheduler_args(), *extra_args],
            env={"VLLM_CPU_KVCACHE_SPACE": SETTINGS["kv_cache_gib"]},
        )
