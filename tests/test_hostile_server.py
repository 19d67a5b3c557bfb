"""Bounds on requests, as an attacker who reaches the port meets them (issue 36).

Each test is the attacker's: it failed on the server before these bounds. A
default per-request token budget sized to the model and a wall clock end every
collaboration; one API key cannot hold every collaboration slot; a client that
stops reading its stream is cut and its work cancelled, while ``/health`` stays
quick; a timeout is a 504 and a graph whose conditions pruned its output a 422,
both in the API's error shape; ``stop``, ``seed`` and ``top_p`` reach every agent
of every mode. The server is the real app under uvicorn on the ScriptedEngine, watched
for its whole life (``live_server(watch_health=True)``): another process polls
``GET /health`` every 250 ms, and each answer must come within a second.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import anyio
import httpx
import pytest
from microagent.cli import build_parser
from microagent.engine_bridge import EngineBridge, KVHandle, RequestRefused, Sampling
from microagent.server import EventBuffer, KeyQuota, ServerLimits
from microagent.server._sse import SSE_ITEM_BYTES, StreamItem
from microagent.testing import ScriptedEngine
from test_server_helpers import LiveServer, eventually, live_server, scripted

USER = [{"role": "user", "content": "Is the sky blue?"}]
KEYS = ("key-alpha-s3cret", "key-bravo-s3cret")


def post(srv: LiveServer, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll server state owned by the server's thread until ``predicate()`` holds."""
    anyio.run(lambda: eventually(predicate, timeout))


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


# -- the default per-request budget ---------------------------------------------------------


def engines_with_context(length: int) -> Callable[[], Mapping[str, EngineBridge]]:
    """One ScriptedEngine that states ``max_model_len`` (``small``) beside one that does not."""

    def make() -> Mapping[str, EngineBridge]:
        small = ScriptedEngine("small", reply_words=(60, 60))
        small.max_model_len = length  # type: ignore[attr-defined]
        return {"scripted": ScriptedEngine(), "small": small}

    return make


def test_the_default_budget_is_16_contexts_of_the_model_and_refuses_a_worse_worst_case() -> None:
    """Before: no budget by default; 64 voters x 1024 tokens ran (and a graph ran unbounded)."""
    with live_server(engines_with_context(512), watch_health=True) as srv:
        wide = {
            "messages": USER,
            "max_tokens": 1024,
            "agents": [{"name": "a", "count": 32}, {"name": "b", "count": 32}],
            "collaboration": {"mode": "vote"},
        }
        r = post(srv, wide)  # 128 turns of up to 1024 tokens: over 16 x 4096 (no stated context)
        assert r.status_code == 400, r.text
        error = error_of(r)
        assert (error["param"], error["code"]) == ("max_tokens", "token_budget_exceeded")
        assert "budget of 65536" in error["message"]
        assert srv.engines["scripted"].history == []  # type: ignore[attr-defined]
        # the same formula on a model that states its context: 16 x 512
        narrow = {**wide, "model": "small", "max_tokens": 256}
        narrow["agents"] = [{"name": "v", "count": 16}]  # 32 turns of 256 and their prompts
        r = post(srv, narrow)
        assert r.status_code == 400, r.text
        assert "budget of 8192" in error_of(r)["message"]
        ok = {**narrow, "agents": [{"name": "v", "count": 3}], "max_tokens": 16}
        assert post(srv, ok).status_code == 200


def writer_critic_loop(max_tokens: int) -> dict[str, Any]:
    """A graph whose loop always fires, as often as its maximum allows: 34 turns."""
    return {
        "messages": USER,
        "max_tokens": max_tokens,
        "collaboration": {
            "mode": "graph",
            "nodes": [{"name": "writer"}, {"name": "critic"}],
            "edges": [
                {"from": "writer", "to": "critic"},
                {"from": "critic", "to": "writer", "max_iterations": 16},
            ],
            "entry": "writer",
            "output": "critic",
        },
    }


def test_a_looping_graph_is_stopped_by_the_default_budget_as_it_runs() -> None:
    """Before: a graph loop ran every iteration it declared, however many tokens that took.
    Its declared worst case (34 turns reading the context) fits 16 x 256; its prompts grow
    with each answer fed back, and the running meter stops it."""
    graph = {**writer_critic_loop(64), "model": "small"}
    # budget 16 x 256 = 4096 tokens
    with live_server(engines_with_context(256), watch_health=True) as srv:
        r = post(srv, graph)
        assert r.status_code == 400, r.text
        error = error_of(r)
        assert error["code"] == "token_budget_exceeded" and "budget of 4096" in error["message"]
        engine = srv.engines["small"]
        stats = engine.stats()
        assert stats.prompt_tokens + stats.completion_tokens <= 4096  # what it used
        assert 0 < len(engine.history) < 34  # type: ignore[attr-defined]  # ran, then was cut


