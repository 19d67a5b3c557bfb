"""RemoteBridge against a fake endpoint of the tests' own: streaming, usage, faults, keys.

The fake (``tests/_fake_openai.py``) serves real sockets, so retries, timeouts
and closed connections are the client's real behaviour. Mixed collaborations
run local ScriptedEngine roles beside the remote one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from _fake_openai import FakeEndpoint, Reply, fake_endpoint
from microagent import CollaborationFailed, RemoteBridge, RemoteError
from microagent.collab import (
    Graph,
    InvalidCollaboration,
    cascade,
    collaborate,
    collaboration_modes,
    vote,
)
from microagent.engine_bridge import EngineBridgeError, RequestRefused, Sampling
from microagent.engine_bridge.remote._bridge import retry_after_seconds
from microagent.server import create_app
from microagent.server._remote import remote_cause
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

KEY = "sk-test-4b1d-secret-key"
QUESTION = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]


def remote(url: str, **kwargs: Any) -> RemoteBridge:
    options: dict[str, Any] = {"api_key": KEY, "backoff": 0.01, "timeout": 5.0}
    options.update(kwargs)
    return RemoteBridge("big", url, model="fake-model", **options)


@asynccontextmanager
async def serving(
    *replies: Reply, **kwargs: Any
) -> AsyncIterator[tuple[FakeEndpoint, RemoteBridge]]:
    """A fake endpoint serving ``replies`` and an open bridge to it."""
    async with fake_endpoint(*replies) as fake, remote(fake.url, **kwargs) as bridge:
        yield fake, bridge


def prompt(bridge: RemoteBridge) -> Any:
    return bridge.chat.prompt(QUESTION)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every log record of every logger (httpx and httpcore at DEBUG included)."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    root = logging.getLogger()
    handler, level = Keep(logging.DEBUG), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# -- composition ----------------------------------------------------------------------


def test_a_prompt_is_the_chat_messages_themselves() -> None:
    """No ChatML text is parsed back: the handle carries the messages (test_remote_chat.py)."""
    bridge = RemoteBridge("big", "http://127.0.0.1:1/v1")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Two\nlines, with <b>tags</b>."},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Sure?"},
    ]
    handle = bridge.chat.prompt(messages)
    assert handle.conversation is not None and handle.conversation.messages() == messages


def test_retry_after_takes_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    date = "Wed, 21 Oct 2015 07:28:10 GMT"
    assert retry_after_seconds(date, now=1445412480.0) == pytest.approx(10.0)


def test_remote_error_is_an_engine_bridge_error_naming_the_remote() -> None:
    err = RemoteError("big", "boom", status=503, attempts=3)
    assert isinstance(err, EngineBridgeError)
    assert "'big'" in str(err) and "503" in str(err) and "3 attempt" in str(err)


# -- streaming and accounting -----------------------------------------------------------------


async def test_streams_text_and_reports_the_endpoints_usage() -> None:
    async with serving(Reply(("Yes", ", it", " is."), usage=(42, 3, 16))) as (fake, bridge):
        texts = []
        async with bridge.stream(prompt(bridge), Sampling(max_tokens=9)) as gen:
            async for delta in gen:
                texts.append(delta.text)
        result = gen.result
    assert result is not None
    assert texts == ["Yes", ", it", " is."] and result.content == "Yes, it is."
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (42, 3, 16)
    stats = bridge.stats()
    assert (stats.prompt_tokens, stats.completion_tokens, stats.requests_finished) == (42, 3, 1)
    (seen,) = fake.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    body = seen.body
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == QUESTION and body["max_tokens"] == 9


async def test_choices_travel_as_a_json_schema_and_come_back_as_the_choice() -> None:
    async with serving(Reply(('{"answer"', ': "no"}'))) as (fake, bridge):
        result = await bridge.generate(prompt(bridge), Sampling(choices=["yes", "no"]))
    assert result.content == "no"
    schema = fake.requests[0].body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["answer"]["enum"] == ["yes", "no"]


async def test_what_chat_completions_cannot_carry_is_refused_by_name() -> None:
    bridge = remote("http://127.0.0.1:1/v1")
    for sampling, field in [
        (Sampling(regex="[a-z]+"), "regex"),
        (Sampling(logprobs=2), "logprobs"),
        (Sampling(top_k=5), "top_k"),
    ]:
        with pytest.raises(RequestRefused) as info:
            bridge.stream(prompt(bridge), sampling)
        assert info.value.field == field


# -- faults ------------------------------------------------------------------------------------


async def test_429_waits_the_retry_after_then_succeeds() -> None:
    limited = Reply(status=429, headers={"retry-after": "1"}, body='{"error": "slow down"}')
    async with serving(limited, Reply(("ok",))) as (fake, bridge):
        t0 = anyio.current_time()
        result = await bridge.generate(prompt(bridge), Sampling())
        waited = anyio.current_time() - t0
    assert result.content == "ok"
    assert len(fake.requests) == 2 and bridge.retries == 1
    assert waited >= 1.0  # the header's second, not the 0.01 s backoff


async def test_retry_after_beyond_the_bound_fails_at_once() -> None:
    limited = Reply(status=429, headers={"retry-after": "120"})
    async with serving(limited, max_retry_after=5.0) as (fake, bridge):
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
    assert info.value.status == 429 and info.value.attempts == 1
    assert len(fake.requests) == 1


async def test_5xx_is_retried_up_to_the_bound_then_a_typed_error_without_the_key() -> None:
    echo = Reply(status=500, body=f'{{"error": "bad key Bearer {KEY}"}}')
    async with serving(echo, max_attempts=3) as (fake, bridge):
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
    err = info.value
    assert (err.remote, err.status, err.attempts) == ("big", 500, 3)
    assert len(fake.requests) == 3
    assert KEY not in str(err) and "***" in str(err)
    assert bridge.stats().requests_failed == 1 and not bridge.live_requests()


async def test_a_refusal_is_not_retried() -> None:
    async with serving(Reply(status=400, body='{"error": "bad model"}')) as (fake, bridge):
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
    assert info.value.status == 400 and "bad model" in str(info.value)
    assert len(fake.requests) == 1


async def test_a_slow_endpoint_times_out_within_the_bound() -> None:
    async with serving(Reply(delay=10.0), timeout=0.3, max_attempts=2) as (fake, bridge):
        t0 = anyio.current_time()
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
        took = anyio.current_time() - t0
    assert info.value.status is None and "Timeout" in info.value.reason
    assert info.value.attempts == 2 and len(fake.requests) == 2
    assert took < 3.0


async def test_a_stream_cut_midway_is_retried_and_resumed_without_repeating() -> None:
    pieces = ("One", " two", " three", " four")
    async with serving(Reply(pieces, cut_after=2), Reply(pieces)) as (fake, bridge):
        texts = []
        async with bridge.stream(prompt(bridge), Sampling()) as gen:
            async for delta in gen:
                texts.append(delta.text)
    assert "".join(texts) == "One two three four"  # nothing delivered twice
    assert len(fake.requests) == 2 and bridge.retries == 1


async def test_a_cut_stream_whose_retry_diverges_is_a_typed_error() -> None:
    cut = Reply(("One", " two", " three"), cut_after=2)
    async with serving(cut, Reply(("Uno", " dos"))) as (fake, bridge):
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
    assert "differs" in info.value.reason and len(fake.requests) == 2


async def test_a_cut_stream_whose_retry_stops_short_is_a_typed_error() -> None:
    cut = Reply(("One", " two", " three"), cut_after=2)
    async with serving(cut, Reply(("One",))) as (fake, bridge):
        with pytest.raises(RemoteError) as info:
            await bridge.generate(prompt(bridge), Sampling())
    assert "differs" in info.value.reason and len(fake.requests) == 2


async def test_cancelling_closes_the_remote_connection() -> None:
    async with serving(Reply(("first", " never"), hang_after=1)) as (fake, bridge):
        async with bridge.stream(prompt(bridge), Sampling()) as gen:
            async for delta in gen:
                assert delta.text == "first"
                break  # the consumer leaves: the generation aborts
        with anyio.fail_after(5):
            await fake.closed.wait()  # the endpoint saw the connection close
        assert gen.result is not None and gen.result.finish_reason == "abort"
        assert not bridge.live_requests() and bridge.stats().requests_aborted == 1


async def test_a_cancelled_task_closes_the_connection_too() -> None:
    async with serving(Reply(("first", " never"), hang_after=1)) as (fake, bridge):
        started = anyio.Event()

        async def consume() -> None:
            async with bridge.stream(prompt(bridge), Sampling()) as gen:
                async for _ in gen:
                    started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await started.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(5):
            await fake.closed.wait()
        assert not bridge.live_requests()


# -- keys ---------------------------------------------------------------------------------------


async def test_keys_are_never_sent_elsewhere_logged_or_shown(
    records: list[logging.LogRecord],
) -> None:
    async with fake_endpoint(Reply(("stolen",))) as elsewhere:
        moved = Reply(status=307, headers={"location": f"{elsewhere.url}/chat/completions"})
        async with serving(moved) as (_, bridge):
            assert KEY not in repr(bridge)
            with pytest.raises(RemoteError) as info:
                await bridge.generate(prompt(bridge), Sampling())
        assert not elsewhere.requests  # the redirect was not followed
    assert info.value.status == 307 and KEY not in str(info.value)
    logged = "\n".join(r.getMessage() + repr(r.args) for r in records)
    assert "HTTP Request" in logged or "send_request" in logged  # httpx/httpcore did log
    assert KEY not in logged


async def test_the_key_comes_from_the_named_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = "MICROAGENT_TEST_REMOTE_KEY"
    monkeypatch.setenv(env, KEY)
    async with (
        fake_endpoint(Reply()) as fake,
        RemoteBridge("big", fake.url, api_key_env=env) as bridge,
    ):
        await bridge.generate(prompt(bridge), Sampling())
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    monkeypatch.delenv(env)
    with pytest.raises(RemoteError) as info:
        await RemoteBridge("big", fake.url, api_key_env=env).open()
    assert env in str(info.value)


# -- mixed collaborations ------------------------------------------------------------------------


async def test_cascade_escalates_to_the_remote_only_on_disagreement() -> None:
    async with (
        serving(Reply(("ACCEPT",), usage=(57, 2, 0))) as (fake, big),
        ScriptedEngine(script=["yes", "no"]) as local,
        ScriptedEngine(script=["yes"]) as agreeing,
    ):
        outcome = await cascade(
            local, QUESTION, verifier_model="big", engines={"big": big}, max_tokens=8
        )
        quiet = await cascade(agreeing, QUESTION, verifier_model="big", engines={"big": big})
    assert outcome.details["escalated"] is True and outcome.details["retokenized"]
    assert outcome.details["verdict"] == "accepted" and outcome.answer in ("yes", "no")
    by_model = outcome.usage_by_model
    assert by_model["big"].remote and not by_model["scripted"].remote
    assert (by_model["big"].prompt_tokens, by_model["big"].requests) == (57, 1)
    assert by_model["scripted"].requests == 2
    # the drafts crossed as text, inside the verifier's user turn
    sent = fake.requests[0].body["messages"]
    other = "no" if outcome.answer == "yes" else "yes"  # accepted: the first draft stands
    assert f"Draft 1: {outcome.answer}" in sent[-1]["content"]
    assert f"Draft 2: {other}" in sent[-1]["content"]
    # agreeing drafters never call the remote
    assert quiet.details["escalated"] is False and len(fake.requests) == 1


MIXED_AGENTS: dict[str, list[dict[str, Any]]] = {
    "cascade": [
        {"name": "drafter", "count": 2},
        {"name": "verifier", "role": "verifier", "model": "big"},
    ],
    "aggregate": [
        {"name": "proposer", "count": 2},
        {"name": "aggregator", "role": "aggregator", "model": "big"},
    ],
    "reflect": [{"name": "drafter"}, {"name": "critic", "model": "big"}],
    # the remote writes an expression and, when none computes, answers directly
    "compute": [{"name": "far", "model": "big"}, {"name": "near", "count": 2}],
}
#: the question a mode needs to use every agent (compute: one with numbers)
MIXED_QUESTIONS = {"compute": "What is 2 + 2?"}


@pytest.mark.parametrize("mode", sorted(collaboration_modes()))
async def test_every_mode_runs_with_local_and_remote_agents(mode: str) -> None:
    options: dict[str, Any] = {"max_tokens": 8}
    agents = MIXED_AGENTS.get(mode, [{"name": "near", "count": 2}, {"name": "far", "model": "big"}])
    if mode == "graph":
        options["graph"] = (
            Graph()
            .node("near", "Answer briefly.", count=2)
            .node("far", "Give the final answer.", model="big", join=True)
            .edge("near", "far")
        )
        agents = []
    if mode == "cascade":
        options["verify"] = "always"
    async with (
        serving(Reply(("yes",))) as (fake, big),
        ScriptedEngine(script=["yes", "no"]) as local,
    ):
        question = MIXED_QUESTIONS.get(mode, QUESTION)
        outcome = await collaborate(
            local, mode, question, agents or None, engines={"big": big}, **options
        )
        assert not local.live_requests() and not big.live_requests()
    by_model = outcome.usage_by_model
    assert by_model["big"].remote and by_model["big"].requests >= 1
    assert not by_model["scripted"].remote and by_model["scripted"].requests >= 1
    assert by_model["big"].prompt_tokens == 11 * by_model["big"].requests  # the endpoint's count
    assert outcome.usage.prompt_tokens == sum(u.prompt_tokens for u in by_model.values())
    # only text crossed: plain chat messages, no local chat-template markers inside
    for seen in fake.requests:
        for message in seen.body["messages"]:
            assert message["role"] in ("system", "user", "assistant")
            assert "<|im_" not in message["content"]


async def test_auto_reads_no_logprobs_from_a_remote_and_modes_that_need_them_refuse_it() -> None:
    agents = [{"name": "near", "count": 2}, {"name": "far", "model": "big"}]
    async with (
        serving(Reply(("yes",))) as (fake, big),
        ScriptedEngine(script=["yes", "no"]) as local,
    ):
        closed = await collaborate(
            local, "auto", QUESTION, agents, engines={"big": big}, answer=["yes", "no"]
        )
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(
                local, "best_of", QUESTION, agents, engines={"big": big}, judge="likelihood"
            )
        with pytest.raises(InvalidCollaboration) as soft:
            await collaborate(
                local,
                "vote",
                QUESTION,
                agents,
                engines={"big": big},
                answer=["yes", "no"],
                style="direct",
                soft=True,
            )
        assert not local.live_requests() and not big.live_requests()
    assert soft.value.field == "collaboration.soft" and "'big'" in str(soft.value)
    assert closed.details["strategy"] == "vote" and "no logprobs" in closed.details["why"]
    assert closed.answer in ("yes", "no")
    assert all("logprobs" not in seen.body for seen in fake.requests)
    assert info.value.field == "collaboration.judge" and "'big'" in str(info.value)
    assert len(fake.requests) == 1  # both refused before any request


async def test_a_remote_candidate_is_judged_by_the_word_it_says() -> None:
    """A remote model reports no logprobs: its judge step asks for none and reads the word."""
    agents = [{"name": "near"}, {"name": "far", "model": "big"}]
    async with (
        serving(Reply(("yes",))) as (fake, big),
        ScriptedEngine(script=["no"]) as local,
    ):
        outcome = await collaborate(
            local, "best_of", QUESTION, agents, engines={"big": big}, judge="self", max_tokens=8
        )
    scores = {c["agent"]: c["score"] for c in outcome.details["candidates"]}
    assert scores["far"] == 1.0 and outcome.details["judged"] == 2
    assert len(fake.requests) == 2  # its answer, then its judgement
    assert all("logprobs" not in seen.body for seen in fake.requests)


async def test_a_down_remote_fails_typed_while_local_roles_keep_going() -> None:
    async with (
        serving(Reply(status=503, body="down"), max_attempts=3, backoff=0.5) as (fake, big),
        ScriptedEngine(script=["yes"], decode_time_per_token=0.01) as local,
    ):
        agents = [{"name": "voter", "count": 2}, {"name": "far", "model": "big"}]
        local_done: list[float] = []
        failures: list[tuple[float, CollaborationFailed]] = []

        async def local_only() -> None:
            out = await vote(local, QUESTION, voters=3, choices=["yes", "no"])
            assert out.answer == "yes"
            local_done.append(anyio.current_time())

        async def mixed() -> None:
            try:
                await collaborate(
                    local,
                    "vote",
                    QUESTION,
                    agents,
                    engines={"big": big},
                    answer={"choices": ["yes", "no"]},
                    early_stop=False,
                )
            except CollaborationFailed as exc:
                failures.append((anyio.current_time(), exc))

        t0 = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(mixed)
            tg.start_soon(local_only)
        ((failed_at, failure),) = failures
        cause = remote_cause(failure)
        assert cause is not None and cause.remote == "big" and cause.attempts == 3
        assert len(fake.requests) == 3
        # the local-only vote finished while the remote was still being retried
        assert local_done and local_done[0] < failed_at
        assert failed_at - t0 >= 1.5  # two backoffs (0.5 s, 1 s) it did not block on
        assert not local.live_requests() and not big.live_requests()


async def test_http_a_down_remote_is_a_502_naming_it_and_the_server_stays_up() -> None:
    echo = Reply(status=500, body=f"upstream said {KEY}")
    async with (
        serving(echo) as (_, big),
        ScriptedEngine(script=["yes"]) as local,
    ):
        app = create_app({"scripted": local, "big": big})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {
                "messages": QUESTION,
                "max_tokens": 8,
                "agents": [{"name": "voter", "count": 2}, {"name": "far", "model": "big"}],
                "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
            }
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 502, r.text
            error = r.json()["error"]
            assert error["code"] == "remote_error" and "'big'" in error["message"]
            assert KEY not in r.text
            plain = {"messages": QUESTION, "max_tokens": 8, "model": "big"}
            r = await client.post("/v1/chat/completions", json=plain)
            assert r.status_code == 502 and KEY not in r.text
            local_only = {**body, "agents": [{"name": "voter", "count": 2}]}
            r = await client.post("/v1/chat/completions", json=local_only)
            assert r.status_code == 200
            assert set(r.json()["usage"]["by_model"]) == {"scripted"}
            assert (await client.get("/health")).json()["models"] == ["scripted", "big"]
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200 and KEY not in metrics.text


async def test_http_a_hung_remote_blocks_nothing_and_leaving_closes_its_stream() -> None:
    async with (
        serving(Reply(delay=60.0), timeout=120.0) as (fake, big),
        ScriptedEngine(script=["yes"]) as local,
    ):
        app = create_app({"scripted": local, "big": big})
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://test") as client,
            anyio.create_task_group() as tg,
        ):
            mixed = {
                "messages": QUESTION,
                "max_tokens": 8,
                "agents": [{"name": "near", "count": 2}, {"name": "far", "model": "big"}],
                "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
            }
            tg.start_soon(lambda: client.post("/v1/chat/completions", json=mixed))
            with anyio.fail_after(10):
                await fake.arrived.wait()  # the remote voter is waiting on the endpoint
            assert (await client.get("/health")).status_code == 200
            local_only = {**mixed, "agents": [{"name": "near", "count": 3}]}
            r = await client.post("/v1/chat/completions", json=local_only)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "yes"
            assert big.live_requests()  # still hung meanwhile
            tg.cancel_scope.cancel()  # the client leaves
        with anyio.fail_after(5):
            await fake.closed.wait()  # the remote's connection was closed
        assert not big.live_requests() and not local.live_requests()


async def test_http_a_streamed_collaboration_reports_usage_by_model() -> None:
    async with (
        serving(Reply(('{"answer": "yes"}',), usage=(21, 4, 0))) as (_, big),
        ScriptedEngine(script=["yes"]) as local,
    ):
        app = create_app({"scripted": local, "big": big})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            body = {
                "messages": QUESTION,
                "max_tokens": 8,
                "stream": True,
                "stream_options": {"include_usage": True},
                "agents": [{"name": "near", "count": 2}, {"name": "far", "model": "big"}],
                "collaboration": {
                    "mode": "vote",
                    "early_stop": False,
                    "answer": {"choices": ["yes", "no"]},
                },
            }
            r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    chunks = [
        json.loads(line[5:])
        for line in r.text.splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage["by_model"]["big"] == {
        "prompt_tokens": 21,
        "cached_tokens": 0,
        "completion_tokens": 4,
        "requests": 1,
        "remote": True,
    }
    assert usage["by_model"]["scripted"]["requests"] == 2


async def test_compute_steps_on_a_remote_model_read_first_lines_and_show_the_values() -> None:
    """A remote chat model takes no regex: each step is its reply's first line (code marks
    dropped), and the steps so far, with the sandbox's values, go into its next question."""
    question = "A box holds 6 eggs. Tom buys 4 boxes and breaks 5 eggs. How many eggs are left?"
    replies = (Reply(("```\nboxes = 6 * 4\n```",)), Reply(("answer = boxes - 5\nso 19",)))
    async with serving(*replies) as (fake, big), ScriptedEngine() as local:
        outcome = await collaborate(
            local, "compute", question, [{"name": "far", "model": "big"}],
            engines={"big": big}, steps=2,
        )  # fmt: skip
    assert (outcome.answer, outcome.details["path"]) == ("19", "computed")
    (program,) = outcome.details["programs"]
    assert [(s["step"], s["value"]) for s in program["steps"]] == [
        ("boxes = 6 * 4", 24),
        ("answer = boxes - 5", 19),
    ]
    first, second = (json.dumps(r.body["messages"]) for r in fake.requests)
    assert "# = 24" not in first and "boxes = 6 * 4  # = 24" in second
