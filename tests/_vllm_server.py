"""vLLM's own OpenAI server as a test's "remote" model (``microagent.testing.VLLMServer``).

Started on the default model with the benchmarks' scheduler settings (~110 s to
healthy on a 2-core CPU) and the in-process engine's dtype.
"""

from __future__ import annotations

import socket
from pathlib import Path

from microagent.engine_bridge import resolve_model
from microagent.engine_bridge.vllm._compat import cpu_dtype
from microagent.testing import VLLMServer

#: The model name the server answers to.
SERVED_NAME = "bench"

__all__ = ["SERVED_NAME", "start_server"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(workdir: Path) -> VLLMServer:
    """Start the server process (not yet healthy: call ``wait_healthy``; ``stop`` when done)."""
    model_dir = resolve_model("default", progress=False)
    assert isinstance(model_dir, Path)
    return VLLMServer(
        model_dir,
        _free_port(),
        log=workdir / "vllm-server.log",
        served_name=SERVED_NAME,
        dtype=cpu_dtype(),
        args=[
            "--max-num-batched-tokens",
            "2048",
            "--max-num-seqs",
            "16",
            "--max-model-len",
            "4096",
        ],
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
