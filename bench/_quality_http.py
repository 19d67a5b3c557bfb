"""``bench/quality.py --http``: the same requests through ``microagent serve``.

The server is started as a user would start it, with the published files'
``serve_args`` (``--calculator`` for the program-aided configurations) and the
in-process bench's engine settings (``_collab_engines.SETTINGS``), and every
method's request goes to ``/v1/chat/completions`` with its fields as the
body's extra fields, as the openai SDK's ``extra_body`` sends them. The
reply's ``collaboration`` object is read back into what ``outcome_row``
reads, so a row over HTTP is a row in process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from _accuracy_tasks import Item
from _collab_engines import SETTINGS, scheduler_args
from _serve import free_port
from microagent.testing import wait_healthy

#: seconds one request may take (a collaboration of several agents on a loaded CPU)
REQUEST_TIMEOUT = 600.0


class ServedModel:
    """``microagent serve`` on the default model (or ``--engine scripted``) with ``serve_args``.

    Args:
        serve_args: extra ``microagent serve`` options (the published files' ``serve_args``).
        log: where the server's output goes.
        engine: ``vllm`` (the default model) or ``scripted`` (the test double, for tests).
    """

    def __init__(self, serve_args: list[str], log: Path, engine: str = "vllm") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.command = [
            sys.executable,
            "-m",
            "microagent",
            "serve",
            "--port",
            str(self.port),
            "--engine",
            engine,
            *serve_args,
        ]
        if engine == "vllm":
            self.command += scheduler_args()
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        await asyncio.to_thread(self._start)
        self.client = httpx.AsyncClient(base_url=self.url, timeout=REQUEST_TIMEOUT)

    def _start(self) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(SETTINGS["kv_cache_gib"])}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        wait_healthy(self.url, self.proc, "microagent serve", self.log)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    async def collaborate(self, body: dict[str, Any], item: Item) -> SimpleNamespace:
        """One method's request for ``item``; the reply as ``outcome_row`` reads an Outcome.

        Raises:
            ValueError: the server answered 400 (the message names the field), as a
                refused configuration is in process.
        """
        assert self.client is not None, "open() first"
        request = {
            "model": "default",
            "messages": [{"role": "user", "content": item.question}],
            **body,
        }
        t0 = time.monotonic()
        r = await self.client.post("/v1/chat/completions", json=request)
        if r.status_code == 400:
            raise ValueError(r.json()["error"]["message"])
        r.raise_for_status()
        collab = r.json()["collaboration"]
        return SimpleNamespace(
            answer=collab["answer"],
            details=collab["details"],
            rounds=collab["rounds"],
            agents=[
                SimpleNamespace(role=a["role"], answer=a.get("answer")) for a in collab["agents"]
            ],
            usage=SimpleNamespace(**collab["usage"]),
            seconds=time.monotonic() - t0,
        )
