"""Stored responses: ``store``, ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``.

The store's bounds (per-key count, total bytes, TTL) are checked on the store with a
fake clock; the routes on a live server over the ScriptedEngine with two API keys
(isolation, refusals, chaining with tool calls, streaming); and one real-engine
conversation through the openai SDK checks that a chained turn reads the previous
turns' KV and that the history kept the tool call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from microagent.engine_bridge import EngineRequest
from microagent.server import StoreSettings
from microagent.server._response_store import ResponseStore
from test_server_helpers import LiveServer, live_server, real_server

KEYS = ["alpha-key", "beta-key"]
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
WORDS = " ".join(["token"] * 60)


class Clock:
    """A fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _response(n: int, text: str = "x") -> dict[str, Any]:
    return {"id": f"resp_{n:032x}", "object": "response", "output": [], "text": text}


# -- the store ---------------------------------------------------------------------------------
def test_each_key_keeps_at_most_its_count_and_drops_its_oldest() -> None:
    store = ResponseStore(StoreSettings(max_per_key=2))
    for n in range(3):
        assert store.put("a", _response(n), [], "c")
    store.put("b", _response(10), [], "c")
    assert store.get("a", _response(0)["id"]) is None  # a's oldest went
    assert store.get("a", _response(1)["id"]) is not None
    assert store.get("a", _response(2)["id"]) is not None
    assert store.get("b", _response(10)["id"]) is not None  # b's untouched by a's count


def test_the_byte_cap_drops_the_oldest_of_any_key_and_refuses_a_too_big_one() -> None:
    one = len(json.dumps([_response(0, "y" * 100), []], separators=(",", ":")).encode())
    store = ResponseStore(StoreSettings(max_bytes=2 * one))
    assert store.put("a", _response(0, "y" * 100), [], "c")
    assert store.put("b", _response(1, "y" * 100), [], "c")
    assert store.bytes == 2 * one
    assert store.put("b", _response(2, "y" * 100), [], "c")
    assert store.get("a", _response(0)["id"]) is None  # the oldest, another key's
    assert store.bytes <= 2 * one and len(store) == 2
    assert not store.put("a", _response(3, "y" * (3 * one)), [], "c")  # larger than the cap
    assert store.get("a", _response(3)["id"]) is None and len(store) == 2


def test_a_response_lives_its_ttl_and_another_key_never_finds_it() -> None:
    clock = Clock()
    store = ResponseStore(StoreSettings(ttl=60.0), clock=clock)
    store.put("a", _response(0), [{"type": "message", "role": "user", "content": "hi"}], "c")
    rid = _response(0)["id"]
    assert store.get("b", rid) is None and not store.delete("b", rid)
    clock.now += 59
    found = store.get("a", rid)
    assert found is not None and found.conversation[0]["content"] == "hi"
    clock.now += 2
    assert store.get("a", rid) is None and store.bytes == 0 and len(store) == 0


