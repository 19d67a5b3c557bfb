"""Graceful shutdown: new requests get 503, work in flight finishes or is cancelled.

In process, ``Drain`` is driven directly on the ScriptedEngine: a request that
finishes within the grace period answers 200, those that outlive it are
cancelled with their engine requests (a 503, or a stream's ``error`` event and
``[DONE]``). Then ``microagent serve --engine scripted`` runs as a process: a
SIGTERM lets the held request finish, turns new ones away and exits with 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from microagent.server import create_app
from microagent.server._shutdown import Drain
from microagent.testing import ScriptedEngine
from test_server_helpers import eventually

USER = [{"role": "user", "content": "Is the answer yes or no?"}]


@pytest.mark.anyio
async def test_drain_lets_work_finish_then_cancels_what_outlives_the_grace(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    engine = ScriptedEngine(decode_time_per_token=0.02, reply_words=(400, 500))
    drain = Drain(grace=3.0, retry_after=7)
    short = {"messages": USER, "max_tokens": 10}  # ~0.2 s
    long = {"messages": USER, "max_tokens": 1000}  # >= 8 s
    long_vote = {
        **long,
        "agents": [{"name": "voter", "count": 2}],
        "collaboration": {"mode": "vote", "early_stop": False},
        "stream": True,
    }
    async with engine:
        app = create_app({"scripted": engine}, drain=drain)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=60
        ) as client:
            got: dict[str, httpx.Response] = {}
            cancelled: list[int] = []

            async def post(name: str, body: dict[str, Any]) -> None:
                got[name] = await client.post("/v1/chat/completions", json=body)

            async def run_drain() -> None:
                cancelled.append(await drain.drain())

            async with anyio.create_task_group() as tg:
                tg.start_soon(post, "short", short)
                tg.start_soon(post, "long", long)
                tg.start_soon(post, "stream", long_vote)
                await eventually(lambda: len(engine.live_requests()) >= 4)
                tg.start_soon(run_drain)
                await eventually(lambda: drain.draining)
                refused = await client.post("/v1/chat/completions", json=short)
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "7"
                assert refused.json()["error"]["code"] == "shutting_down"
                health = await client.get("/health")
                assert health.status_code == 503 and health.json()["status"] == "draining"
            metrics = (await client.get("/metrics")).text

    assert got["short"].status_code == 200  # finished within the grace period
    assert got["short"].json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert got["long"].status_code == 503  # outlived it: cancelled
    assert got["long"].json()["error"]["code"] == "shutting_down"
    lines = [line[6:] for line in got["stream"].text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    assert json.loads(lines[-2])["error"]["code"] == "shutting_down"
    assert cancelled == [2] and drain.cancelled == 2
    assert not engine.live_requests()  # their engine requests were aborted
    assert engine.stats().requests_aborted >= 3
    assert app.state.microagent.requests == 0
    assert 'microagent:rejected_total{reason="shutting_down"} 1.0' in metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigterm_lets_the_request_in_flight_finish_refuses_new_ones_and_exits_0(
    tmp_path: Path,
) -> None:
    port = _free_port()
    tests = Path(__file__).parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
        "MICROAGENT_TEST_DIR": str(tmp_path),
    }
    command = [
        str(Path(sys.executable).with_name("microagent")),
        "serve",
        "--engine",
        "scripted",
        "--port",
        str(port),
        "--tool",
        "hold=_held_tool:hold",
        "--grace",
        "30",
    ]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    body = {
        "messages": [{"role": "user", "content": "Hold on."}],
        "max_tokens": 64,  # room for the whole tool call
        "agents": [{"name": "worker", "count": 2}],
        "collaboration": {
            "mode": "debate",
            "rounds": 1,
            "tools": ["hold"],
            "tool_choice": "required",
        },
    }
    held: list[httpx.Response] = []
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        anyio.run(eventually, up, 60.0)
        sender = threading.Thread(
            target=lambda: held.append(
                httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            )
        )
        sender.start()
        anyio.run(eventually, (tmp_path / "started").exists, 30.0)  # the tool holds it
        proc.send_signal(signal.SIGTERM)

        def draining() -> bool:  # the socket stays open while it drains
            return httpx.get(f"{url}/health", timeout=5).status_code == 503

        anyio.run(eventually, draining, 10.0)
        late = httpx.post(
            f"{url}/v1/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=10
        )
        assert late.status_code == 503
        assert late.json()["error"]["code"] == "shutting_down"
        assert int(late.headers["retry-after"]) >= 1
        assert proc.poll() is None  # still draining: the request in flight holds it
        (tmp_path / "release").touch()
        sender.join(60)
        assert held and held[0].status_code == 200, held[0].text if held else "no answer"
        assert held[0].json()["choices"][0]["message"]["content"]
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
