"""``POST /tokenize`` and ``POST /detokenize`` in ``vllm serve``'s shapes (issue 39).

Round trips on the ScriptedEngine and on the real default model: a prompt's ids
detokenize to the prompt, a conversation's ids are the prompt a chat completion
reads (its ``usage.prompt_tokens``), and oversized or foreign input is a 400
naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _engine import RealEngine
from microagent.server._tokens import MAX_DETOKENIZE_TOKENS
from test_server_helpers import LiveServer, live_server, real_server, scripted

TEXT = "The quick brown fox jumps over the lazy dog."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted()) as srv:
        yield srv


def _post(srv: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=120)


def _round_trip(srv: LiveServer, model: str) -> None:
    tok = _post(srv, "/tokenize", {"model": model, "prompt": TEXT})
    assert tok.status_code == 200, tok.text
    body = tok.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["tokens"] == srv.engines[model].tokenize(TEXT)
    back = _post(srv, "/detokenize", {"model": model, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": TEXT}


def test_a_prompt_round_trips(server: LiveServer) -> None:
    _round_trip(server, "scripted")
    assert _post(server, "/tokenize", {"prompt": TEXT}).json()["max_model_len"] is None


def test_messages_are_the_prompt_a_chat_completion_reads(server: LiveServer) -> None:
    ids = _post(server, "/tokenize", {"messages": MESSAGES}).json()
    chat = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}
    ).json()
    assert ids["count"] == chat["usage"]["prompt_tokens"]
    bare = _post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert bare.json()["count"] < ids["count"]  # without the assistant's turn open
    assert ids["tokens"][: bare.json()["count"]] == bare.json()["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": True}, "add_special_tokens"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ("/tokenize", {"prompt": "a", "extra": 1}, "extra"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
        ("/detokenize", {"tokens": [0] * (MAX_DETOKENIZE_TOKENS + 1)}, "tokens"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: LiveServer, path: str, body: dict[str, Any], param: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split("[")[0].split(".")[0] == param


def test_an_unknown_model_is_a_404(server: LiveServer) -> None:
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
        r = _post(server, path, {"model": "gpt-17", **body})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"


@pytest.fixture(scope="module")
def real(real_engine: RealEngine) -> Iterator[LiveServer]:
    with real_server(real_engine) as srv:
        yield srv


@pytest.mark.engine
def test_round_trips_on_the_real_model_and_refuses_foreign_ids(real: LiveServer) -> None:
    model = next(iter(real.engines))
    _round_trip(real, model)
    tok = _post(real, "/tokenize", {"messages": MESSAGES}).json()
    assert tok["max_model_len"] == real.engines[model].max_model_len  # type: ignore[attr-defined]
    text = _post(real, "/detokenize", {"tokens": tok["tokens"]}).json()["prompt"]
    assert "Name a colour." in text and "You are terse." in text
    r = _post(real, "/detokenize", {"tokens": [1, 10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens[1]"