def test_settings_refuse_nonsense() -> None:
    for bad in ({"ttl": 0}, {"max_per_key": 0}, {"max_bytes": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StoreSettings(**bad)  # type: ignore[arg-type]


# -- the routes (ScriptedEngine) ---------------------------------------------------------------
def _script(ids: Any, request: EngineRequest) -> str | None:
    schema = request.sampling.json_schema
    if schema is not None and "get_weather" in schema:
        return '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    if "explode" in request.prompt.text:
        raise RuntimeError("scripted failure")
    return "It is sunny in Paris today."


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    from microagent.testing import ScriptedEngine

    engines = lambda: {"scripted": ScriptedEngine(script=_script, num_blocks=256)}  # noqa: E731
    with live_server(engines, api_key=KEYS) as srv:
        yield srv


def client(srv: LiveServer, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0)


def prompt(srv: LiveServer) -> str:
    from microagent.testing import ScriptedEngine

    bridge = srv.engines["scripted"]
    assert isinstance(bridge, ScriptedEngine)
    return str(bridge.history[-1].prompt.text)


def output(call_id: str, text: str) -> Any:
    """A ``function_call_output`` input item."""
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def call(srv: LiveServer, method: str, path: str, key: str = KEYS[0], **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.request(method, f"{srv.url}{path}", headers=headers, timeout=30, **kw)


def test_a_stored_response_is_retrieved_and_deleted_by_its_key_only(server: LiveServer) -> None:
    api = client(server)
    done = api.responses.create(model="scripted", input="Weather?")
    assert done.to_dict()["store"] is True
    again = api.responses.retrieve(done.id)
    assert again.id == done.id and again.output_text == done.output_text
    other = call(server, "GET", f"/v1/responses/{done.id}", KEYS[1])
    assert other.status_code == 404 and "sunny" not in other.text
    assert other.json()["error"]["param"] == "response_id"
    assert call(server, "DELETE", f"/v1/responses/{done.id}", KEYS[1]).status_code == 404
    chained = call(
        server,
        "POST",
        "/v1/responses",
        KEYS[1],
        json={"model": "scripted", "input": "more", "previous_response_id": done.id},
    )
    assert chained.status_code == 400, chained.text
    assert chained.json()["error"]["code"] == "previous_response_not_found"
    assert chained.json()["error"]["param"] == "previous_response_id"
    gone = call(server, "DELETE", f"/v1/responses/{done.id}")
    assert gone.status_code == 200 and gone.json() == {
        "id": done.id,
        "object": "response.deleted",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(done.id)


def test_store_false_is_neither_retrievable_nor_chainable(server: LiveServer) -> None:
    api = client(server)
    done = api.responses.create(model="scripted", input="Weather?", store=False)
    assert done.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(done.id)
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.create(model="scripted", input="more", previous_response_id=done.id)
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert refused.value.body["code"] == "previous_response_not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("GET", "/v1/responses/resp_nope", None, 400, "response_id"),
        ("DELETE", "/v1/responses/" + "a" * 300, None, 400, "response_id"),
        ("GET", f"/v1/responses/resp_{'0' * 32}", None, 404, "response_id"),
        ("POST", "/v1/responses", {"previous_response_id": "resp_1"}, 400, "previous_response_id"),
        ("POST", "/v1/responses", {"previous_response_id": "x" * 65}, 400, "previous_response_id"),
        ("POST", "/v1/responses", {"previous_response_id": 7}, 400, "previous_response_id"),
        ("POST", "/v1/responses", {"store": "yes"}, 400, "store"),
        ("POST", "/v1/responses", {"conversation": "conv_1"}, 400, "conversation"),
    ],
)
def test_bad_ids_get_an_error_naming_the_field(
    server: LiveServer,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
    param: str,
) -> None:
    payload = None if body is None else {"model": "scripted", "input": "hi", **body}
    r = call(server, method, path, json=payload)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert len(r.text) < 1000  # a hostile id is not echoed whole


def test_a_chain_keeps_tool_calls_and_their_outputs_and_reads_the_earlier_turns(
    server: LiveServer,
) -> None:
    api = client(server)
    first = api.responses.create(
        model="scripted",
        instructions="Be brief.",
        input=f"Weather in Paris? {WORDS}",
        tools=[WEATHER],
        tool_choice="required",
    )
    (fc,) = [item for item in first.output if item.type == "function_call"]
    second = api.responses.create(
        model="scripted",
        instructions="Be brief.",
        previous_response_id=first.id,
        input=[output(fc.call_id, "22 C, sunny")],
        tools=[WEATHER],
    )
    assert second.previous_response_id == first.id
    text = prompt(server)
    assert text.index("Weather in Paris?") < text.rindex('"get_weather"') < text.index("22 C")
    assert text.count("Be brief.") == 1  # this request's instructions, not the previous ones too
    third = api.responses.create(
        model="scripted", previous_response_id=second.id, input="Thanks! Warm?"
    )
    text = prompt(server)
    assert "Be brief." not in text  # instructions are not carried over (as OpenAI)
    assert text.index("22 C") < text.index("It is sunny in Paris") < text.index("Thanks! Warm?")
    assert third.previous_response_id == second.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    block = 16
    assert second.usage.input_tokens_details.cached_tokens >= (
        first.usage.input_tokens // block * block
    )


def test_a_streamed_response_is_stored_and_chains(server: LiveServer) -> None:
    api = client(server)
    with api.responses.stream(model="scripted", input="Weather? streamed") as stream:
        list(stream)
        final = stream.get_final_response()
    stored = api.responses.retrieve(final.id)
    assert stored.output_text == final.output_text == "It is sunny in Paris today."
    assert stored.usage is not None and stored.usage.total_tokens > 0
    with api.responses.stream(
        model="scripted", input="and tomorrow?", previous_response_id=final.id
    ) as stream:
        list(stream)
        second = stream.get_final_response()
    assert "Weather? streamed" in prompt(server) and second.previous_response_id == final.id
    assert api.responses.retrieve(second.id).id == second.id


def test_a_failed_response_is_not_stored(server: LiveServer) -> None:
    store = server.app.state.responses
    assert isinstance(store, ResponseStore)
    before = len(store)
    r = call(server, "POST", "/v1/responses", json={"model": "scripted", "input": "explode"})
    assert r.status_code >= 500, r.text
    assert len(store) == before
    events = call(
        server,
        "POST",
        "/v1/responses",
        json={"model": "scripted", "input": "explode", "stream": True},
    )
    assert '"error"' in events.text and "response.completed" not in events.text
    assert len(store) == before


def test_the_routes_are_in_the_openapi_document(server: LiveServer) -> None:
    document = call(server, "GET", "/openapi.json").json()
    item = document["paths"]["/v1/responses/{response_id}"]
    assert {"get", "delete"} <= set(item)
    assert "404" in item["get"]["responses"]


# -- the real engine ---------------------------------------------------------------------------
@pytest.mark.engine
def test_a_three_turn_conversation_with_a_tool_call_reads_its_earlier_turns_kv(
    real_engine: Any,
) -> None:
    bridge = real_engine.bridge
    block = bridge.block_size
    facts = " ".join(f"Note {i}: station {i} reports the weather hourly." for i in range(30))
    instructions = f"You are a weather assistant. {facts}"
    with real_server(real_engine) as srv:
        api = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        common: dict[str, Any] = {
            "model": bridge.model,
            "instructions": instructions,
            "tools": [WEATHER],
            "temperature": 0,
            "max_output_tokens": 48,
        }
        one = api.responses.create(
            input="What is the weather in Paris?", tool_choice="required", **common
        )
        (fc,) = [item for item in one.output if item.type == "function_call"][:1]
        two = api.responses.create(
            previous_response_id=one.id,
            input=[output(fc.call_id, "22 C")],
            **common,
        )
        three = api.responses.create(
            previous_response_id=two.id, input="Is that warm? One word.", **common
        )
    real_engine.assert_idle()
    u1, u2, u3 = one.usage, two.usage, three.usage
    assert u1 is not None and u2 is not None and u3 is not None
    print(
        f"input tokens {[u.input_tokens for u in (u1, u2, u3)]}, cached "
        f"{[u.input_tokens_details.cached_tokens for u in (u1, u2, u3)]}, block {block}"
    )
    assert u1.input_tokens > 2 * block
    # the history held the call: turn 2's prompt is turn 1's plus at least the call's tokens
    call_tokens = len(bridge.tokenize(fc.name + fc.arguments))
    assert u2.input_tokens >= u1.input_tokens + call_tokens
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens // block * block
    assert u3.input_tokens_details.cached_tokens >= u2.input_tokens // block * block
