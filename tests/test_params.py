"""Every parameter of the openai SDK's ``chat.completions.create`` is honoured or refused.

The list of parameters is read from the installed SDK, so a parameter that a
new SDK adds fails this test until the server decides what to do with it.
Honoured parameters are checked for their effect (on the response, or on the
request the ScriptedEngine received): none only for a 200. Identification
parameters are honoured by changing nothing, which is checked too: the engine
receives exactly what it receives without them. Refused ones get a 400 naming them.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from microagent.server._schemas import REFUSED_PARAMETERS
from microagent.testing import ScriptedEngine
from openai.resources.chat.completions import Completions
from test_server_helpers import LiveServer, live_server, scripted

USER = [{"role": "user", "content": "Say something."}]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}

Check = Callable[[dict[str, Any], ScriptedEngine], None]


def _sampling(name: str, value: Any) -> Check:
    def check(_: dict[str, Any], engine: ScriptedEngine) -> None:
        assert getattr(engine.history[-1].sampling, name) == value

    return check


def _content(predicate: Callable[[str], bool]) -> Check:
    def check(body: dict[str, Any], _: ScriptedEngine) -> None:
        assert predicate(body["choices"][0]["message"]["content"])

    return check


def _logprobs(top: int) -> Check:
    def check(body: dict[str, Any], _: ScriptedEngine) -> None:
        content = body["choices"][0]["logprobs"]["content"]
        assert content
        text = "".join(entry["token"] for entry in content)
        assert text == body["choices"][0]["message"]["content"]
        for entry in content:
            assert len(entry["top_logprobs"]) == top
            assert sum(math.exp(t["logprob"]) for t in entry["top_logprobs"]) <= 1.0 + 1e-9

    return check


def _prompt_holds(text: str) -> Check:
    def check(_: dict[str, Any], engine: ScriptedEngine) -> None:
        assert text in engine.detokenize(engine.history[-1].prompt.token_ids)

    return check


def _tool_offered(body: dict[str, Any], engine: ScriptedEngine) -> None:
    """The tool is described in the prompt and the reply may call it (a tagged constraint)."""
    _prompt_holds('"name": "lookup"')(body, engine)
    assert engine.history[-1].sampling.tagged is not None


def _call_required(_: dict[str, Any], engine: ScriptedEngine) -> None:
    """The whole reply is constrained to a call (a JSON schema naming the function)."""
    schema = engine.history[-1].sampling.json_schema
    assert schema is not None and "lookup" in schema


def _one_call(_: dict[str, Any], engine: ScriptedEngine) -> None:
    """``parallel_tool_calls: false``: generation stops at the end of the first call."""
    assert engine.history[-1].sampling.stop[-1:] == ("</tool_call>",)


def _completion_object(body: dict[str, Any], _: ScriptedEngine) -> None:
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]


def _streamed(body: dict[str, Any], _: ScriptedEngine) -> None:
    chunks = body["chunks"]
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])


def _usage_chunk(body: dict[str, Any], _: ScriptedEngine) -> None:
    last = body["chunks"][-2]
    assert last["choices"] == [] and last["usage"]["total_tokens"] > 0


def _unchanged(_: dict[str, Any], __: ScriptedEngine) -> None:
    """Marker: the engine must receive what it receives without the parameter."""
    raise AssertionError("compared in the test itself")


def _json_valid(body: dict[str, Any], _: ScriptedEngine) -> None:
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)


def _retained_for(seconds: float) -> Check:
    """The request's turn was retained for ``seconds`` (the session's next turn hits it)."""

    def check(_: dict[str, Any], engine: ScriptedEngine) -> None:
        retain = engine.history[-1].retain
        assert retain is not None and retain.ttl == seconds, retain

    return check


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
#: parameter -> (a value to send, how its effect is checked); refused ones are in REFUSED
HONOURED: dict[str, tuple[Any, Check]] = {
    "messages": (USER, _prompt_holds("Say something.")),
    "model": ("scripted", lambda body, _: None if body["model"] == "scripted" else 1 / 0),
    "frequency_penalty": (0.5, _sampling("frequency_penalty", 0.5)),
    "presence_penalty": (-0.5, _sampling("presence_penalty", -0.5)),
    "logprobs": (True, _sampling("logprobs", 0)),
    "top_logprobs": (3, _logprobs(3)),
    "max_completion_tokens": (3, _sampling("max_tokens", 3)),
    "max_tokens": (5, _sampling("max_tokens", 5)),
    "n": (2, lambda body, _: None if len(body["choices"]) == 2 else 1 / 0),
    "response_format": (
        {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}},
        _json_valid,
    ),
    "seed": (7, _sampling("seed", 7)),
    "stop": (["."], _sampling("stop", (".",))),
    "stream": (True, _streamed),
    "stream_options": ({"include_usage": True}, _usage_chunk),
    "temperature": (0.3, _sampling("temperature", 0.3)),
    "top_p": (0.9, _sampling("top_p", 0.9)),
    "tools": (TOOLS, _tool_offered),  # test_tools.py goes on
    "tool_choice": ("required", _call_required),
    "parallel_tool_calls": (False, _one_call),
    # identification: accepted, changes nothing the engine receives
    "user": ("user-1", _unchanged),
    "metadata": ({"team": "a"}, _unchanged),
    "safety_identifier": ("hash-1", _unchanged),
    "prompt_cache_key": ("key-1", _retained_for(1800.0)),
    "prompt_cache_options": ({"ttl": "90s"}, _retained_for(90.0)),
    "prompt_cache_retention": ("24h", _retained_for(86400.0)),
    "store": (False, _unchanged),
    "service_tier": ("auto", _unchanged),
}
#: what a parameter needs beside it to take effect
EXTRA: dict[str, dict[str, Any]] = {
    "top_logprobs": {"logprobs": True},
    "tool_choice": {"tools": TOOLS},
    "parallel_tool_calls": {"tools": TOOLS},
    "stream_options": {"stream": True},
}
#: the SDK's transport options, not request parameters
TRANSPORT = {"extra_headers", "extra_query", "extra_body", "timeout"}
REFUSED: dict[str, Any] = {name: {"x": 1} for name in REFUSED_PARAMETERS}
REFUSED["modalities"] = ["text", "audio"]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted()) as srv:
        yield srv


def post(srv: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)


def test_every_sdk_parameter_is_classified() -> None:
    params = set(inspect.signature(Completions.create).parameters) - {"self"} - TRANSPORT
    unclassified = params - set(HONOURED) - set(REFUSED)
    assert not unclassified, f"decide what the server does with {sorted(unclassified)}"


def received(engine: ScriptedEngine) -> tuple[tuple[int, ...], Any]:
    """The prompt and sampling of the engine's latest request."""
    last = engine.history[-1]
    return last.prompt.token_ids, last.sampling


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_honoured_parameter_takes_effect(server: LiveServer, name: str) -> None:
    value, check = HONOURED[name]
    engine: ScriptedEngine = server.engines["scripted"]  # type: ignore[assignment]
    body: dict[str, Any] = {"model": "scripted", "messages": USER, "max_tokens": 64}
    body.update(EXTRA.get(name, {}))
    if check is _unchanged:  # what the engine receives without it
        assert post(server, body).status_code == 200
        without = received(engine)
    body[name] = value
    if body.get("stream"):
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        chunks = [line if line == "[DONE]" else json.loads(line) for line in lines]
        check({"chunks": chunks}, engine)
        return
    r = post(server, body)
    assert r.status_code == 200, r.text
    if check is _unchanged:
        assert received(engine) == without
        return
    check(r.json(), engine)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_parameter_is_a_400_naming_it(server: LiveServer, name: str) -> None:
    r = post(server, {"messages": USER, name: REFUSED[name]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and name in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"store": True}, "store"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": 5}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"top_k": 0}, "top_k"),
        ({"frequency_penalty": 3.0}, None),
        ({"unknown_thing": 1}, "unknown_thing"),
    ],
)
def test_bad_parameter_values_are_400(
    server: LiveServer, extra: dict[str, Any], param: str | None
) -> None:
    r = post(server, {"messages": USER, **extra})
    assert r.status_code == 400, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


