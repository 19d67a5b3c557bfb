"""Per-request seeds on the real CPU engine, seeded and unseeded requests in flight together.

A seeded prefill split across steps killed vLLM's CPU engine ("CPU Generator does not
use offset"), so seeds were refused. The retaining scheduler now computes a seeded
prefill in one step. Here the step budget is small (256 tokens) and every prompt
nearly fills it: with several requests at once, vLLM would split most prefills.
Through the bridge and through the HTTP server: nothing dies, the same seed gives the
same text, and a seeded prompt longer than the budget is refused by name.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from _engine import _context
from microagent.engine_bridge import (
    GenerationResult,
    KVHandle,
    RequestRefused,
    Sampling,
    VLLMBridge,
)
from test_server_helpers import LiveServer, live_server

pytestmark = pytest.mark.engine

BUDGET = 256  # max_num_batched_tokens: tokens one step computes


@pytest.fixture(scope="module")
def served() -> Iterator[LiveServer]:
    """A server over its own engine with a 256-token step budget (so prefills share steps)."""

    def engines() -> dict[str, VLLMBridge]:
        bridge = VLLMBridge(
            max_num_batched_tokens=BUDGET, max_model_len=1024, max_num_seqs=8, progress=False
        )
        return {bridge.model: bridge}

    with live_server(engines) as srv:
        yield srv


def bridge_of(srv: LiveServer) -> VLLMBridge:
    (bridge,) = srv.engines.values()
    assert isinstance(bridge, VLLMBridge)
    return bridge


def prompt(bridge: VLLMBridge, tokens: int) -> KVHandle:
    """A unique prompt of ``tokens`` to ``tokens + 20`` tokens (its own prefix: no cache hit)."""
    return _context(bridge, tokens, lambda h: len(h) <= tokens + 20)


def test_seeded_and_unseeded_prefills_share_the_engine_and_seeds_repeat(
    served: LiveServer,
) -> None:
    bridge = bridge_of(served)
    assert bridge.max_num_batched_tokens == BUDGET
    seeded = [prompt(bridge, 200) for _ in range(3)]
    unseeded = [prompt(bridge, 210) for _ in range(4)]
    sample = Sampling(max_tokens=12, temperature=1.0)

    async def together(seeds: list[int]) -> list[GenerationResult]:
        runs = [bridge.generate(p, sample) for p in unseeded]  # more than a step's worth
        runs += [
            bridge.generate(p, Sampling(max_tokens=12, temperature=1.0, seed=s))
            for p, s in zip(seeded, seeds, strict=True)
        ]
        return list(await asyncio.gather(*runs))

    epoch, restarts = bridge.epoch, bridge.restarts
    first = served.portal.call(together, [11, 12, 13])
    again = served.portal.call(together, [11, 12, 13])
    other = served.portal.call(together, [21, 22, 23])
    assert (bridge.epoch, bridge.restarts) == (epoch, restarts)  # the engine never died
    assert not bridge.engine.errored
    for result in first + again + other:
        assert result.finish_reason in ("stop", "length"), result
        assert result.completion_tokens > 0
    n = len(unseeded)
    texts = [r.content for r in first[n:]]
    assert [r.content for r in again[n:]] == texts  # the same seed, the same text
    assert [r.content for r in other[n:]] != texts  # other seeds sample otherwise
    assert len(set(texts)) == len(texts)


def test_a_seeded_prompt_longer_than_a_step_is_refused_by_name(served: LiveServer) -> None:
    bridge = bridge_of(served)
    long = prompt(bridge, BUDGET + 1)
    with pytest.raises(RequestRefused) as refused:
        bridge.stream(long, Sampling(max_tokens=4, temperature=1.0, seed=1))
    assert refused.value.field == "seed"
    assert f"{len(long)} prompt tokens" in str(refused.value)
    assert f"max_num_batched_tokens={BUDGET}" in str(refused.value)
    # without a seed the same prompt is served (chunked across steps, as vLLM does)
    plain = served.portal.call(bridge.generate, long, Sampling(max_tokens=4, temperature=1.0))
    assert plain.finish_reason in ("stop", "length")


def _complete(srv: LiveServer, body: dict[str, Any]) -> httpx.Response:
    model = bridge_of(srv).model
    return httpx.post(f"{srv.url}/v1/completions", json={"model": model, **body}, timeout=300)


def test_seeds_over_http_with_unseeded_requests_in_flight(served: LiveServer) -> None:
    bridge = bridge_of(served)

    def text(tokens: int) -> str:
        """A unique prompt of ``tokens`` tokens or a few more."""
        nonce = uuid.uuid4().hex[:8]
        words: list[str] = []
        while len(bridge.tokenize(body := f"Stock {nonce}: {' '.join(words)}.")) < tokens:
            words.append(f"crate{len(words) % 37}")
        return body

    seeded = [text(200), text(180)]
    bodies = [{"prompt": text(220), "max_tokens": 10, "temperature": 1.0} for _ in range(4)]
    bodies += [
        {"prompt": p, "max_tokens": 10, "temperature": 1.0, "seed": 5} for p in seeded + seeded
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: _complete(served, b), bodies))
    assert [r.status_code for r in replies] == [200] * len(bodies), [r.text for r in replies]
    texts = [r.json()["choices"][0]["text"] for r in replies[4:]]
    assert texts[:2] == texts[2:]  # each seeded prompt twice, in flight together: same text
    assert not bridge.engine.errored and bridge.restarts == 0

    too_long = text(BUDGET + 60)
    n = len(bridge.tokenize(too_long))
    assert n > BUDGET
    refused = _complete(served, {"prompt": too_long, "max_tokens": 4, "seed": 5})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "seed"
    assert "max_num_batched_tokens" in error["message"] and "prompt tokens" in error["message"]
    chat = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={
            "model": bridge.model,
            "messages": [{"role": "user", "content": seeded[0]}],
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": 9,
        },
        timeout=300,
    )
    assert chat.status_code == 200, chat.text
