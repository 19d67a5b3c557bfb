"""Many collaborations at once on one ScriptedEngine: all succeed, nothing leaks."""

from __future__ import annotations

import asyncio

import anyio
import httpx
import pytest
from microagent.server import ServerLimits, create_app
from microagent.testing import ScriptedEngine


@pytest.mark.anyio
async def test_500_concurrent_collaborations_all_succeed_without_leaks(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    limits = ServerLimits(max_concurrent_collaborations=512, max_concurrent_requests=1024)
    async with ScriptedEngine(max_num_seqs=256, num_blocks=8192) as engine:
        app = create_app({"scripted": engine}, limits=limits)
        tasks_before = len(asyncio.all_tasks()) if anyio_backend[0] == "asyncio" else 0
        transport = httpx.ASGITransport(app=app)
        statuses: list[int] = []
        answers: list[str] = []

        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=120
        ) as client:

            async def one(i: int) -> None:
                r = await client.post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": f"Question {i}: yes or no?"}],
                        "max_tokens": 8,
                        "agents": [{"name": "voter", "count": 3}],
                        "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
                    },
                )
                statuses.append(r.status_code)
                if r.status_code == 200:
                    answers.append(r.json()["choices"][0]["message"]["content"])

            async with anyio.create_task_group() as tg:
                for i in range(500):
                    tg.start_soon(one, i)
            metrics = (await client.get("/metrics")).text

        assert statuses == [200] * 500
        assert set(answers) <= {"yes", "no"}
        assert 'microagent:collaborations_total{mode="vote",status="ok"} 500.0' in metrics
        assert "microagent:collaborations_running 0.0" in metrics
        assert 'microagent:engine_requests_running{model_name="scripted"} 0.0' in metrics
        assert not engine.live_requests()
        assert engine.stats().scheduler_running == 0
        assert app.state.microagent.collaborations == 0
        assert app.state.microagent.requests == 0
        if anyio_backend[0] == "asyncio":
            assert len(asyncio.all_tasks()) <= tasks_before
