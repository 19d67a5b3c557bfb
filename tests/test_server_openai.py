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
from test_server_helpers import LiveServer, eventually, real_server

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
    with real_server(real_engine, limits=ServerLimits(max_concurrent_collaborations=64)) as srv:
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
                server.metric("microagent:engine_requests_running") == 0
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


# -- function calling, response formats, logprobs (the default model, constrained) ------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOL_PARAMS = {
    t["function"]["name"]: t["function"]["parameters"]  # type: ignore[index]
    for t in (WEATHER_TOOL, TIME_TOOL)
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _valid_calls(choice: Any) -> bool:
    import jsonschema

    calls = choice.message.tool_calls or []
    if choice.finish_reason != "tool_calls" or not calls:
        return False
    for call in calls:
        try:
            jsonschema.validate(
                json.loads(call.function.arguments), TOOL_PARAMS[call.function.name]
            )
        except (ValueError, KeyError, jsonschema.ValidationError):
            return False
    return True


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_tool_calls_are_valid_20_of_20(server: LiveServer, tool_choice: Any) -> None:
    client = sync_client(server)
    choices = []
    for _ in range(2):
        done = client.chat.completions.create(
            model="default",
            messages=WEATHER_QUESTION,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=64,
            temperature=1.0,
            n=10,
        )
        choices.extend(done.choices)
    assert sum(_valid_calls(c) for c in choices) == 20
    if isinstance(tool_choice, dict):
        assert {c.message.tool_calls[0].function.name for c in choices} == {"get_weather"}


STOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_stock",
        "description": "Look up the stock level for an item.",
        "parameters": {
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
            "type": "object",
        },
    },
}
STOCK_QUESTIONS = (
    "What is the stock level of item 42?",
    "How many units of SKU-1234 are left?",
    "lookup stock for widgets",
    "How many widgets do we have?",
    "What's in stock?",
    "Do we have 5 laptops?",
    "Check the inventory for product 7781.",
    "How many pens?",
)


def test_a_langgraph_style_required_call_terminates_on_the_default_model(
    server: LiveServer,
) -> None:
    """LangChain's ``bind_tools(..., tool_choice="required")`` request, as it sends it: no
    ``parallel_tool_calls``, 64 tokens, greedy. As an array of calls the default model
    repeated its call or ran a string on until ``max_tokens`` (raw JSON came back as
    content); one bounded call closes within the budget every time."""
    client = sync_client(server)
    for question in STOCK_QUESTIONS:
        done = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": question}],
            tools=[STOCK_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=64,
            temperature=0,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls", (question, choice)
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or []
        item = json.loads(call.function.arguments)["item"]
        assert isinstance(item, str) and 0 < len(item) <= 64


def test_a_call_cut_by_max_tokens_is_length_with_no_raw_json(server: LiveServer) -> None:
    client = sync_client(server)
    for stream in (False, True):
        kwargs: dict[str, Any] = {
            "model": "default",
            "messages": [{"role": "user", "content": STOCK_QUESTIONS[0]}],
            "tools": [STOCK_TOOL],
            "tool_choice": "required",
            "max_tokens": 6,  # the call's opening alone is longer
            "temperature": 0,
        }
        if not stream:
            choice = client.chat.completions.create(**kwargs).choices[0]
            assert choice.finish_reason == "length"
            assert choice.message.content is None and not choice.message.tool_calls
            continue
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert not any(d.content for d in deltas) and not any(d.tool_calls for d in deltas)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_conversation_continues_after_a_tool_result(server: LiveServer) -> None:
    client = sync_client(server)
    first = client.chat.completions.create(
        model="default",
        messages=WEATHER_QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=64,
        temperature=0,
    )
    message = first.choices[0].message
    assert message.tool_calls
    history = [
        *WEATHER_QUESTION,
        message.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
            for call in message.tool_calls
        ),
    ]
    follow = client.chat.completions.create(
        model="default",
        messages=history,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    assert follow.choices[0].finish_reason in ("stop", "length")
    assert follow.choices[0].message.content
    assert not follow.choices[0].message.tool_calls
    bridge = next(iter(server.engines.values()))
    assert "tool" in bridge.chat.template.roles  # SmolLM2's template renders tool turns


def test_response_format_json_schema_is_valid_20_of_20(server: LiveServer) -> None:
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no"]},
            "reason": {"type": "string", "maxLength": 60},
        },
        "required": ["answer", "reason"],
        "additionalProperties": False,
    }
    client = sync_client(server)
    valid = 0
    for _ in range(2):
        done = client.chat.completions.create(
            model="default",
            messages=QUESTION,  # type: ignore[arg-type]
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": True},
            },
            max_tokens=80,
            temperature=1.0,
            n=10,
        )
        for choice in done.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content or ""), schema)
            valid += 1
    assert valid == 20


def test_logprobs_are_present_and_consistent(server: LiveServer) -> None:
    import math

    done = sync_client(server).chat.completions.create(
        model="default",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=1.0,
        logprobs=True,
        top_logprobs=4,
    )
    choice = done.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 4
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert sum(math.exp(t) for t in tops) <= 1.0 + 1e-4
        assert entry.logprob <= tops[0] + 1e-6  # nothing beats the most likely
        for alt in entry.top_logprobs:
            if alt.token == entry.token:
                assert math.isclose(alt.logprob, entry.logprob, abs_tol=1e-4)


def test_an_unsupported_parameter_is_a_400_naming_it(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sync_client(server).chat.completions.create(
            model="default",
            messages=QUESTION,  # type: ignore[arg-type]
            logit_bias={"100": 5},
            max_tokens=4,
        )
    assert info.value.status_code == 400
    assert "logit_bias" in str(info.value.message)


def test_the_responses_api_on_the_default_model(server: LiveServer) -> None:
    """The Agents SDK's default model speaks the Responses API: a call, then its result."""
    client = sync_client(server)
    tool = {"type": "function", **STOCK_TOOL["function"]}  # type: ignore[dict-item]
    first = client.responses.create(
        model="default",
        input="How many units of SKU-1234 are left?",
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=64,
        temperature=0,
        include=[],
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "lookup_stock" and json.loads(call.arguments)["item"]
    history: list[Any] = [
        {"role": "user", "content": "How many units of SKU-1234 are left?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "17 units"},
    ]  # fmt: skip
    with client.responses.stream(
        model="default",
        input=history,
        tools=[tool],
        max_output_tokens=24,
        temperature=0,  # type: ignore[list-item]
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    # a reply cut by max_output_tokens ends with response.incomplete, as OpenAI's does (the
    # SDK's get_final_response() then raises: it reads response.completed only)
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text and final.usage is not None
    assert final.usage.input_tokens > final.usage.output_tokens > 0
    assert kinds[0] == "response.created" and kinds[-1] == f"response.{final.status}"
    assert final.status in ("completed", "incomplete")
    assert "response.output_text.delta" in kinds
