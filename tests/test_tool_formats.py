"""Tool-call formats per model (engine_bridge/_tool_formats.py, serve --tool-call-parser).

The ``llama3_json`` format end to end on the ScriptedEngine: a chat template with
a tool format (a small Llama-3-style Jinja template in ChatML framing, the toy
tokenizer's) renders the tools and the history's calls itself; the scripted
model's JSON call is parsed into ``tool_calls``, streamed as tool-call deltas; a
``required`` call is constrained to the parser's JSON. The flags are checked as
``serve`` parses them. Hermes, the default, is covered byte for byte by
``test_golden_streams.py`` and ``test_tools.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from microagent.engine_bridge import (
    ChatComposer,
    EngineRequest,
    JinjaRenderer,
    ToolCallStream,
    ToolFormat,
    render_tool_calls,
)
from microagent.server import CliError, create_app, serve_options, served_app
from microagent.testing import ScriptedEngine

LLAMA = ToolFormat("llama3_json", templated=True, auto=True)

#: Llama 3.1's tool format (tools as JSON after "Environment: tools", a call as
#: {"name", "parameters"}, a result in an ``ipython`` turn) in ChatML framing
LLAMA_STYLE = """\
{%- if tools %}<|im_start|>system
Environment: tools
Respond with a JSON object {"name": function name, "parameters": arguments} to call one of:
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": \
{{ c.function.arguments | tojson }}}{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>ipython
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
ASK = [{"role": "user", "content": "Weather in Paris? call it"}]


def _script(_ids: Any, request: EngineRequest) -> str | None:
    text = request.prompt.text
    if request.sampling.json_schema is not None:
        return None  # the engine's own instance of the schema
    if "call it" in text.rsplit("<|im_start|>", 2)[-2]:
        return f"  {CALL}"
    return "It is sunny in Paris."


def _engine(template: bool = True, call_format: ToolFormat = LLAMA) -> ScriptedEngine:
    engine = ScriptedEngine(script=_script)
    if template:  # the model's template renders whole, tools included
        engine.chat = ChatComposer(
            engine.chat.template, engine, JinjaRenderer(LLAMA_STYLE, eos_token="<|im_end|>")
        )
    engine.tool_format = call_format
    return engine


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedEngine]]:
    engine = _engine()
    async with engine:
        app = create_app({"scripted": engine})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c, engine


