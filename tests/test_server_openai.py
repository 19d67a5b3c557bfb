"""The official ``openai`` SDK against a live server serving the real default model.

One shared vLLM engine (tests/_engine.py) runs on its own asyncio loop; the
uvicorn server runs on that same loop, so the bridge is only ever touched there.
Completions are kept short: the CPU is slow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from _engine import RealEngine
from microagent.server import ServerLimits
from test_server_helpers import LiveServer, eventually, live_server

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "Is water wet? Answer yes or no."}]
VOTE = {
    "agents": [{"name": "voter", "count": 3}],
    "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
}
DEBATE = {
    "agents": [{"name": "debater", "count": 2}],
    "collaboration": {"mode": "debate", "rounds": 1},
}


@pytest.fixture(scope="module")
def server(real_engine: RealEngine) -> Iterator[LiveServer]:
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge},
        portal=real_engine.portal,
        open_engines=False,
        limits=ServerLimits(max_concurrent_collaborations=64),
    ) as srv:
        yield srv


def sync_client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_plain_completion_sync(server: LiveServer) -> None:
    client = sync_client(server)
    assert [m.id for m in client.models.list()] == list(server.engines)
    done = client.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert done.choices[0].message.content
    assert done.usage is not None and 1 <= done.usage.completion_tokens <= 8
    assert done.usage.prompt_tokens_details is not None
    assert done.usage.prompt_tokens_details.cached_tokens is not None


def test_plain_completion_stream_sync(server: LiveServer) -> None:
    stream = sync_client(server).chat.completions.create(
        model="default",
        messages=QUESTION,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_vote_sync(server: LiveServer) -> None:
    done = sync_client(server).chat.completions.create(
        model="default",
        messages=QUESTION,
        max_tokens=16,
        extra_body=VOTE,  # type: ignore[arg-type]
    )
    collab: dict[str, Any] = done.model_extra["collaboration"]  # type: ignore[index]
    assert done.choices[0].message.content == collab["answer"]
    assert collab["answer"] in ("yes", "no")
    assert len(collab["agents"]) == 3
    assert done.usage is not None and done.usage.prompt_tokens == collab["usage"]["prompt_tokens"]
    assert done.usage.prompt_tokens_details is not None
    assert done.usage.prompt_tokens_details.cached_tokens == collab["usage"]["cached_tokens"]


def test_debate_streaming_async(server: LiveServer) -> None:
    async def scenario() -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300
        )
        stream = await client.chat.completions.create(
            model="default",
            messages=QUESTION,
            max_tokens=12,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            extra_body=DEBATE,
        )
        events: list[dict[str, Any]] = []
        content = ""
        final: Any = None
        async for chunk in stream:
            extra = chunk.model_extra or {}
            if "collaboration_event" in extra:
                events.append(extra["collaboration_event"])
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                if chunk.choices[0].finish_reason == "stop":
                    final = extra["collaboration"]
        assert final is not None and content == final["answer"]
        assert {"agent_started", "agent_finished", "final"} <= {e["type"] for e in events}
        await client.close()

    anyio.run(scenario)


def test_vote_async_non_stream(server: LiveServer) -> None:
    async def scenario() -> Any:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            return await client.chat.completions.create(
                model="default",
                messages=QUESTION,
                max_tokens=16,
                extra_body=VOTE,  # type: ignore[arg-type]
            )

    done = anyio.run(scenario)
    assert done.choices[0].message.content in ("yes", "no")


def test_bad_input_then_success_on_the_real_engine(server: LiveServer) -> None:
    client = sync_client(server)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "word " * 5000}],
            max_tokens=8,  # type: ignore[arg-type]
        )
    assert info.value.status_code == 400
    assert "allows" in str(info.value) or "max_model_len" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="default", messages=QUESTION, extra_body={**VOTE, "collaboration": {"mode": "x"}}
        )  # type: ignore[arg-type]
    done = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=4)  # type: ignore[arg-type]
    assert done.choices[0].message.content is not None


def test_disconnect_mid_debate_returns_the_engine_to_idle(
    server: LiveServer, real_engine: RealEngine
) -> None:
    body = {
        "model": "default",
        "messages": QUESTION,
        "max_tokens": 200,
        "stream": True,
        "agents": [{"name": "debater", "count": 3}],
        "collaboration": {"mode": "debate", "rounds": 2},
    }

    async def scenario() -> None:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            seen = 0
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"type":"delta"' in line:
                    seen += 1
                if seen >= 2:
                    break
        await eventually(
            lambda: (
                server.metric("microagent_engine_requests_running") == 0
                and not server.state.collaborations
            ),
            5,
        )

    anyio.run(scenario)
    real_engine.assert_idle()


def _context(i: int) -> str:
    facts = " ".join(
        f"Fact {j} of case {i}: the sample {j} was stored in rack {j % 7} at {j * 3} degrees."
        for j in range(18)
    )
    return facts + f"\nQuestion {i}: was sample 3 stored in rack 3? Answer yes or no."


def test_32_concurrent_vote_3_collaborations(server: LiveServer, real_engine: RealEngine) -> None:
    tokens = len(real_engine.bridge.tokenize(_context(0)))
    assert 300 <= tokens <= 520, tokens

    async def scenario() -> list[Any]:
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
            results: list[Any] = []

            async def one(i: int) -> None:
                r = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "default",
                        "messages": [{"role": "user", "content": _context(i)}],
                        "max_tokens": 16,
                        **VOTE,
                    },
                )
                results.append((r.status_code, r.json()))

            with anyio.fail_after(600):
                async with anyio.create_task_group() as tg:
                    for i in range(32):
                        tg.start_soon(one, i)
            return results

    results = anyio.run(scenario)
    assert [status for status, _ in results] == [200] * 32, json.dumps(results[:2])[:2000]
    assert all(body["choices"][0]["message"]["content"] in ("yes", "no") for _, body in results)
    real_engine.assert_idle()


def test_graph_through_the_openai_sdk(server: LiveServer) -> None:
    from test_graph import review_graph

    collaboration = {"mode": "graph", **review_graph(2).to_dict()}
    done = sync_client(server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Write a Python function is_even(n)."}],
        max_tokens=24,
        extra_body={"collaboration": collaboration},
    )
    collab: dict[str, Any] = done.model_extra["collaboration"]  # type: ignore[index]
    assert collab["mode"] == "graph"
    assert done.choices[0].message.content == collab["answer"]
    agents = {a["name"] for a in collab["agents"]}
    assert {"planner", "coder-1", "coder-2", "reviewer", "final"} <= agents
    nodes = collab["details"]["nodes"]
    assert 1 <= nodes["coder"]["iterations"] <= 3
