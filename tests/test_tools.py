"""Function calling (engine_bridge/_tool_calls.py, server/_tools.py): plans, parsing, the API.

The API tests run the official ``openai`` SDK against a live server on the
ScriptedEngine, whose replies under a JSON constraint are valid documents of
the schema (``example_instance``); the real-engine counterparts, with the
default model, are in ``test_server_openai.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from microagent.engine_bridge import RequestRefused, Sampling, ToolCallStream, render_tool_calls
from microagent.engine_bridge._tool_calls import (
    ARGUMENT_STRING_LENGTH,
    CALL_CLOSE,
    CALL_OPEN,
    MAX_PARALLEL_CALLS,
    string_bound,
)
from microagent.server import ApiError
from microagent.server._tools import tool_plan
from test_server_helpers import LiveServer, live_server, scripted

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}  # type: ignore[index]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


# -- plans --------------------------------------------------------------------------------------


def test_required_constrains_the_whole_reply_to_one_call_or_an_array_when_asked() -> None:
    plan = tool_plan([WEATHER, ADD], "required", None)
    assert plan is not None and plan.active and plan.whole_reply and plan.parallel is None
    one = json.loads(plan.constrain(Sampling()).json_schema or "")
    jsonschema.validate({"name": "add", "arguments": {"a": 1, "b": 2}}, one)
    with pytest.raises(jsonschema.ValidationError):  # not an array unless the client asks
        jsonschema.validate([{"name": "add", "arguments": {"a": 1, "b": 2}}], one)
    parallel = tool_plan([WEATHER, ADD], "required", True)
    assert parallel is not None
    schema = json.loads(parallel.constrain(Sampling()).json_schema or "")
    assert schema["type"] == "array" and schema["maxItems"] == MAX_PARALLEL_CALLS
    good = [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):  # a call with another function's arguments
        jsonschema.validate([{"name": "add", "arguments": {"city": "x"}}], schema)


def test_free_string_arguments_are_bounded_and_the_clients_bounds_kept() -> None:
    params = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "note": {"type": ["string", "null"], "maxLength": 500},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    plan = tool_plan([tool], "required", None)
    assert plan is not None
    props = json.loads(plan.constrain(Sampling()).json_schema or "")["properties"]
    args = props["arguments"]["properties"]
    assert args["city"]["maxLength"] == ARGUMENT_STRING_LENGTH
    assert args["tags"]["items"]["maxLength"] == ARGUMENT_STRING_LENGTH
    assert "maxLength" not in args["code"] and args["note"]["maxLength"] == 500
    assert "maxLength" not in params["properties"]["city"]  # the client's schema is not touched


def test_a_whole_reply_call_is_sized_to_close_within_max_tokens() -> None:
    """A required call's free strings shrink with ``max_tokens``: the default model runs a
    string on a token a character, and a call cut by the budget is no call."""
    plan = tool_plan([WEATHER], "required", None)
    assert plan is not None
    bounds = []
    for budget in (16, 40, 64, 256):
        schema = json.loads(plan.constrain(Sampling(max_tokens=budget)).json_schema or "")
        bound = schema["properties"]["arguments"]["properties"]["city"]["maxLength"]
        assert bound == string_bound("get_weather", WEATHER["function"]["parameters"], budget)
        # the longest call it allows, counted a token a character, fits the budget
        worst = json.dumps(
            {"name": "get_weather", "arguments": {"city": "x" * bound, "unit": "fahrenheit"}},
            separators=(",", ":"),
        )
        assert bound + (len(worst) - bound + 1) // 2 <= budget or bound == 1
        bounds.append(bound)
    assert bounds == sorted(bounds) and bounds[0] < bounds[2] < ARGUMENT_STRING_LENGTH
    assert bounds[-1] == ARGUMENT_STRING_LENGTH  # a roomy budget keeps the usual bound
    auto = tool_plan([WEATHER], "auto", None)
    assert auto is not None  # an auto call follows free text: the budget says nothing of it
    tagged = auto.constrain(Sampling(max_tokens=16)).tagged
    assert tagged is not None
    city = json.loads(tagged.schema)["properties"]["arguments"]["properties"]["city"]
    assert city["maxLength"] == ARGUMENT_STRING_LENGTH


def test_a_cut_reply_keeps_its_whole_calls_and_never_shows_a_partial_one() -> None:
    call = '{"name":"add","arguments":{"a":1,"b":2}}'
    parallel = tool_plan([WEATHER, ADD], "required", True)
    assert parallel is not None
    content, calls = parallel.parse(f'[{call}, {call},{{"name":"add","argu', complete=False)
    assert content is None and len(calls) == 1  # the repeated call is made once
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    one = tool_plan([WEATHER, ADD], "required", None)
    assert one is not None
    assert one.parse('{"name":"add","arguments":{"a":1111111', complete=False) == (None, [])
    auto = tool_plan([WEATHER, ADD], "auto", None)
    assert auto is not None
    assert auto.parse('Let me see. <tool_call>{"name": "ad', complete=False) == (
        "Let me see.",
        [],
    )
    assert auto.parse("no call here", complete=False) == ("no call here", [])


def test_named_function_offers_only_that_function() -> None:
    choice = {"type": "function", "function": {"name": "add"}}
    plan = tool_plan([WEATHER, ADD], choice, False)
    assert plan is not None and plan.named == "add" and not plan.parallel
    assert [t.name for t in plan.offered()] == ["add"]
    schema = json.loads(plan.constrain(Sampling()).json_schema or "")
    assert schema["properties"]["name"] == {"enum": ["add"]}
    assert "get_weather" not in plan.system_text() and '"add"' in plan.system_text()


def test_auto_tags_calls_and_serial_calls_stop_after_the_first() -> None:
    plan = tool_plan([WEATHER], None, False)
    assert plan is not None and plan.choice == "auto" and not plan.whole_reply
    sampling = plan.constrain(Sampling(stop=("END",)))
    assert sampling.tagged is not None and sampling.tagged.begin == CALL_OPEN
    assert sampling.stop == ("END", CALL_CLOSE)
    parallel = tool_plan([WEATHER], "auto", True)
    assert parallel is not None and parallel.constrain(Sampling()).stop == ()


def test_none_offers_nothing_and_parses_nothing() -> None:
    plan = tool_plan([WEATHER], "none", None)
    assert plan is not None and not plan.active
    assert plan.constrain(Sampling()) == Sampling()
    text = f'{CALL_OPEN}{{"name": "get_weather", "arguments": {{}}}}{CALL_CLOSE}'
    assert plan.parse(text) == (text, [])


def test_parse_auto_reply_splits_content_from_calls() -> None:
    plan = tool_plan([WEATHER, ADD], "auto", True)
    assert plan is not None
    text = (
        f'Let me check. {CALL_OPEN}{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}{CALL_CLOSE}'
        f'{CALL_OPEN}{{"name": "get_weather", "arguments": {{"city": "Oslo", "unit": "celsius"}}}}'
    )  # the second section ends where a stop string cut it
    content, calls = plan.parse(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["add", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"])["city"] == "Oslo"
    assert len({c["id"] for c in calls}) == 2
    assert plan.parse("no calls here") == ("no calls here", [])
    broken = f"{CALL_OPEN}{{not json"
    assert plan.parse(broken) == (broken, [])


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([], "required", "tool_choice"),  # ``tools: []`` is no tools: nothing to require
        (None, "required", "tool_choice"),
        ([{"type": "retrieval"}], None, "tools[0].type"),
        ([{"type": "function", "function": {"name": "a b"}}], None, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "ab\n"}}], None, "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}],
            None,
            "tools[0].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "f", "extra": 1}}],
            None,
            "tools[0].function.extra",
        ),
        ([WEATHER, WEATHER], None, "tools"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "add"}}, "tool_choice.function.name"),
        ([WEATHER], {"type": "function"}, "tool_choice"),
    ],
)
def test_bad_tools_name_the_field(tools: Any, choice: Any, param: str) -> None:
    with pytest.raises(ApiError) as info:
        tool_plan(tools, choice, None)
    assert info.value.status == 400 and info.value.param == param


def test_render_calls_writes_what_parse_reads() -> None:
    calls = [{"id": "c1", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]
    text = render_tool_calls("Adding.", calls, "messages[1]")
    plan = tool_plan([ADD], "auto", True)
    assert plan is not None
    content, parsed = plan.parse(text)
    assert content == "Adding."
    assert json.loads(parsed[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    with pytest.raises(RequestRefused) as refused:
        render_tool_calls(None, [{"function": {"name": "add", "arguments": "{x"}}], "messages[1]")
    assert refused.value.field == "messages[1].tool_calls[0].function.arguments"


@given(
    st.text(alphabet="ab <>_/clto", max_size=30),
    st.lists(st.integers(1, 12), min_size=1, max_size=8),
)
def test_call_stream_never_sends_part_of_a_call(prefix: str, cuts: list[int]) -> None:
    """However the reply is chunked, content sent + held = the text before the first call."""
    plan = tool_plan([ADD], "auto", True)
    assert plan is not None
    call = f'{CALL_OPEN}{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}{CALL_CLOSE}'
    text = prefix + call
    stream = ToolCallStream(plan)
    sent, pos = "", 0
    for cut in cuts * 20:
        if pos >= len(text):
            break
        sent += stream.feed(text[pos : pos + cut])
        pos += cut
    sent += stream.feed(text[pos:])
    unsent, calls = stream.finish()
    head = text[: text.index(CALL_OPEN)]
    assert CALL_OPEN not in sent
    assert head.startswith(sent)
    assert (sent + unsent).strip() == head.strip()
    assert [c["function"]["name"] for c in calls] == ["add"]


# -- the API, on the ScriptedEngine ------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted()) as srv:
        yield srv


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def _check_calls(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_returns_valid_calls_through_the_sdk(server: LiveServer) -> None:
    done = client(server).chat.completions.create(
        model="scripted",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER, ADD],  # type: ignore[list-item]
        tool_choice="required",
        n=3,
    )
    for choice in done.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        _check_calls(choice.message.tool_calls)


def test_named_function_and_the_conversation_continues(server: LiveServer) -> None:
    sdk = client(server)
    done = sdk.chat.completions.create(
        model="scripted",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER, ADD],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )
    message = done.choices[0].message
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    _check_calls(message.tool_calls)
    follow = sdk.chat.completions.create(
        model="scripted",
        messages=[
            *USER,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ],  # type: ignore[list-item]
        tools=[WEATHER, ADD],  # type: ignore[list-item]
        tool_choice="none",
    )
    assert follow.choices[0].finish_reason == "stop"
    assert follow.choices[0].message.content
    prompt = server.engines["scripted"].history[-1].prompt  # type: ignore[attr-defined]
    text = server.engines["scripted"].detokenize(prompt.token_ids)
    assert '<|im_start|>tool\n<tool_response>\n{"temp": 21}' in text
    assert '"name": "get_weather"' in text


def test_auto_calls_when_the_model_writes_the_tag(server: LiveServer) -> None:
    done = client(server).chat.completions.create(
        model="scripted",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    _check_calls(choice.message.tool_calls)
    prompt = server.engines["scripted"].history[-1].prompt  # type: ignore[attr-defined]
    assert "<tools>" in server.engines["scripted"].detokenize(prompt.token_ids)


def test_streamed_tool_calls_assemble_in_the_sdk(server: LiveServer) -> None:
    stream = client(server).chat.completions.create(
        model="scripted",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER, ADD],  # type: ignore[list-item]
        tool_choice="required",
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.content  # a whole-reply call streams no text
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                assert delta.function is not None
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["tool_calls"]
    assert calls
    for entry in calls.values():
        jsonschema.validate(json.loads(entry["arguments"]), PARAMS[entry["name"]])


STOCK_FORMAT = {
    "type": "object",
    "properties": {"item": {"type": "string"}, "units": {"type": "integer"}},
    "required": ["item", "units"],
}


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "add"}}], ids=str
)
def test_a_forced_call_beside_a_json_format_is_the_call(server: LiveServer, choice: Any) -> None:
    """instructor's Responses mode forces a call and sends a ``json_schema`` format too:
    OpenAI answers with the call (the format shapes text, and a forced reply has none),
    so the engine is constrained by the call's schema alone."""
    done = client(server).chat.completions.create(
        model="scripted",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER, ADD],  # type: ignore[list-item]
        tool_choice=choice,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "stock", "schema": STOCK_FORMAT, "strict": True},
        },
    )
    assert done.choices[0].finish_reason == "tool_calls"
    assert done.choices[0].message.content is None
    _check_calls(done.choices[0].message.tool_calls)
    sampling = server.engines["scripted"].history[-1].sampling  # type: ignore[attr-defined]
    assert sampling.json_schema is not None and "units" not in sampling.json_schema
    assert not sampling.json_object


