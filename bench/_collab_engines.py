"""The engines under test: microagent's in-process bridge and vLLM's own HTTP servers.

Both get the same scheduler settings (``SETTINGS``) and the same KV cache
size (``VLLM_CPU_KVCACHE_SPACE``). Token and cache numbers come from each
engine's own counters: the bridge's ``stats()`` for microagent, ``/metrics``
for the servers.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from microagent import VLLMBridge
from microagent.engine_bridge import Generation
from microagent.engine_bridge.vllm._compat import cpu_dtype

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


def make_bridge() -> RecordingBridge:
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = SETTINGS["kv_cache_gib"]
    return RecordingBridge(
        "default",
        served_name=SERVED_NAME,
        max_num_batched_tokens=SETTINGS["max_num_batched_tokens"],
        max_num_seqs=SETTINGS["max_num_seqs"],
        max_model_len=SETTINGS["max_model_len"],
        progress=False,
    )


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` on the default model, as a child process."""

    def __init__(
        self,
        model_dir: Path,
        port: int,
        *,
        prefix_caching: bool,
        log: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = port
        self.prefix_caching = prefix_caching
        self.log = log
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.start_seconds = 0.0
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-num-batched-tokens",
            str(SETTINGS["max_num_batched_tokens"]),
            "--max-num-seqs",
            str(SETTINGS["max_num_seqs"]),
            "--max-model-len",
            str(SETTINGS["max_model_len"]),
            "--dtype",
            cpu_dtype(),  # the same as the in-process engine's
            "--enforce-eager",
            "--gpu-memory-utilization",
            "0.5",
        ]
        cmd.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
        cmd.extend(extra_args)
        env = dict(
            os.environ, VLLM_CPU_KVCACHE_SPACE=SETTINGS["kv_cache_gib"], VLLM_SERVER_DEV_MODE="1"
        )
        self._t0 = time.monotonic()
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        # the bench's own directory must not shadow anything in the server
        # its own process group: stop() ends the server and its EngineCore child together
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
        )

    def wait_healthy(self, timeout: float = 600.0) -> None:
        url = f"http://127.0.0.1:{self.port}"
        wait_healthy(url, self.proc, "vLLM server", self.log, timeout)
        self.start_seconds = time.monotonic() - self._t0

    def metrics(self) -> dict[str, float]:
        return fetch_metrics(f"http://127.0.0.1:{self.port}")

    def reset_prefix_cache(self) -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/reset_prefix_cache", method="POST"
        )
        with contextlib.suppress(OSError):  # contexts differ per repetition anyway
            urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        pgid = self.proc.pid  # the group this server leads (start_new_session)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # an EngineCore left behind by the server
        self._log_file.close()


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+\deE.naNinf]+)$")
METRICS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
)


def wait_healthy(
    url: str, proc: subprocess.Popen[Any], what: str, log: Path, timeout: float = 600.0
) -> None:
    """Until ``url/health`` answers 200; an error when ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{what} not healthy after {timeout} s; see {log}")


def fetch_metrics(url: str, names: Sequence[str] = METRICS) -> dict[str, float]:
    """``parse_metrics`` of the server's ``url/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode(), names)


def parse_metrics(text: str, names: Sequence[str] = METRICS) -> dict[str, float]:
    """Sum of each counter of ``names`` over its label sets, from Prometheus text."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def metric_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}
