"""Golden streams: what the chat and Responses routes send, byte for byte, on the ScriptedEngine.

Each case posts one request to a fresh server on a fresh ``ScriptedEngine`` (its
cache, seeds and counters start the same every time) and records what comes
back: the status, the JSON body or every server-sent event in order, and the
server's counters afterwards (usage, requests, engine losses). Ids and
times are replaced by stable placeholders (the same id keeps the same
placeholder, so which events share an item still shows); everything else is
kept as sent. The record must equal ``tests/golden/<case>.json`` byte for byte:
a change in how either dialect renders, meters, ends or fails a request shows
up here. ``REGEN_GOLDEN=1`` rewrites the files (then read the diff).

The cases cover both dialects (and ``/v1/completions``, which streams through
the same loop) × streamed or not × plain text, ``n`` > 1, tool calls (``auto``
and ``required``), a collaboration, a refused request, an engine error, usage in
the stream, and an engine lost under the request.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from microagent.engine_bridge import EngineRequest
from microagent.server import create_app
from microagent.testing import ScriptedEngine

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("REGEN_GOLDEN") == "1"

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
TEXT = "/v1/completions"

WEATHER_CHAT = {
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
WEATHER_RESPONSES = {"type": "function", **WEATHER_CHAT["function"]}  # type: ignore[dict-item]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _script(_ids: Any, request: EngineRequest) -> str | None:
    """Replies by what the request asks: a call under a tool schema, a call written freely
    when the prompt says ``auto``, an error when it says ``explode``, else seeded text
    (``None``: the engine's own seeded words, different per ``n`` sample)."""
    text = request.prompt.text
    if "explode" in text:
        raise RuntimeError("the scripted model broke")
    if request.sampling.json_schema is not None and "get_weather" in request.sampling.json_schema:
        return CALL
    if "call it freely" in text:
        return f"Let me look. <tool_call>{CALL}</tool_call>"
    if "sunny" in text:
        return "It is sunny in Paris today."
    return None


@attrs.frozen
class Case:
    """One request: where it goes, its body, and what is done to the engine first."""

    name: str
    path: str
    body: dict[str, Any]
    prepare: Callable[[ScriptedEngine], None] | None = None


def _fail_next(engine: ScriptedEngine) -> None:
    engine.fail_next("killed by the golden test")


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted", "messages": USER, "max_tokens": 24, **fields}


def _respond(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted", "input": "What is the weather in Paris?", **fields}


SUNNY = [{"role": "user", "content": "Is it sunny in Paris?"}]
FREE = [{"role": "user", "content": "Weather in Paris? call it freely"}]
BROKEN = [{"role": "user", "content": "explode now"}]
VOTE = {"agents": [{"name": "voter", "count": 2}], "collaboration": {"mode": "vote"}}
REQUIRED_CHAT = {"tools": [WEATHER_CHAT], "tool_choice": "required", "parallel_tool_calls": False}
AUTO_CHAT = {"tools": [WEATHER_CHAT], "tool_choice": "auto"}
REQUIRED_RESP = {"tools": [WEATHER_RESPONSES], "tool_choice": "required"}
AUTO_RESP = {"tools": [WEATHER_RESPONSES], "tool_choice": "auto"}
USAGE = {"stream_options": {"include_usage": True}}


def _both(name: str, path: str, body: dict[str, Any], prepare: Any = None) -> list[Case]:
    """The case as a JSON reply and as a stream."""
    return [
        Case(f"{name}", path, body, prepare),
        Case(f"{name}_stream", path, {**body, "stream": True}, prepare),
    ]


CASES: Sequence[Case] = [
    *_both("chat_text", CHAT, _chat(messages=SUNNY)),
    *_both("chat_seeded", CHAT, _chat()),
    *_both("chat_n3", CHAT, _chat(n=3, temperature=1.0)),
    *_both("chat_logprobs", CHAT, _chat(messages=SUNNY, logprobs=True, top_logprobs=2)),
    *_both("chat_length", CHAT, _chat(messages=SUNNY, max_tokens=3)),
    *_both("chat_tools_required", CHAT, _chat(**REQUIRED_CHAT)),
    *_both("chat_tools_auto", CHAT, _chat(messages=FREE, max_tokens=64, **AUTO_CHAT)),
    *_both("chat_tools_cut", CHAT, _chat(max_tokens=4, **REQUIRED_CHAT)),
    *_both("chat_collaboration", CHAT, _chat(**VOTE)),
    *_both("chat_refused", CHAT, _chat(n=0)),
    *_both("chat_engine_error", CHAT, _chat(messages=BROKEN)),
    *_both("chat_engine_lost", CHAT, _chat(), _fail_next),
    *_both("chat_collaboration_lost", CHAT, _chat(**VOTE), _fail_next),
    Case("chat_usage_stream", CHAT, _chat(messages=SUNNY, stream=True, **USAGE)),
    Case("chat_n2_usage_stream", CHAT, _chat(n=2, stream=True, **USAGE)),
    Case("chat_collaboration_usage_stream", CHAT, _chat(stream=True, **VOTE, **USAGE)),
    *_both("responses_text", RESPONSES, _respond(input="Is it sunny in Paris?")),
    *_both("responses_seeded", RESPONSES, _respond(max_output_tokens=24)),
    *_both("responses_length", RESPONSES, _respond(input="Sunny?", max_output_tokens=3)),
    *_both("responses_tools_required", RESPONSES, _respond(**REQUIRED_RESP)),
    *_both("responses_tools_auto", RESPONSES, _respond(input=FREE, **AUTO_RESP)),
    *_both("responses_collaboration", RESPONSES, _respond(**VOTE)),
    *_both("responses_refused", RESPONSES, _respond(max_output_tokens=0)),
    *_both("responses_engine_error", RESPONSES, _respond(input=BROKEN)),
    *_both("responses_engine_lost", RESPONSES, _respond(), _fail_next),
    *_both("responses_collaboration_lost", RESPONSES, _respond(**VOTE), _fail_next),
    *_both("text", TEXT, {"model": "scripted", "prompt": "Is it sunny", "max_tokens": 8}),
    *_both("text_n2", TEXT, {"model": "scripted", "prompt": "Hello", "max_tokens": 6, "n": 2}),
]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    """asyncio only: its FIFO scheduling makes every run interleave its tasks the same way."""
    return ("asyncio", {})


async def _record(case: Case) -> dict[str, Any]:
    """What the server sends back for ``case``, ids and times made stable."""
    engine = ScriptedEngine(script=_script)
    if case.prepare is not None:
        case.prepare(engine)
    async with engine:
        app = create_app({"scripted": engine})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.post(case.path, json=case.body)
            metrics = (await client.get("/metrics")).text
        assert app.state.microagent.requests == 0  # its place was given back
    record: dict[str, Any] = {"status": r.status_code}
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        record["events"] = [_event(block) for block in r.text.split("\n\n") if block]
    else:
        record["body"] = r.json()
    record["counters"] = _counters(metrics)
    stable: dict[str, Any] = _Stable().apply(record)
    return stable


def _counters(text: str) -> list[str]:
    """The server's own counters that moved during the request (what it metered and how
    it ended); durations are left out, they are measured."""
    return [
        line
        for line in text.splitlines()
        if line.startswith("microagent:")
        and "_total" in line
        and "seconds" not in line
        and float(line.rsplit(" ", 1)[1]) != 0
    ]


def _event(block: str) -> Any:
    assert block.startswith("data: "), block
    data = block[len("data: ") :]
    return data if data == "[DONE]" else json.loads(data)


#: ids the server makes up per request: replaced by ``<kind-N>`` in order of appearance
_IDS = re.compile(r"\b(chatcmpl-|cmpl-|resp_|msg_|fc_|call_)[0-9A-Za-z]{8,}")
#: fields that hold a time (seconds since the epoch, or a duration measured on a clock)
_TIMES = {
    *("created", "created_at", "time", "wall_time", "elapsed", "seconds", "duration"),
    *("latency", "submitted", "first_token", "finished"),
}
#: the ScriptedEngine's request ids hold the engine object's address
_ENGINE_IDS = re.compile(r"\bscripted-[0-9a-f]{6,}-")


class _Stable:
    """Replaces made-up ids, measured times and the ScriptedEngine's logprobs (seeded by the
    request id, which holds the engine's address) by placeholders; an id keeps its identity."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def apply(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self.apply(v, k) for k, v in value.items()}
        if key == "top_logprobs" and isinstance(value, list):
            return ["<alternative>"] * len(value)  # drawn with the request id as seed
        if isinstance(value, list):
            return [self.apply(v, key) for v in value]
        if isinstance(value, str):
            return _IDS.sub(self._id, _ENGINE_IDS.sub("scripted-<engine>-", value))
        if key == "logprob" and isinstance(value, float):
            return "<logprob>"
        if isinstance(value, int | float) and not isinstance(value, bool) and _timed(key):
            return "<time>"
        return value

    def _id(self, match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in self.seen:
            kind = match.group(1).rstrip("-_")
            count = sum(1 for v in self.seen.values() if v.startswith(f"<{kind}-"))
            self.seen[found] = f"<{kind}-{count}>"
        return self.seen[found]


def _timed(key: str) -> bool:
    return key in _TIMES or key.endswith(("_seconds", "_s", "_ms", "_at"))


def _text(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, ensure_ascii=False) + "\n"


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_the_route_sends_its_golden_stream(case: Case) -> None:
    text = _text(await _record(case))
    path = GOLDEN / f"{case.name}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden for {case.name}: run with REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{case.name} differs from {path}"


@pytest.mark.anyio
async def test_a_recording_is_the_same_twice() -> None:
    """The goldens can hold: two runs of the busiest cases record the same bytes."""
    for case in CASES:
        if case.name in ("chat_n3_stream", "chat_collaboration_stream", "responses_text_stream"):
            assert _text(await _record(case)) == _text(await _record(case))


def test_every_golden_file_has_a_case() -> None:
    """A golden whose case was removed is stale: it checks nothing."""
    names = {c.name for c in CASES}
    stale = sorted(p.stem for p in GOLDEN.glob("*.json") if p.stem not in names)
    assert not stale