def test_null_means_not_given(server: LiveServer) -> None:
    r = post(server, {"messages": USER, "max_tokens": 4, "logit_bias": None, "audio": None})
    assert r.status_code == 200, r.text


def test_json_object_reply_is_a_json_object(server: LiveServer) -> None:
    r = post(server, {"messages": USER, "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)


def test_vllm_extra_sampling_fields_reach_the_engine(server: LiveServer) -> None:
    r = post(
        server,
        {"messages": USER, "max_tokens": 4, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2},
    )
    assert r.status_code == 200, r.text
    sampling = server.engines["scripted"].history[-1].sampling  # type: ignore[attr-defined]
    assert (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (5, 0.1, 1.2)


@pytest.mark.parametrize("name", ["logprobs", "response_format", "top_k"])
def test_plain_only_parameters_are_refused_with_agents(server: LiveServer, name: str) -> None:
    value = {"logprobs": True, "response_format": {"type": "json_object"}, "top_k": 3}[name]
    body = {
        "messages": USER,
        name: value,
        "agents": [{"name": "a", "count": 2}],
        "collaboration": {"mode": "vote"},
    }
    r = post(server, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == name


def test_streamed_logprobs_cover_the_streamed_text(server: LiveServer) -> None:
    body = {"messages": USER, "max_tokens": 8, "stream": True, "logprobs": True, "top_logprobs": 2}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    text, tokens = "", ""
    for line in lines[:-1]:
        choice = json.loads(line)["choices"][0]
        text += choice["delta"].get("content") or ""
        for entry in (choice.get("logprobs") or {}).get("content", ()):
            tokens += entry["token"]
            assert len(entry["top_logprobs"]) == 2
    assert text and tokens == text