async def _chat(c: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await c.post("/v1/chat/completions", json={"model": "scripted", **body})


# -- the template renders the tools and the history --------------------------------------------


@pytest.mark.anyio
async def test_tools_go_where_the_template_puts_them_not_in_a_hermes_block(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, engine = client
    r = await _chat(c, messages=ASK, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = engine.history[-1].prompt.text
    assert prompt.startswith("<|im_start|>system\nEnvironment: tools\n")
    assert json.dumps(WEATHER, ensure_ascii=False) in prompt
    assert "<tools>" not in prompt and "<tool_call>" not in prompt
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Paris? call it<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.anyio
async def test_history_calls_and_results_are_rendered_by_the_template(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, engine = client
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    ]
    r = await _chat(c, messages=messages, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = engine.history[-1].prompt.text
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n" in prompt
    assert "<|im_start|>ipython\nsunny, 24 C<|im_end|>\n" in prompt
    assert "<tool_response>" not in prompt
    assert r.json()["choices"][0]["message"]["content"] == "It is sunny in Paris."


@pytest.mark.anyio
async def test_a_template_without_a_tool_format_gets_the_formats_own_description() -> None:
    engine = _engine(template=False)
    async with engine:
        app = create_app({"scripted": engine})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await _chat(c, messages=ASK, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = engine.history[-1].prompt.text
    assert '{"name": <function-name>, "parameters": <arguments-object>}' in prompt
    assert "<tool_call>" not in prompt
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == ("get_weather")


@pytest.mark.anyio
async def test_a_plain_chat_is_composed_token_by_token_as_before(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, engine = client
    r = await _chat(c, messages=[{"role": "user", "content": "hello"}])
    assert r.status_code == 200, r.text
    assert engine.history[-1].prompt.text == (
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


# -- calls parsed, streamed and constrained in the parser's format --------------------------------


@pytest.mark.anyio
async def test_a_json_call_is_parsed_into_tool_calls(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, _ = client
    r = await _chat(c, messages=ASK, tools=[WEATHER])
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.anyio
async def test_a_json_call_streams_as_tool_call_deltas_never_as_content(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, _ = client
    r = await _chat(c, messages=ASK, tools=[WEATHER], stream=True)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
    assert not any(d.get("content") for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(tc["function"].get("arguments", "") for tc in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.anyio
async def test_text_under_the_json_format_streams_as_content(
    client: tuple[httpx.AsyncClient, ScriptedEngine],
) -> None:
    c, _ = client
    ask = [{"role": "user", "content": "Is it sunny in Paris?"}]
    r = await _chat(c, messages=ask, tools=[WEATHER], stream=True)
    deltas = [
        json.loads(line[6:])["choices"][0]["delta"]
        for line in r.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    ]
    assert "".join(d.get("content") or "" for d in deltas) == "It is sunny in Paris."
    assert not any(d.get("tool_calls") for d in deltas)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
async def test_a_forced_call_is_constrained_to_the_parsers_json(
    client: tuple[httpx.AsyncClient, ScriptedEngine], choice: Any
) -> None:
    c, engine = client
    ask = [{"role": "user", "content": "Is it sunny in Paris?"}]
    r = await _chat(c, messages=ask, tools=[WEATHER], tool_choice=choice, max_tokens=48)
    assert r.status_code == 200, r.text
    schema = json.loads(engine.history[-1].sampling.json_schema or "null")
    assert schema["required"] == ["name", "parameters"]
    choice_out = r.json()["choices"][0]
    assert choice_out["finish_reason"] == "tool_calls"
    (call,) = choice_out["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


@pytest.mark.anyio
async def test_auto_without_enable_auto_tool_choice_is_vllms_400() -> None:
    engine = _engine(call_format=ToolFormat("llama3_json", templated=True, auto=False))
    async with engine:
        app = create_app({"scripted": engine})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            auto = await _chat(c, messages=ASK, tools=[WEATHER])
            required = await _chat(c, messages=ASK, tools=[WEATHER], tool_choice="required")
    assert auto.status_code == 400
    assert auto.json()["error"]["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in auto.json()["error"]["message"]
    assert required.status_code == 200


# -- the format on its own --------------------------------------------------------------------


def _plan(choice: str = "auto") -> Any:
    from microagent.engine_bridge import FunctionTool, ToolPlan

    fn = WEATHER["function"]
    tool = FunctionTool(fn["name"], fn["description"], fn["parameters"])  # type: ignore[index]
    return ToolPlan((tool,), choice, call_format=LLAMA)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        (CALL, None, ["get_weather"]),
        (f"<|python_tag|>{CALL}", None, ["get_weather"]),
        (f"{CALL}; {CALL.replace('Paris', 'Rome')}", None, ["get_weather", "get_weather"]),
        (f"[{CALL}]", None, ["get_weather"]),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, ["get_weather"]),
        ("It is sunny.", "It is sunny.", []),
        (f"Sure: {CALL}", f"Sure: {CALL}", []),  # a call is the reply's start, or text
        ('{"answer": 4}', '{"answer": 4}', []),  # JSON that is no call is content
    ],
)
def test_parse_reads_what_vllms_llama3_json_parser_reads(
    text: str, content: str | None, names: list[str]
) -> None:
    got_content, calls = _plan().parse(text)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names


def test_a_cut_json_call_is_never_content() -> None:
    assert _plan().parse(CALL[:20], complete=False) == (None, [])
    content, calls = _plan("required").parse(f"[{CALL}, {CALL[:20]}", complete=False)
    assert content is None and len(calls) == 1


def test_history_calls_are_written_as_the_parser_reads_them() -> None:
    call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    text = render_tool_calls(None, [call, call], "m", LLAMA)
    assert text == f"{CALL}; {CALL}"
    assert [c["function"]["name"] for c in _plan().parse(text)[1]] == ["get_weather"]


@given(st.sampled_from(["", "  ", "\n"]), st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_a_streamed_json_call_sends_no_content_however_it_is_cut(
    lead: str, cuts: list[int]
) -> None:
    text = f"{lead}<|python_tag|>{CALL}"
    stream = ToolCallStream(_plan())
    sent, pos = "", 0
    for cut in cuts * 30:
        sent += stream.feed(text[pos : pos + cut])
        pos += cut
    sent += stream.feed(text[pos:])
    unsent, calls = stream.finish()
    assert sent == "" and unsent == ""
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


# -- the flags ----------------------------------------------------------------------------------


def _format(*flags: str) -> ToolFormat:
    call_format: ToolFormat = (
        served_app(serve_options(["--engine", "scripted", *flags])).bridges[0].tool_format
    )
    return call_format


def test_serve_without_the_flags_keeps_hermes() -> None:
    assert _format() == ToolFormat()


def test_serve_tool_call_parser_sets_every_models_format() -> None:
    got = _format("--tool-call-parser", "llama3_json", "--enable-auto-tool-choice")
    assert got == ToolFormat("llama3_json", templated=True, auto=True)
    assert _format("--tool-call-parser", "hermes").auto is False


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
        (["--tool-call-parser", "nosuch"], "unknown parser"),
        (["--tool-call-parser", "mistral"], "vLLM's 'mistral' format is not read or constrained"),
    ],
)
def test_serve_refuses_what_it_cannot_serve_by_name(flags: list[str], says: str) -> None:
    args = serve_options(["--engine", "scripted", *flags])
    with pytest.raises(CliError, match=re.escape(says)):
        served_app(args)


def test_serve_renders_tools_with_its_chat_template_and_reads_llama3_json() -> None:
    """``serve --engine scripted --chat-template T --tool-call-parser llama3_json``, end to end."""
    served = served_app(
        serve_options(
            [
                *("--engine", "scripted", "--chat-template", LLAMA_STYLE),
                *("--tool-call-parser", "llama3_json", "--enable-auto-tool-choice"),
            ]
        )
    )
    (engine,) = served.bridges
    assert isinstance(engine, ScriptedEngine)
    engine.script = _script

    async def go() -> httpx.Response:
        async with engine:
            transport = httpx.ASGITransport(app=served.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return await _chat(c, messages=ASK, tools=[WEATHER])

    r = anyio.run(go)
    assert r.status_code == 200, r.text
    assert "Environment: tools" in engine.history[-1].prompt.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
