"""``POST /v1/completions``: plain prompts through the chat route's stages (issue 39).

The real ``openai`` client's ``completions.create``, streamed and not, on the
ScriptedEngine (shapes, refusals) and on the real default model (the text is the
engine's own greedy continuation of the prompt; a repeat reads its prompt from
the prefix cache).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from _engine import RealEngine
from microagent.engine_bridge import Sampling
from microagent.server._completions import DEFAULT_MAX_TOKENS
from test_server_helpers import LiveServer, live_server, real_server, scripted


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted()) as srv:
        yield srv


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _post(srv: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)


def test_a_completion_and_its_stream_carry_the_same_text(server: LiveServer) -> None:
    client = _client(server)
    done = client.completions.create(
        model="scripted", prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    (choice,) = done.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert done.usage is not None and 1 <= done.usage.completion_tokens <= 8
    assert done.usage.prompt_tokens_details is not None
    assert done.usage.prompt_tokens_details.cached_tokens is not None
    chunks = list(
        client.completions.create(
            model="scripted",
            prompt="Once upon a time",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens


def test_the_stream_ends_with_done(server: LiveServer) -> None:
    r = _post(server, {"prompt": "hi", "max_tokens": 3, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert all(json.loads(d)["object"] == "text_completion" for d in data[:-1])


def test_token_ids_and_a_list_of_one_prompt_are_prompts(server: LiveServer) -> None:
    ids = server.engines["scripted"].tokenize("Once upon a time")
    as_text = _post(server, {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
    for prompt in (ids, [ids], ["Once upon a time"]):
        r = _post(server, {"prompt": prompt, "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == as_text.json()["choices"][0]["text"]
        assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_max_tokens_defaults_to_openais_16(server: LiveServer) -> None:
    r = _post(server, {"prompt": "Tell me a long story", "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": 7}, "prompt"),
        ({"n": 0}, "n"),
        ({"temperature": 9.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_what_is_not_supported_is_a_400_naming_the_field(
    server: LiveServer, extra: dict[str, Any], param: str
) -> None:
    r = _post(server, {"prompt": "hi", "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split("[")[0].split(".")[0] == param


def test_no_ops_of_the_refused_fields_are_accepted(server: LiveServer) -> None:
    """LangChain's ``OpenAI`` class sends ``best_of: 1`` and an empty ``logit_bias``."""
    r = _post(
        server,
        {"prompt": "hi", "max_tokens": 4, "echo": False, "best_of": 1, "logit_bias": {}},
    )
    assert r.status_code == 200, r.text


def test_an_unknown_model_is_a_404_the_sdk_raises_as_not_found(server: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        _client(server).completions.create(model="gpt-17", prompt="hi", max_tokens=4)
    assert err.value.body["param"] == "model"  # type: ignore[index]


def test_the_route_is_in_the_openapi_document(server: LiveServer) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    post = doc["paths"]["/v1/completions"]["post"]
    assert {"200", "400", "404"} <= set(post["responses"])


# -- the real default model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def real(real_engine: RealEngine) -> Iterator[LiveServer]:
    with real_server(real_engine) as srv:
        yield srv


@pytest.mark.engine
def test_greedy_text_is_the_engines_own_and_a_repeat_hits_the_cache(
    real: LiveServer, real_engine: RealEngine
) -> None:
    bridge = real_engine.bridge
    facts = " ".join(f"Fact {i}: the river runs north of hill {i}." for i in range(40))
    # longer than a KV block (128 tokens on CPU): a repeat can read whole blocks
    prompt = f"Notes {uuid.uuid4().hex[:8]}. {facts} The capital of France is"
    assert len(bridge.tokenize(prompt)) > 2 * bridge.block_size
    client = _client(real)
    first = client.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0)
    ids = bridge.tokenize(prompt)
    direct = real_engine.call(
        bridge.generate, bridge.handle(ids), Sampling(max_tokens=12, temperature=0)
    )
    assert first.choices[0].text == direct.content
    assert first.usage is not None and first.usage.prompt_tokens == len(ids)
    again = client.completions.create(model="default", prompt=prompt, max_tokens=12, temperature=0)
    assert again.choices[0].text == first.choices[0].text
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    chunks = list(
        client.completions.create(
            model="default", prompt=ids, max_tokens=12, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
    # an id outside the vocabulary is refused before the engine (it failed there: a 500)
    foreign = _post(real, {"prompt": [*ids[:4], 10**6], "max_tokens": 2})
    assert foreign.status_code == 400 and foreign.json()["error"]["param"] == "prompt"
    assert "1000000" in foreign.json()["error"]["message"]
    real_engine.assert_idle()


@pytest.mark.engine
def test_a_seed_is_handled_as_chat_handles_it(real: LiveServer) -> None:
    """Where the engine refuses seeded requests (vLLM's CPU backend), both routes refuse
    with a 400 naming ``seed``; where it honours them, both answer."""
    chat = httpx.post(
        f"{real.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 7},
        timeout=120,
    )
    text = _post(real, {"prompt": "hi", "max_tokens": 4, "seed": 7})
    assert text.status_code == chat.status_code, (text.text, chat.text)
    if chat.status_code == 400:
        assert text.json()["error"]["param"] == chat.json()["error"]["param"] == "seed"
    else:
        again = _post(real, {"prompt": "hi", "max_tokens": 4, "seed": 7, "temperature": 1.0})
        first = _post(real, {"prompt": "hi", "max_tokens": 4, "seed": 7, "temperature": 1.0})
        assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