def test_one_request_never_spends_more_than_its_keys_tokens_per_minute() -> None:
    """Before: under ``--key-tokens-per-minute 3000`` one looping graph spent 51-78 k tokens
    in 6 s (its worst case was unknown, so it was admitted and never metered). Now a graph
    whose declared worst case is over the minute is a 400 before it runs, and one that fits
    is stopped by the running meter at the minute, and what it used stays charged."""
    limits = ServerLimits(key_quota=KeyQuota(tokens_per_minute=3000))
    slow = scripted(reply_words=(40, 40))
    with live_server(slow, api_key=list(KEYS), limits=limits, watch_health=True) as srv:
        engine = srv.engines["scripted"]
        r = post(srv, writer_critic_loop(200), KEYS[0])  # 34 turns of up to 200 tokens
        assert r.status_code == 400, r.text
        assert error_of(r)["param"] == "max_tokens"
        assert engine.history == []  # type: ignore[attr-defined]  # refused before it ran
        # fits as declared; its prompts grow as it runs
        r = post(srv, writer_critic_loop(48), KEYS[0])
        stats = engine.stats()
        assert stats.prompt_tokens + stats.completion_tokens <= 3000, stats
        assert r.status_code == 400, r.text
        assert error_of(r)["code"] == "token_budget_exceeded"
        assert 0 < len(engine.history) < 34  # type: ignore[attr-defined]  # ran, then was cut
        # what it used stays charged: most of the minute no longer fits, another key's does
        assert post(srv, {"messages": USER, "max_tokens": 2900}, KEYS[0]).status_code == 429
        assert post(srv, {"messages": USER, "max_tokens": 8}, KEYS[1]).status_code == 200


def test_serve_help_shows_the_budget_formula_and_the_wall_clock(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "16 x the max_model_len of the request's model" in text
    assert "--request-timeout SECONDS" in text and "(default 300)" in text
    assert "--key-max-collaborations" in text


# -- the wall clock and honest outcomes ------------------------------------------------------


def test_a_collaboration_past_its_timeout_is_a_504_in_the_error_shape() -> None:
    """Before: ``collaboration.timeout`` expiring answered a plain 500."""
    slow = scripted(decode_time_per_token=0.05, reply_words=(200, 200))
    body = {
        "messages": USER,
        "max_tokens": 200,
        "agents": [{"name": "v", "count": 2}],
        "collaboration": {"mode": "vote", "timeout": 0.3},
    }
    with live_server(slow, limits=ServerLimits(request_timeout=60), watch_health=True) as srv:
        r = post(srv, body)
        assert r.status_code == 504, r.text
        error = error_of(r)
        assert (error["type"], error["code"], error["param"]) == (
            "timeout_error",
            "collaboration_timeout",
            "collaboration.timeout",
        )
        wait_for(lambda: srv.engines["scripted"].stats().requests_live == 0)
        # more than the server allows is refused before anything runs
        r = post(srv, {**body, "collaboration": {"mode": "vote", "timeout": 61}})
        assert r.status_code == 400 and error_of(r)["param"] == "collaboration.timeout"
        doc = httpx.get(f"{srv.url}/openapi.json").json()
        assert "504" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]


def test_every_collaboration_ends_by_the_servers_wall_clock() -> None:
    """Before: a collaboration without ``collaboration.timeout`` had no time limit at all."""
    slow = scripted(decode_time_per_token=0.05, reply_words=(200, 200))
    body = {
        "messages": USER,
        "max_tokens": 200,
        "agents": [{"name": "v", "count": 2}],
        "collaboration": {"mode": "vote"},
    }
    with live_server(slow, limits=ServerLimits(request_timeout=0.3), watch_health=True) as srv:
        r = post(srv, body)
        assert r.status_code == 504, r.text
        assert error_of(r)["code"] == "collaboration_timeout"


def test_a_graph_whose_output_node_was_pruned_is_a_documented_422() -> None:
    """Before: a graph whose conditions pruned its output answered 500."""
    graph = {
        "messages": USER,
        "max_tokens": 16,
        "collaboration": {
            "mode": "graph",
            "nodes": [{"name": "a"}, {"name": "b"}],
            "edges": [{"from": "a", "to": "b", "when": {"contains": "never-said-xyzzy"}}],
            "entry": "a",
            "output": "b",
        },
    }
    with live_server(scripted(), watch_health=True) as srv:
        r = post(srv, graph)
        assert r.status_code == 422, r.text
        error = error_of(r)
        assert (error["code"], error["param"]) == ("no_answer", "collaboration.output")
        assert "'b' was pruned" in error["message"]
        doc = httpx.get(f"{srv.url}/openapi.json").json()
        documented = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["422"]
        assert "no_answer" in documented["description"]


