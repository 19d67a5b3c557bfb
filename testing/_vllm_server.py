"""vLLM's own OpenAI server as a child process: a real "remote" model for tests and benchmarks.

The tests of the remote bridge and the benchmarks that compare microagent with
vLLM's server start it the same way, from here: ``VLLMServer`` runs
``python -m vllm.entrypoints.openai.api_server`` in its own process group,
waits for ``/health`` and reads its Prometheus counters.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

#: The counters ``VLLMServer.metrics`` reads by default (each summed over its label sets).
VLLM_COUNTERS: Final = (
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
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+\deE.naNinf]+)$")


class VLLMServer:
    """vLLM's OpenAI server on a local model directory, started as a child process.

    It starts at once; call ``wait_healthy`` before the first request and
    ``stop`` when done (it ends the server and its EngineCore child together).

    Args:
        model_dir: the model to serve (e.g. ``resolve_model("default")``).
        port: the local port it listens on (``base_url`` is its ``/v1``).
        log: where its output goes (named in the errors of ``wait_healthy``).
        served_name: the model name requests give.
        prefix_caching: whether vLLM's prefix cache is on.
        dtype: the weights' dtype (``--dtype``).
        args: more command-line arguments (scheduler settings); a repeated option's last value wins.
        env: more environment variables (e.g. ``VLLM_CPU_KVCACHE_SPACE``).
    """

    def __init__(
        self,
        model_dir: Path,
        port: int,
        *,
        log: Path,
        served_name: str,
        prefix_caching: bool = True,
        dtype: str = "auto",
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.served_name = served_name
        self.prefix_caching = prefix_caching
        self.log = log
        self.base_url = f"http://127.0.0.1:{port}/v1"
        #: seconds from the start to the first healthy answer (set by ``wait_healthy``)
        self.start_seconds = 0.0
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            dtype,
            "--enforce-eager",
            "--gpu-memory-utilization",
            "0.5",
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
            *args,
        ]
        # dev mode: the /reset_prefix_cache route
        environ = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})}
        self._t0 = time.monotonic()
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        # cwd "/": the caller's directory must not shadow anything in the server;
        # its own process group: stop() ends the server and its EngineCore child together
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd="/",
            start_new_session=True,
        )

    def wait_healthy(self, timeout: float = 600.0) -> None:
        """Until the server answers ``/health`` (an error if it exits or ``timeout`` passes)."""
        wait_healthy(f"http://127.0.0.1:{self.port}", self.proc, "vLLM server", self.log, timeout)
        self.start_seconds = time.monotonic() - self._t0

    def metrics(self, names: Sequence[str] = VLLM_COUNTERS) -> dict[str, float]:
        """The server's counters ``names`` now (see ``fetch_metrics``)."""
        return fetch_metrics(f"http://127.0.0.1:{self.port}", names)

    def reset_prefix_cache(self) -> None:
        """Empty the server's prefix cache (best effort: a failure is ignored)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/reset_prefix_cache", method="POST"
        )
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        """End the server and everything it started; close its log."""
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


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float = 600.0
) -> None:
    """Until ``url/health`` answers 200 (any server process ``proc``, logging to ``log``).

    Raises:
        RuntimeError: ``proc`` exited first.
        TimeoutError: ``timeout`` seconds passed.
    """
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


def fetch_metrics(url: str, names: Sequence[str] = VLLM_COUNTERS) -> dict[str, float]:
    """``parse_metrics`` of the server's ``url/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode(), names)


def parse_metrics(text: str, names: Sequence[str] = VLLM_COUNTERS) -> dict[str, float]:
    """Each counter of ``names`` summed over its label sets, from Prometheus text (0 if absent)."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def metric_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """How much each counter of ``after`` rose since ``before``."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}