def test_a_forced_call_beside_a_text_format_on_the_responses_api(server: LiveServer) -> None:
    done = client(server).responses.create(
        model="scripted",
        input="What is the weather in Paris?",
        tools=[{"type": "function", **WEATHER["function"]}],  # type: ignore[list-item, dict-item]
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "stock", "schema": STOCK_FORMAT}},
    )
    (call,) = [item for item in done.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), PARAMS["get_weather"])


def test_an_auto_reply_cannot_be_shaped_by_both(server: LiveServer) -> None:
    """``auto`` leaves the choice to the model, and the constraint cannot be a call or
    a document at once: refused, naming the format."""
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": USER, "tools": [WEATHER], "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_tools_with_agents_are_refused(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "messages": USER,
            "tools": [WEATHER],
            "agents": [{"name": "a", "count": 2}],
            "collaboration": {"mode": "vote"},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


# -- server tools for agents (collaboration.tools) -------------------------------------------


def lookup(city: str) -> str:
    """The population of a city."""
    return f"{city}: 2 million"


@pytest.fixture(scope="module")
def tool_server() -> Iterator[LiveServer]:
    from microagent.collab import Tool

    with live_server(scripted(), tools=[Tool.from_function(lookup)]) as srv:
        yield srv


def test_agents_call_server_tools_and_the_stream_shows_it(tool_server: LiveServer) -> None:
    body = {
        "messages": [{"role": "user", "content": "How many people live in Lyon?"}],
        "max_tokens": 32,
        "stream": True,
        "agents": [{"name": "analyst", "count": 2}],
        "collaboration": {"mode": "debate", "rounds": 1, "tools": ["lookup"]},
    }
    with httpx.stream("POST", f"{tool_server.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line).get("collaboration_event") or {} for line in lines[:-1]]
    calls = [e for e in events if e.get("type") == "tool_call"]
    results = [e for e in events if e.get("type") == "tool_result"]
    assert calls and len(results) == len(calls)
    assert all(e["name"] == "lookup" for e in calls)
    assert all(e["ok"] and "2 million" in e["output"] for e in results)
    assert any(e.get("type") == "final" for e in events)
    engine = tool_server.engines["scripted"]
    prompt = engine.detokenize(engine.history[-1].prompt.token_ids)  # type: ignore[attr-defined]
    assert prompt.count("described inside") == 1  # described once, however it was composed


def test_an_unregistered_server_tool_is_a_400(tool_server: LiveServer) -> None:
    r = httpx.post(
        f"{tool_server.url}/v1/chat/completions",
        json={
            "messages": USER,
            "agents": [{"name": "a", "count": 2}],
            "collaboration": {"mode": "debate", "tools": ["lookup", "rm_rf"]},
        },
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "collaboration.tools[1]" and "rm_rf" in error["message"]


def test_load_tool_from_a_module_path() -> None:
    from microagent.server._tools import load_tool

    tool = load_tool("pop=test_tools:lookup")
    assert tool.name == "pop" and tool.parameters["required"] == ["city"]
    assert tool.description == "The population of a city."
    for bad in ("nameonly", "x=os", "x=no_such_module:f", "x=os:no_such_attr", "x=os:sep"):
        with pytest.raises(ValueError, match="--tool"):
            load_tool(bad)


def test_an_mcp_server_gives_agents_its_tools_over_http() -> None:
    import sys
    from pathlib import Path

    from microagent.collab import McpServer

    script = Path(__file__).parent / "_mcp_server.py"
    calc = McpServer(sys.executable, (str(script),))  # add and fail only
    with live_server(scripted(), mcp_servers={"calc": calc}) as srv:
        body = {
            "messages": [{"role": "user", "content": "What is 2 + 40?"}],
            "max_tokens": 32,
            "stream": True,
            "agents": [{"name": "solver", "count": 2}],
            "collaboration": {
                "mode": "debate",
                "rounds": 1,
                "tools": ["calc"],
                "tool_choice": "required",
            },
        }
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line).get("collaboration_event") or {} for line in lines[:-1]]
    calls = [e for e in events if e.get("type") == "tool_call"]
    assert calls and {e["name"] for e in calls} <= {"add", "fail"}
    assert len([e for e in events if e.get("type") == "tool_result"]) == len(calls)


def test_an_agent_naming_a_tool_the_collaboration_lacks_is_a_400(tool_server: LiveServer) -> None:
    r = httpx.post(
        f"{tool_server.url}/v1/chat/completions",
        json={
            "messages": USER,
            "stream": True,
            "agents": [{"name": "a", "tools": ["lookup"]}, {"name": "b", "tools": ["calc"]}],
            "collaboration": {"mode": "debate", "tools": ["lookup"]},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "agents[1].tools"
