"""``microagent serve`` as the bench scripts start it: a free port, the server as a child
process logging to a file, ready once ``/health`` answers (``microagent.testing``'s
``wait_healthy``), its counters read from ``/metrics`` (``fetch_metrics``), stopped with
SIGINT as a user's Ctrl-C stops it."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from microagent.testing import fetch_metrics, wait_healthy

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MicroagentServe:
    """``microagent serve --port <free> *args``, its output in ``log``; ready when made.

    Raises:
        RuntimeError: the server exited before it was healthy.
        TimeoutError: not healthy within ``timeout`` seconds.
    """

    def __init__(self, log: Path, *args: str, timeout: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/microagent"), "serve", "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            wait_healthy(self.url, self.proc, "microagent serve", log, timeout)
        except BaseException:
            self.stop()
            raise

    def metric(self, name: str) -> float:
        """Counter ``name`` summed over its label sets (0 when absent)."""
        return float(fetch_metrics(self.url, [name])[name])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
