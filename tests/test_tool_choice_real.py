"""``tool_choice: "required"`` is a call, on the real default model (issue 39).

LangGraph's ``create_react_agent`` over ``bind_tools([lookup_stock],
tool_choice="required")`` sends one free-string tool, ``max_tokens=64`` and
greedy sampling. On "How many widgets are in stock?" the default model wrote
the item as a digit run, one token a digit, up to the string bound (64
characters): the budget cut the call and the reply was no call. Free strings are
now bounded by the budget, so the call closes: on every question, on chat
completions and on Responses, streamed and not. A call the budget cannot hold
(6 tokens) ends ``length`` with nothing claiming to be an answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from _engine import RealEngine
from test_server_helpers import LiveServer, real_server

pytestmark = pytest.mark.engine

PARAMETERS = {
    "properties": {"item": {"type": "string"}},
    "required": ["item"],
    "type": "object",
}
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_stock",
        "description": "Look up the stock level for an item.",
        "parameters": PARAMETERS,
    },
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "lookup_stock",
    "description": "Look up the stock level for an item.",
    "parameters": PARAMETERS,
}
QUESTIONS = (
    "How many widgets are in stock?",  # the issue's: a 48-digit item, cut at 64 tokens
    "Do we have any blue chairs?",  # a repeated syllable, cut at 64 tokens
    "What is the stock level of item 42?",
    "Tell me a joke.",  # nothing to look up: still a call
)


@pytest.fixture(scope="module")
def client(real_engine: RealEngine) -> Iterator[openai.OpenAI]:
    with real_server(real_engine) as srv:
        yield _client(srv)


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


def _valid(name: str, arguments: str) -> dict[str, Any]:
    assert name == "lookup_stock"
    value = json.loads(arguments)
    jsonschema.validate(value, PARAMETERS)
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize("question", QUESTIONS)
def test_required_is_a_schema_valid_call_on_chat_completions(
    client: openai.OpenAI, question: str
) -> None:
    kwargs: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": question}],
        "tools": [CHAT_TOOL],
        "tool_choice": "required",
        "max_tokens": 64,
        "temperature": 0,
    }
    done = client.chat.completions.create(**kwargs)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", (question, choice)
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    argument = _valid(call.function.name, call.function.arguments)
    assert done.usage is not None and done.usage.completion_tokens <= 64

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)  # a required reply sends no text
    streamed = [tc for d in deltas for tc in d.tool_calls or []]
    assert len(streamed) == 1 and streamed[0].function is not None
    assert streamed[0].function.name == "lookup_stock"
    # greedy: the stream makes the very call the JSON reply made
    assert _valid("lookup_stock", streamed[0].function.arguments or "") == argument
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("question", QUESTIONS[:2])
def test_required_is_a_schema_valid_call_on_responses(client: openai.OpenAI, question: str) -> None:
    kwargs: dict[str, Any] = {
        "model": "default",
        "input": question,
        "tools": [RESPONSES_TOOL],
        "tool_choice": "required",
        "max_output_tokens": 64,
        "temperature": 0,
    }
    response = client.responses.create(**kwargs)
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["function_call"]
    call = response.output[0]
    assert call.type == "function_call"
    argument = _valid(call.name, call.arguments)

    events = list(client.responses.create(stream=True, **kwargs))
    final = events[-1]
    assert final.type == "response.completed"
    assert not [e for e in events if e.type == "response.output_text.delta"]
    (item,) = final.response.output
    assert item.type == "function_call" and _valid(item.name, item.arguments) == argument


def test_a_required_call_the_budget_cannot_hold_is_length_and_no_answer(
    client: openai.OpenAI,
) -> None:
    """6 tokens cannot hold the call's opening: ``length``, no content, no output item."""
    chat = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        tools=[CHAT_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=6,
        temperature=0,
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.content is None and not chat.choices[0].message.tool_calls
    kwargs: dict[str, Any] = {
        "model": "default",
        "input": QUESTIONS[0],
        "tools": [RESPONSES_TOOL],
        "tool_choice": "required",
        "max_output_tokens": 6,
        "temperature": 0,
    }
    response = client.responses.create(**kwargs)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output == [] and response.output_text == ""
    events = list(client.responses.create(stream=True, **kwargs))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output == []
    assert not [e for e in events if e.type.startswith("response.output_")]