# -- fair shares of the collaboration slots --------------------------------------------------


def test_one_key_cannot_hold_every_collaboration_slot() -> None:
    """Before: under 4 slots, one key held all 4 and the other key got 429."""
    slow = scripted(decode_time_per_token=0.05, reply_words=(100, 100))
    limits = ServerLimits(max_concurrent_collaborations=4)
    body = {
        "messages": USER,
        "max_tokens": 100,
        "stream": True,
        "agents": [{"name": "v", "count": 2}],
        "collaboration": {"mode": "vote"},
    }
    with live_server(slow, api_key=list(KEYS), limits=limits, watch_health=True) as srv:

        async def scenario() -> None:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(
                    httpx.AsyncClient(base_url=srv.url, timeout=30)
                )
                statuses = []
                for _ in range(4):  # the first key asks for every slot
                    stream = await stack.enter_async_context(
                        client.stream(
                            "POST",
                            "/v1/chat/completions",
                            json=body,
                            headers={"authorization": f"Bearer {KEYS[0]}"},
                        )
                    )
                    statuses.append(stream.status_code)
                    if stream.status_code == 429:
                        await stream.aread()
                        error = json.loads(stream.content)["error"]
                        assert error["code"] == "collaboration_share_exceeded"
                        assert stream.headers["retry-after"]
                assert statuses == [200, 200, 429, 429]
                other = await client.post(
                    "/v1/chat/completions",
                    json={**body, "stream": False, "max_tokens": 4},
                    headers={"authorization": f"Bearer {KEYS[1]}"},
                )
                assert other.status_code == 200, other.text

        anyio.run(scenario)


# -- a client that stops reading ---------------------------------------------------------------


