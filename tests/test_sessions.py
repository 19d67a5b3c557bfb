"""HTTP sessions on the ScriptedEngine: retained turns, the tool-call trigger, tenant salts.

The engine's pool is small (24 blocks of 16 tokens) so that a flood of other
prompts evicts whatever plain LRU holds; each check compares a session's turn
with the same turn sent without a session, under the same flood.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from microagent.server import SessionSettings
from test_server_helpers import LiveServer, live_server, scripted

WORDS = " ".join(["token"] * 90)
KEYS = ["alpha-key", "beta-key"]


def post(srv: LiveServer, body: dict[str, Any], key: str = KEYS[0]) -> httpx.Response:
    body = {"model": "scripted", "max_tokens": 6, "temperature": 0.0, **body}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def cached(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def flood(srv: LiveServer, key: str = KEYS[1]) -> None:
    for i in range(6):
        post(srv, {"messages": [{"role": "user", "content": f"other {i} {WORDS}"}]}, key)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted(num_blocks=24, retention_budget=0.5), api_key=KEYS) as srv:
        yield srv


def two_turns(srv: LiveServer, tag: str, extra: dict[str, Any]) -> tuple[int, int]:
    """Turn 1, a flood from another key, then turn 2 re-sending turn 1's reply as text."""
    first = [{"role": "user", "content": f"{tag} {WORDS}"}]
    one = post(srv, {"messages": first, **extra})
    reply = one.json()["choices"][0]["message"]["content"]
    flood(srv)
    again = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    two = post(srv, {"messages": again, **extra})
    return one.json()["usage"]["prompt_tokens"], cached(two)


@pytest.mark.parametrize(
    "session",
    [
        {"prompt_cache_key": "s1"},
        {"prompt_cache_options": {"ttl": "5m"}},
        {"prompt_cache_retention": "in_memory"},
    ],
)
def test_a_session_turn_survives_a_flood_that_evicts_a_plain_one(session: dict[str, Any]) -> None:
    with live_server(scripted(num_blocks=24, retention_budget=0.5), api_key=KEYS) as srv:
        prompt, kept = two_turns(srv, "session", session)
        _, plain = two_turns(srv, "plain", {})
    # the whole of turn 1 (prompt and reply, spliced back as the generated ids) is a hit
    assert kept >= prompt // 16 * 16 and plain < kept


def test_another_key_never_hits_a_keys_blocks(server: LiveServer) -> None:
    memo = [{"role": "user", "content": f"private memo {WORDS}"}]
    post(server, {"messages": memo, "prompt_cache_key": "m"}, KEYS[0])
    assert cached(post(server, {"messages": memo}, KEYS[1])) == 0
    assert cached(post(server, {"messages": memo}, KEYS[0])) > 0


def test_a_shared_cache_is_an_explicit_option() -> None:
    settings = SessionSettings(shared_cache=True)
    with live_server(scripted(), api_key=KEYS, sessions=settings) as srv:
        memo = [{"role": "user", "content": f"shared memo {WORDS}"}]
        post(srv, {"messages": memo}, KEYS[0])
        assert cached(post(srv, {"messages": memo}, KEYS[1])) > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_cache_options", {"ttl": "forever"}),
        ("prompt_cache_options", {"mode": "explicit"}),
        ("prompt_cache_options", {"ttl": "30m", "breakpoints": 1}),
        ("prompt_cache_retention", "1w"),
        ("prompt_cache_key", "k" * 257),
    ],
)
def test_bad_session_fields_get_a_400_naming_them(
    server: LiveServer, field: str, value: object
) -> None:
    r = post(server, {"messages": [{"role": "user", "content": "hi"}], field: value})
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"] or field in str(r.json()["error"]["param"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_stock",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string", "maxLength": 8}},
                "required": ["item"],
            },
        },
    }
]


