"""Honoured parameters do what they say on the real engine, not only reach SamplingParams.

``tests/test_params.py`` checks that each parameter reaches the engine; these
check its effect on vLLM itself (the shared engine): priority order under
saturation, ``stop``, the penalties, ``top_logprobs`` and ``seed`` on the CPU
backend.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio
import pytest
from _engine import RealEngine
from microagent.engine_bridge import GenerationResult, Sampling

pytestmark = pytest.mark.engine

COUNT = "Count from 1 to 20, separated by commas: 1, 2, 3,"


def _prompt(engine: RealEngine, text: str) -> Any:
    # a nonce first: no cached prefix shared with another test
    return engine.bridge.chat.prompt([{"role": "user", "content": f"({uuid.uuid4().hex}) {text}"}])


def test_a_later_high_priority_request_runs_before_earlier_waiting_ones(
    real_engine: RealEngine,
) -> None:
    """The engine saturated (more requests than ``max_num_seqs``, all priority 5), then one at
    priority -5: it gets its first token before every earlier request that was still
    waiting when it came, which under first come, first served would all go first."""
    b = real_engine.bridge
    lows = b.max_num_seqs + 6
    firsts: dict[str, float] = {}

    async def run() -> tuple[float, dict[int, float | None], float]:
        batch_running = anyio.Event()

        async def one(key: str, priority: int) -> GenerationResult:
            def seen(delta: Any) -> None:
                if delta.token_ids and key not in firsts:
                    firsts[key] = time.monotonic()
                    if len(firsts) >= b.max_num_seqs:  # a full batch runs, the rest wait
                        batch_running.set()

            return await b.generate(
                _prompt(real_engine, COUNT), Sampling(max_tokens=24), priority=priority,
                on_delta=seen,
            )  # fmt: skip

        async with anyio.create_task_group() as tg:
            for i in range(lows):
                tg.start_soon(one, f"low{i}", 5)
            with anyio.fail_after(120):
                await batch_running.wait()
            submitted = time.monotonic()
            waiting_at = {i: firsts.get(f"low{i}") for i in range(lows)}
            tg.start_soon(one, "high", -5)
        return submitted, waiting_at, firsts["high"]

    submitted, before, high = real_engine.call(run)
    waiting = [i for i, first in before.items() if first is None]
    assert waiting, "every request was running already: the engine was not saturated"
    assert all(firsts[f"low{i}"] > high for i in waiting), (high - submitted, firsts)
    real_engine.assert_idle()


def test_stop_ends_the_reply_before_the_string(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    # no nonce: greedy is deterministic whether or not the prefix is cached, and a random
    # nonce can make the model echo it first (CI saw "(dbef82e0…) 1, 2, 3," at 40 tokens)
    prompt = b.chat.prompt([{"role": "user", "content": COUNT}])
    free = real_engine.call(b.generate, prompt, Sampling(max_tokens=40))
    assert " 7," in free.text, free.text  # greedy counts on past 7
    stopped = real_engine.call(b.generate, prompt, Sampling(max_tokens=40, stop=(" 7,",)))
    assert stopped.finish_reason == "stop" and " 7," not in stopped.text
    assert free.text.startswith(stopped.text) and len(stopped.text) < len(free.text)


def test_penalties_make_a_reply_repeat_itself_less(real_engine: RealEngine) -> None:
    """Greedy replies that repeat: with a frequency and a presence penalty, more of their
    tokens are distinct (measured over three prompts)."""
    b = real_engine.bridge
    prompts = [
        "Write the word cat twenty times: cat cat cat",
        "Repeat after me, many times: hello hello hello",
        "List the number one again and again: one, one, one,",
    ]

    def distinct(**penalty: float) -> float:
        ratios = []
        for text in prompts:  # no nonce: greedy replies to the same prompts, cache or not
            prompt = b.chat.prompt([{"role": "user", "content": text}])
            r = real_engine.call(b.generate, prompt, Sampling(max_tokens=32, **penalty))
            ratios.append(len(set(r.output_ids)) / max(1, len(r.output_ids)))
        return sum(ratios) / len(ratios)

    plain = distinct()  # measured here: 0.43 (the first prompt repeats one token: 0.06)
    assert distinct(frequency_penalty=2.0) > plain + 0.2  # 0.76
    assert distinct(presence_penalty=2.0) > plain + 0.05  # 0.53


def test_top_logprobs_gives_that_many_alternatives_per_token(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    r = real_engine.call(
        b.generate, _prompt(real_engine, "Name a colour."), Sampling(max_tokens=6, logprobs=4)
    )
    assert r.logprobs is not None and len(r.logprobs) == r.completion_tokens
    for entry in r.logprobs:
        assert len(entry.top) == 4 and entry.logprob <= 0.0
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True)
    # greedy: every sampled token is as likely as the most likely one (ties and float32
    # noise between batch shapes may order equals either way)
    assert all(entry.logprob >= entry.top[0][1] - 1e-3 for entry in r.logprobs)


def test_a_seed_repeats_its_sample_on_the_cpu_backend(real_engine: RealEngine) -> None:
    """The docs: a per-request seed makes a sampled reply reproducible on vLLM's CPU backend
    too (its prefill is computed in one step, see ``tests/test_seeded_real.py``)."""
    b = real_engine.bridge
    prompt = _prompt(real_engine, "Invent a name for a cat.")
    seeded = Sampling(max_tokens=8, temperature=1.0, seed=7)
    first = real_engine.call(b.generate, prompt, seeded)
    again = real_engine.call(b.generate, prompt, seeded)
    assert first.finish_reason in ("stop", "length") and first.completion_tokens > 0
    assert again.content == first.content
    real_engine.assert_idle()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
        },
    },
}


def _chat(srv: Any, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    import httpx

    body = {
        "model": model,
        "messages": messages,
        "tools": [WEATHER],
        "tool_choice": "auto",
        "max_tokens": 48,
        "temperature": 0.0,
    }
    response = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json()["choices"][0])


def test_tool_choice_auto_generates_a_call_when_asked_and_text_when_not(
    real_engine: RealEngine,
) -> None:
    """The ``auto`` path (vLLM's structural tags) generating on the real model: after two
    worked examples (with one, the 135M model writes a tool response itself), a weather
    question gets a call valid against the schema; a greeting gets plain text, no call."""
    import json

    from test_server_helpers import live_server

    def worked(i: int, city: str) -> list[dict[str, Any]]:
        call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        return [
            {"role": "user", "content": f"Weather in {city}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{i}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"Sunny in {city}."},
            {"role": "assistant", "content": "Sunny."},
        ]

    example = [*worked(1, "Paris"), *worked(2, "Oslo")]
    bridge = real_engine.bridge
    with live_server(lambda: {bridge.model: bridge}, portal=real_engine.portal,
                     open_engines=False) as srv:  # fmt: skip
        called = _chat(
            srv,
            bridge.model,
            [*example, {"role": "user", "content": "Weather in Rome?"}],
        )
        greeted = _chat(
            srv, bridge.model, [{"role": "user", "content": "Say hello to me in one sentence."}]
        )
    calls = called["message"].get("tool_calls") or []
    assert called["finish_reason"] == "tool_calls" and len(calls) == 1, called
    assert calls[0]["function"]["name"] == "get_weather"
    city = json.loads(calls[0]["function"]["arguments"])["city"]
    assert isinstance(city, str) and 0 < len(city) <= 40
    assert not greeted["message"].get("tool_calls") and greeted["finish_reason"] in (
        "stop",
        "length",
    )
    assert greeted["message"]["content"]
    real_engine.assert_idle()