def silent_client(port: int, body: dict[str, Any]) -> socket.socket:
    """A raw client that sends a streaming request and then reads nothing (a tiny window)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def read_until(sock: socket.socket, marker: bytes | None, timeout: float = 30.0) -> bytes:
    """Read what the server sent until ``marker`` (None: until it closes the connection)."""
    sock.settimeout(timeout)
    got = b""
    while True:
        chunk = sock.recv(65536)
        got += chunk
        if not chunk or (marker is not None and marker in got):
            return got


def cancelled(srv: LiveServer, mode: str) -> float:
    value: float = srv.state.metrics.value(
        "microagent:collaborations_total", mode=mode, status="cancelled"
    )
    return value


DEBATE = {
    "messages": USER,
    "max_tokens": 200,
    "stream": True,
    "agents": [{"name": "d", "count": 3}],
    "collaboration": {"mode": "debate", "rounds": 16},
}


def test_a_client_that_reads_nothing_is_cut_and_its_collaboration_cancelled() -> None:
    """Before: the server kept generating for a client that read nothing, holding its events."""
    slow = scripted(decode_time_per_token=0.002, reply_words=(200, 200))
    limits = ServerLimits(sse_send_timeout=1.0)
    with live_server(slow, limits=limits, send_buffer=4096, watch_health=True) as srv:
        engine = srv.engines["scripted"]
        sock = silent_client(srv.port, DEBATE)
        with sock:
            wait_for(lambda: cancelled(srv, "debate") == 1)  # a write waited 1 s: gone
            wait_for(lambda: engine.stats().requests_live == 0)
            assert engine.stats().requests_aborted > 0
            # the server ended the connection: the client reads what it had written, then EOF
            assert read_until(sock, None).startswith(b"HTTP/1.1 200")
        assert srv.state.requests == 0 and srv.state.collaborations == 0


def test_a_stream_whose_backlog_overflows_ends_with_its_reason_and_cancels_its_work() -> None:
    """Before: every agent event was kept for a client that read nothing, without a bound."""
    slow = scripted(decode_time_per_token=0.002, reply_words=(200, 200))
    limits = ServerLimits(max_sse_bytes=8 * SSE_ITEM_BYTES, sse_send_timeout=120)
    with live_server(slow, limits=limits, send_buffer=4096, watch_health=True) as srv:
        engine = srv.engines["scripted"]
        with silent_client(srv.port, DEBATE) as sock:
            wait_for(lambda: cancelled(srv, "debate") == 1)
            wait_for(lambda: engine.stats().requests_live == 0)
            # the client reads at last: the backlog was dropped, the last words say why
            tail = read_until(sock, b"data: [DONE]")
        assert b'"code":"stream_backlog_exceeded"' in tail
        assert srv.state.requests == 0


def essential(i: int) -> StreamItem:
    return StreamItem(build=lambda _t: {"event": i}, owner=f"agent:{i % 3}")


def delta(i: int) -> StreamItem:
    return StreamItem(
        build=lambda t: {"text": t},
        text="token " * 50,
        owner=f"agent:{i % 3}",
        mergeable=True,
        droppable=True,
    )


def test_a_stream_buffer_never_holds_more_than_its_bound() -> None:
    """Before: a merged delta grew without end, and every other event was always kept."""
    bound = 16 * SSE_ITEM_BYTES
    buf = EventBuffer(8, bound)
    told: list[bool] = []
    buf.on_overflow = lambda: told.append(True)
    for i in range(10_000):  # nobody reads
        buf.put(delta(i))
        assert buf.pending_bytes <= bound
        if i % 50 == 0:
            buf.put(essential(i))
        assert buf.pending_bytes <= bound
    assert buf.peak_bytes <= bound
    assert buf.overflowed and told == [True]
    assert len(buf) == 2  # what waited was dropped: the error event and [DONE] remain
    payloads = [buf._items[0].build(""), buf._items[1].build("")]
    assert payloads[0]["error"]["code"] == "stream_backlog_exceeded"  # type: ignore[index]
    assert payloads[1] == "[DONE]"


# -- stop, seed and top_p in every mode ------------------------------------------------------

MODES: dict[str, dict[str, Any]] = {
    "vote": {"mode": "vote"},
    "debate": {"mode": "debate", "rounds": 2},
    "reflect": {"mode": "reflect", "rounds": 1},
    "aggregate": {"mode": "aggregate"},
    "cascade": {"mode": "cascade"},
    "best_of": {"mode": "best_of"},
    "auto": {"mode": "auto"},
    "compute": {"mode": "compute"},  # nothing to compute here: one greedy call
    "graph": {
        "mode": "graph",
        "nodes": [{"name": "a"}, {"name": "b"}],
        "edges": [{"from": "a", "to": "b"}],
        "entry": "a",
        "output": "b",
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(
        scripted(), limits=ServerLimits(allow_calculator=True), watch_health=True
    ) as srv:
        yield srv


def test_every_mode_is_covered() -> None:
    """Every built-in mode (a demo's or test's registered mode is not the server's own)."""
    from microagent.collab.modes import BUILTIN_MODES

    assert set(MODES) == {op.name for op in BUILTIN_MODES}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_stop_seed_and_top_p_reach_every_agent_of_every_mode(server: LiveServer, mode: str) -> None:
    """Before: a collaboration dropped them; ``stop: ["the", "is"]`` came back in agents' texts."""
    engine: ScriptedEngine = server.engines["scripted"]  # type: ignore[assignment]
    start = len(engine.history)
    body = {
        "messages": USER,
        "max_tokens": 24,
        "stop": ["the", "is"],
        "seed": 7,
        "top_p": 0.9,
        "collaboration": MODES[mode],
    }
    r = post(server, body)
    assert r.status_code == 200, r.text
    sent = engine.history[start:]
    outcome = r.json()["collaboration"]
    assert sent
    agents = len(outcome["agents"])
    for request in sent:
        s = request.sampling
        assert s.stop == ("the", "is") and s.top_p == 0.9
        assert s.seed is not None and 7 <= s.seed < 7 + agents  # each agent its own seed
    for agent in outcome["agents"]:  # each text ends at its first stop string
        text = agent["output"]
        found = [text.find(w) for w in ("the", "is") if w in text]
        assert not found or " " not in text[min(found) :].strip(), text
    if agents > 1:
        assert len({q.sampling.seed for q in sent}) > 1


class SeedlessEngine(ScriptedEngine):
    """An engine that refuses per-request seeds, as vLLM's CPU backend does."""

    def check_request(self, prompt: KVHandle, sampling: Sampling) -> None:
        super().check_request(prompt, sampling)
        if sampling.seed is not None:
            raise RequestRefused("seed", "per-request seeds are refused on this backend")


def test_a_seed_is_a_400_naming_it_where_the_engine_refuses_seeds() -> None:
    """Before: the plain path refused it, a collaboration dropped it silently."""
    with live_server(lambda: {"scripted": SeedlessEngine()}, watch_health=True) as srv:
        plain = post(srv, {"messages": USER, "max_tokens": 4, "seed": 3})
        collab = post(
            srv, {"messages": USER, "max_tokens": 4, "seed": 3, "agents": [{"name": "v"}]}
        )
        for r in (plain, collab):
            assert r.status_code == 400, r.text
            assert error_of(r)["param"] == "seed"
        assert srv.engines["scripted"].history == []  # type: ignore[attr-defined]
