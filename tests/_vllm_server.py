"""vLLM's own OpenAI server as a test's "remote" model: the benchmark's launcher, reused.

``bench/_collab_engines.py`` starts ``python -m vllm.entrypoints.openai.api_server``
on the default model with the benchmark's scheduler settings (~110 s to healthy
on a 2-core CPU); tests import that ``Server`` rather than a copy of it.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from microagent.engine_bridge import resolve_model

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _collab_engines import SERVED_NAME, Server, metric_delta  # noqa: E402

__all__ = ["SERVED_NAME", "Server", "metric_delta", "start_server"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(workdir: Path) -> Server:
    """Start the server process (not yet healthy: call ``wait_healthy``; ``stop`` when done)."""
    model_dir = resolve_model("default", progress=False)
    assert isinstance(model_dir, Path)
    return Server(model_dir, _free_port(), prefix_caching=True, log=workdir / "vllm-server.log")