def test_a_reply_ending_in_tool_calls_is_kept_for_the_tool_result() -> None:
    """No session field at all: the tool_calls trigger keeps the turn for the tool's result."""
    with live_server(scripted(num_blocks=48, retention_budget=0.5), api_key=KEYS) as srv:
        first = [{"role": "user", "content": f"stock {WORDS}"}]
        body = {"messages": first, "tools": TOOLS, "tool_choice": "required", "max_tokens": 40}
        one = post(srv, body)
        message = one.json()["choices"][0]["message"]
        assert one.json()["choices"][0]["finish_reason"] == "tool_calls", one.text
        flood(srv)
        flood(srv)
        call = message["tool_calls"][0]
        again = [
            *first,
            {"role": "assistant", "content": message["content"], "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "42 in stock"},
        ]
        two = post(srv, {"messages": again, "tools": TOOLS, "tool_choice": "required"})
        prompt = one.json()["usage"]["prompt_tokens"]
        assert cached(two) >= prompt // 16 * 16
        # a plain turn (no tool call) of the same shape is not kept: the flood evicts it
        body["tool_choice"] = "none"
        post(srv, {**body, "messages": [{"role": "user", "content": f"answer {WORDS}"}]})
        flood(srv)
        flood(srv)
        plain = post(srv, {**body, "messages": [{"role": "user", "content": f"answer {WORDS}"}]})
        assert cached(plain) < prompt // 16 * 16


def streamed_answer(srv: LiveServer, body: dict[str, Any]) -> str:
    """The answer a streamed request's chunks carry."""
    body = {"model": "scripted", "max_tokens": 6, "temperature": 0.0, "stream": True, **body}
    headers = {"authorization": f"Bearer {KEYS[0]}"}
    parts = []
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def collaboration_turns(
    srv: LiveServer, tag: str, extra: dict[str, Any], *, stream: bool = False
) -> tuple[int, int]:
    """A vote answers turn 1, another key floods the cache, then turn 2 (a plain completion)
    re-sends the conversation with the vote's answer: its cached tokens, and the
    conversation's own length as turn 2 composes it (its prompt less the new message)."""
    first = [{"role": "user", "content": f"{tag} {WORDS}"}]
    vote = {"agents": [{"name": "voter", "count": 2}], "collaboration": {"mode": "vote"}}
    if stream:
        answer = streamed_answer(srv, {"messages": first, **vote, **extra})
    else:
        one = post(srv, {"messages": first, **vote, **extra})
        assert one.status_code == 200, one.text
        answer = one.json()["choices"][0]["message"]["content"]
    flood(srv)
    again = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    two = post(srv, {"messages": again, **extra})
    probe = post(srv, {"messages": [{"role": "user", "content": "more"}]}, KEYS[1])
    return cached(two), two.json()["usage"]["prompt_tokens"] - probe.json()["usage"][
        "prompt_tokens"
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_collaboration_turn_of_a_session_keeps_the_conversation_and_its_answer(
    stream: bool,
) -> None:
    """``prompt_cache_key`` on a collaboration retains what the next turn re-sends (the
    conversation plus the collaboration's answer): it survives the flood, every full
    block of it is a hit; without a session the same turn is evicted."""
    with live_server(scripted(num_blocks=24, retention_budget=0.5), api_key=KEYS) as srv:
        session = {"prompt_cache_key": "c1"}
        kept, conversation = collaboration_turns(srv, "agents", session, stream=stream)
        plain, _ = collaboration_turns(srv, "nokey", {}, stream=stream)
    assert conversation > 32 and kept >= conversation // 16 * 16 > plain


def test_a_lifetime_nobody_asked_for_is_learned_from_the_gaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``prompt_cache_key`` alone a turn is kept for 1.5x the 95th percentile of the
    gaps this key's sessions have shown (the default until 8 were seen): a finished
    program's last turn, which nobody will extend, stops holding blocks soon after its
    session would have come back, not 30 minutes later. An explicit TTL stays as asked."""
    import microagent.server._sessions as sessions_module
    from microagent.engine_bridge import KVHandle
    from microagent.testing import ScriptedEngine

    clock = [1000.0]
    # the module's clock only: patching time.monotonic itself would freeze every event
    # loop's clock in the process (this module's live server's too: its loop then sleeps
    # for hours, and its shutdown never comes)
    monkeypatch.setattr(sessions_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    engine = ScriptedEngine(block_size=4)
    sessions = sessions_module.Sessions(SessionSettings(default_ttl=1800.0))
    ttls = []

    async def turns() -> None:
        tokens: tuple[int, ...] = tuple(range(8))
        for turn in range(12):
            prompt = KVHandle(tokens, model=engine.model)
            plan = sessions.plan("t", engine, prompt, cache_key="s", ttl=None, retention=None,
                                 tools=False)  # fmt: skip
            assert plan.retain is not None
            ttls.append(plan.retain.ttl)
            tokens = (*tokens, *range(100 + 8 * turn, 108 + 8 * turn))  # prompt + output
            await sessions.finished("t", engine, plan, KVHandle(tokens, model=engine.model),
                                    tool_calls=False, ok=True)  # fmt: skip
            clock[0] += 2.0 + turn % 3  # gaps of 2, 3 and 4 seconds
            tokens = (*tokens, *range(500 + 4 * turn, 504 + 4 * turn))  # the next message

    anyio.run(turns)
    assert ttls[:8] == [1800.0] * 8  # fewer than 8 gaps seen: the server's default
    assert ttls[8:] == [1.5 * 4.0] * 4  # then 1.5x the gaps' p95 (4 s)
    explicit = sessions.plan("t", engine, KVHandle(tuple(range(8)), model=engine.model),
                             cache_key="s", ttl="10m", retention=None, tools=False)  # fmt: skip
    assert explicit.retain is not None and explicit.retain.ttl == 600.0
