"""``POST /v1/responses`` with the official ``openai`` SDK against a live server (ScriptedEngine).

The same plans as chat completions run underneath; these tests check what the
Responses shape adds: input items in, output items out, the SDK's own stream
accumulator (``responses.stream()``), and 400s that name the Responses field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from test_server_helpers import LiveServer, live_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _script(ids: Any, request: EngineRequest) -> str | None:
    if request.sampling.json_schema is not None and "get_weather" in request.sampling.json_schema:
        return '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    if request.sampling.json_schema is not None:
        return '{"answer": "yes"}'
    if request.sampling.choices:
        return request.sampling.choices[0]
    return "It is sunny in Paris today."


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(lambda: {"scripted": ScriptedEngine(script=_script)}) as srv:
        yield srv


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def engine(srv: LiveServer) -> ScriptedEngine:
    bridge = srv.engines["scripted"]
    assert isinstance(bridge, ScriptedEngine)
    return bridge


def test_create_answers_with_a_message_and_usage(server: LiveServer) -> None:
    done = client(server).responses.create(
        model="scripted", input="What is the weather?", instructions="Be brief.", include=[]
    )
    assert done.id.startswith("resp_") and done.status == "completed"
    assert done.output_text == "It is sunny in Paris today."
    assert done.output[0].type == "message"
    assert done.usage is not None and done.usage.output_tokens > 0
    assert done.usage.input_tokens > done.usage.output_tokens
    prompt = engine(server).history[-1].prompt.text
    assert prompt.index("Be brief.") < prompt.index("What is the weather?")  # system first


def test_function_calls_come_back_as_items_and_results_go_in_as_items(server: LiveServer) -> None:
    api = client(server)
    first = api.responses.create(
        model="scripted", input="Weather in Paris?", tools=[WEATHER], tool_choice="required"
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    # the Agents SDK's next turn: the whole input, the call and its output as items
    second = api.responses.create(
        model="scripted",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"},
        ],
        tools=[WEATHER],
    )
    assert second.output_text
    prompt = engine(server).history[-1].prompt.text
    assert '"get_weather"' in prompt and "22 C, sunny" in prompt
    assert prompt.index('"get_weather"') < prompt.index("22 C, sunny")


def test_the_sdk_stream_helper_accumulates_text_and_the_final_response(
    server: LiveServer,
) -> None:
    with client(server).responses.stream(model="scripted", input="Weather?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "It is sunny in Paris today."
    assert final.usage is not None and final.usage.total_tokens > 0
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_a_streamed_call_ends_with_its_arguments(server: LiveServer) -> None:
    with client(server).responses.stream(
        model="scripted", input="Weather?", tools=[WEATHER], tool_choice="required"
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris"}
    assert [i.type for i in final.output] == ["function_call"]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))


def test_a_reply_cut_by_max_output_tokens_is_incomplete(server: LiveServer) -> None:
    done = client(server).responses.create(model="scripted", input="Weather?", max_output_tokens=2)
    assert done.status == "incomplete"
    assert done.incomplete_details is not None
    assert done.incomplete_details.reason == "max_output_tokens"
    assert done.usage is not None and done.usage.output_tokens == 2


def test_text_format_constrains_the_reply(server: LiveServer) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    done = client(server).responses.create(
        model="scripted",
        input="Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "reply", "schema": schema}},
    )
    assert json.loads(done.output_text) == {"answer": "yes"}
    assert json.loads(engine(server).history[-1].sampling.json_schema or "") == schema


def test_a_collaboration_runs_through_the_responses_route(server: LiveServer) -> None:
    done = client(server).responses.create(
        model="scripted",
        input="Is the sky blue?",
        extra_body={
            "agents": [{"name": "voter", "count": 3}],
            "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
        },
    )
    assert done.output_text == "yes"
    extra = done.model_extra or {}
    assert extra["collaboration"]["votes"] == {"yes": 3}
    assert done.usage is not None and done.usage.input_tokens > 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": "yes"}, "store"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"bogus": 1}, "bogus"),
        ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "nope"}, "model"),
        ({"input": [{"role": "user", "content": " "}]}, "input"),
    ],
)
def test_bad_fields_get_a_400_naming_the_responses_field(
    server: LiveServer, body: dict[str, Any], param: str
) -> None:
    payload = {"model": "scripted", "input": "hi", **body}
    r = httpx.post(f"{server.url}/v1/responses", json=payload, timeout=30)
    assert r.status_code == (404 if param == "model" else 400), r.text  # an unknown model
    assert r.json()["error"]["param"] == param, r.json()


def test_the_responses_route_is_in_the_openapi_document(server: LiveServer) -> None:
    document = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    post = document["paths"]["/v1/responses"]["post"]
    assert "text/event-stream" in post["responses"]["200"]["content"]
    assert "400" in post["responses"]
