"""Per-API-key quotas and per-request token budgets: the accounts, then the server's answers."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest
from microagent.collab import prepare_collaboration
from microagent.server import ApiError, ServerLimits
from microagent.server._quota import WINDOW_SECONDS, KeyQuota, Quotas, key_id
from test_server_helpers import LiveServer, eventually, live_server, scripted

USER = [{"role": "user", "content": "Is the answer yes or no?"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the accounts --------------------------------------------------------------------------


def test_concurrency_is_per_key_and_a_settled_request_frees_its_place() -> None:
    quotas = Quotas(KeyQuota(max_concurrent=2), retry_after=3)
    a1, _ = quotas.admit("a", 10), quotas.admit("a", 10)
    with pytest.raises(ApiError) as info:
        quotas.admit("a", 10)
    assert info.value.status == 429 and info.value.headers == {"retry-after": "3"}
    assert info.value.code == "concurrency_limit_exceeded"
    quotas.admit("b", 10)  # another key has its own account
    a1.settle(5)
    a1.settle(5)  # settling twice changes nothing
    assert quotas.running("a") == 1
    quotas.admit("a", 10)


def test_tokens_per_minute_slide_and_retry_after_says_when_enough_expired() -> None:
    clock = Clock()
    quotas = Quotas(KeyQuota(tokens_per_minute=100), clock=clock)
    quotas.admit("a", 50).settle(40)  # at t=0 of the window
    clock.now += 20
    quotas.admit("a", 50).settle(30)  # at t=20
    clock.now += 10  # t=30: 70 used, a request of 50 would make 120
    with pytest.raises(ApiError) as info:
        quotas.admit("a", 50)
    assert info.value.status == 429 and info.value.code == "tokens_per_minute_limit"
    # 20 tokens too many: the first entry (40) expires at t=60, 30 s from now
    assert info.value.headers == {"retry-after": "30"}
    clock.now += 30
    quotas.admit("a", 50)  # the first entry left the window


def test_what_is_promised_to_requests_in_flight_counts_until_settled() -> None:
    clock = Clock()
    quotas = Quotas(KeyQuota(tokens_per_minute=100), retry_after=2, clock=clock)
    running = quotas.admit("a", 80)
    with pytest.raises(ApiError) as info:
        quotas.admit("a", 30)
    assert info.value.headers == {"retry-after": "2"}  # nothing in the window to wait for
    running.settle(10)  # it used far less than its worst case
    quotas.admit("a", 30).settle(30)
    clock.now += WINDOW_SECONDS + 1
    assert quotas.admit("a", 90).promised == 90


def test_a_worst_case_above_the_minute_is_a_400_naming_max_tokens() -> None:
    quotas = Quotas(KeyQuota(tokens_per_minute=100))
    with pytest.raises(ApiError) as info:
        quotas.admit("a", 101)
    assert info.value.status == 400 and info.value.param == "max_tokens"


def test_quota_values_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tokens_per_minute"):
        KeyQuota(tokens_per_minute=0)
    assert not KeyQuota().limited and KeyQuota(max_concurrent=1).limited


def test_key_ids_are_digests_never_the_key() -> None:
    assert key_id("s3cret-key") != key_id("other") and "s3cret" not in key_id("s3cret-key")
    assert key_id(None) == "anonymous"


# -- worst cases ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "agents", "options", "turns", "largest"),
    [  # vote and best_of answer in up to answer_tokens (16), more than max_tokens here
        ("vote", [{"name": "v", "count": 3}], {}, 6, 16),
        ("debate", [{"name": "d", "count": 3}], {"rounds": 3}, 9, 10),
        ("reflect", None, {"rounds": 2}, 5, 10),
        ("aggregate", None, {}, 4, 10),
        ("best_of", [{"name": "c", "count": 4}], {}, 8, 16),
        ("vote", [{"name": "v", "count": 2, "max_tokens": 40}], {}, 4, 40),
        ("graph", None, {"nodes": [{"name": "a"}], "entry": "a", "output": "a"}, 1, 10),
        # a loop re-runs a (2 instances and their warm-up) and b up to 1 + 3 times each;
        # b's own max_tokens is the largest turn
        (
            "graph",
            None,
            {
                "nodes": [{"name": "a", "count": 2}, {"name": "b", "max_tokens": 40}],
                "edges": [
                    {"from": "a", "to": "b"},
                    {"from": "b", "to": "a", "max_iterations": 3},
                ],
                "output": "b",
            },
            4 * (2 + 1) + 4 * 1,
            40,
        ),
    ],
)
def test_each_mode_bounds_its_turns(
    mode: str,
    agents: list[dict[str, Any]] | None,
    options: dict[str, Any],
    turns: int,
    largest: int,
) -> None:
    """Every built-in mode has a bound (graph's comes from its graph): none is None."""
    prepared = prepare_collaboration(mode, agents, {"max_tokens": 10, **options})
    assert prepared.op.max_turns(prepared.config, prepared.agents) == turns
    assert prepared.largest_turn() == largest
    assert prepared.worst_case_tokens() == turns * largest
    assert prepared.worst_case_tokens(tool_steps=2) == 3 * turns * largest


# -- over HTTP -----------------------------------------------------------------------------

KEYS = ("key-one-s3cret", "key-two-s3cret")


def _post(srv: LiveServer, body: dict[str, Any], key: str) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_key_at_its_concurrency_limit_gets_429_while_another_key_is_served() -> None:
    limits = ServerLimits(key_quota=KeyQuota(max_concurrent=1))
    slow = scripted(decode_time_per_token=0.05)
    with live_server(
        slow, api_key=list(KEYS), admin_key="ops-s3cret", limits=limits, watch_health=True
    ) as srv:

        async def scenario() -> None:
            headers = {"authorization": f"Bearer {KEYS[0]}"}
            body = {"messages": USER, "max_tokens": 200, "stream": True}
            async with (
                httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
                client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as s,
            ):
                assert s.status_code == 200
                await s.aiter_lines().__anext__()  # it is running
                r = await client.post(
                    "/v1/chat/completions",
                    json={"messages": USER, "max_tokens": 2},
                    headers=headers,
                )
                assert r.status_code == 429, r.text
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
                assert KEYS[0] not in r.text
                other = await client.post(
                    "/v1/chat/completions",
                    json={"messages": USER, "max_tokens": 2},
                    headers={"authorization": f"Bearer {KEYS[1]}"},
                )
                assert other.status_code == 200, other.text
            # the client went away: its place is free again
            await eventually(lambda: srv.state.quotas.running(key_id(KEYS[0])) == 0)
            r = await client_post(srv.url, KEYS[0])
            assert r.status_code == 200

        anyio.run(scenario)
        metrics = httpx.get(f"{srv.url}/metrics", headers=srv.admin_headers)
        assert 'microagent:rejected_total{reason="concurrency_limit_exceeded"} 1.0' in metrics.text
        assert not any(k in metrics.text for k in KEYS)


async def client_post(url: str, key: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.post(
            "/v1/chat/completions",
            json={"messages": USER, "max_tokens": 2},
            headers={"authorization": f"Bearer {key}"},
        )


def test_tokens_per_minute_give_429_with_retry_after_and_a_400_for_the_impossible() -> None:
    limits = ServerLimits(key_quota=KeyQuota(tokens_per_minute=300))
    with live_server(scripted(), api_key=list(KEYS), limits=limits, watch_health=True) as srv:
        first = _post(srv, {"messages": USER, "max_tokens": 100}, KEYS[0])
        assert first.status_code == 200, first.text
        used = first.json()["usage"]["total_tokens"]
        assert used < 300
        # the worst case of the next one (prompt + 250) does not fit beside what was used
        r = _post(srv, {"messages": USER, "max_tokens": 300 - used}, KEYS[0])
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert r.json()["error"]["code"] == "tokens_per_minute_limit"
        assert _post(srv, {"messages": USER, "max_tokens": 300 - used}, KEYS[1]).status_code == 200
        r = _post(srv, {"messages": USER, "max_tokens": 400}, KEYS[1])
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "max_tokens"


def test_a_collaboration_whose_worst_case_is_over_the_budget_gets_400_before_it_runs() -> None:
    limits = ServerLimits(max_collaboration_tokens=100)
    with live_server(scripted(), limits=limits, watch_health=True) as srv:
        big = {
            "messages": USER,
            "max_tokens": 32,
            "agents": [{"name": "voter", "count": 3}],
            "collaboration": {"mode": "vote"},
        }
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=big, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "max_tokens" and error["code"] == "token_budget_exceeded"
        assert "6 turns of up to 32 completion tokens" in error["message"]
        assert srv.engines["scripted"].history == []  # nothing ran
        small = {**big, "max_tokens": 8, "agents": [{"name": "voter", "count": 2}]}
        small["collaboration"] = {"mode": "vote", "answer_tokens": 8}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=small, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={"messages": USER, "max_tokens": 50, "n": 3},
            timeout=30,
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "token_budget_exceeded"


def test_a_mode_with_no_bound_is_stopped_before_a_turn_that_would_cross_the_budget() -> None:
    graph = {
        "messages": USER,
        "max_tokens": 8,
        "temperature": 0,
        "collaboration": {
            "mode": "graph",
            "nodes": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
            "entry": "a",
            "output": "c",
        },
    }
    # within the default budget: what each turn reads
    with live_server(scripted(), watch_health=True) as srv:
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=graph, timeout=30)
        assert r.status_code == 200, r.text
        sizes = [len(q.prompt) + q.sampling.max_tokens for q in srv.engines["scripted"].history]
    assert len(sizes) == 3
    budget = sizes[0] + sizes[1]  # the budget counts prompt and completion tokens
    with live_server(
        scripted(), limits=ServerLimits(max_collaboration_tokens=budget), watch_health=True
    ) as srv:
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=graph, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "token_budget_exceeded"
        assert f"budget of {budget}" in error["message"]
        sent = srv.engines["scripted"].history
        # two turns ran; the third (its prompt and 8 more) would cross the budget: never sent
        assert [len(q.prompt) + q.sampling.max_tokens for q in sent] == sizes[:2]


@pytest.mark.parametrize(
    ("mode", "agents", "options"),
    [
        ("vote", [{"name": "v", "count": 3}], {"answer": {"choices": ["yes", "no"]}}),
        ("vote", [{"name": "v", "count": 3}], {"style": "reason"}),
        ("debate", [{"name": "d", "count": 3}], {"rounds": 3}),
        ("reflect", None, {"rounds": 2}),
        ("aggregate", None, {}),
        ("cascade", None, {}),
        ("best_of", [{"name": "c", "count": 3}], {"judge": "self"}),
        ("auto", [{"name": "a", "count": 3}], {"answer": {"choices": ["yes", "no"]}}),
        (  # a loop that always fires, over a fan-out: every run the bound allows
            "graph",
            None,
            {
                "nodes": [{"name": "a", "count": 2}, {"name": "b"}],
                "edges": [
                    {"from": "a", "to": "b"},
                    {"from": "b", "to": "a", "when": {"contains": " "}, "max_iterations": 3},
                ],
                "output": "b",
            },
        ),
    ],
)
def test_the_bound_holds_on_a_real_run(
    mode: str, agents: list[dict[str, Any]] | None, options: dict[str, Any]
) -> None:
    from microagent.collab import collaborate
    from microagent.testing import ScriptedEngine

    async def run() -> tuple[int, int, int]:
        async with ScriptedEngine(seed=1) as engine:
            prepared = prepare_collaboration(
                mode, agents, {"max_tokens": 6, "early_stop": False, **options}
            )
            outcome = await collaborate(engine, prepared, "Is it so?")
            bound = prepared.op.max_turns(prepared.config, prepared.agents)
            worst = prepared.worst_case_tokens()
            assert bound is not None and worst is not None
            return len(engine.history), bound, worst - outcome.usage.completion_tokens

    sent, bound, slack = anyio.run(run)
    assert 0 < sent <= bound
    assert slack >= 0


def _streamed_usage(srv: LiveServer, body: dict[str, Any], key: str) -> int:
    """Stream ``body`` and return its usage chunk's total tokens."""
    headers = {"authorization": f"Bearer {key}"}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    total = None
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json=stream, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    total = int(usage["total_tokens"])
    assert total is not None
    return total


@pytest.mark.parametrize("collaboration", [False, True])
def test_a_stream_is_settled_with_what_it_used_not_its_worst_case(collaboration: bool) -> None:
    """A stream and the same request without streaming cost a key the same tokens."""
    limits = ServerLimits(key_quota=KeyQuota(tokens_per_minute=100_000))
    body: dict[str, Any] = {"messages": USER, "max_tokens": 400, "temperature": 0.0}
    if collaboration:
        body |= {"agents": [{"name": "voter", "count": 3}], "collaboration": {"mode": "vote"}}
    with live_server(scripted(), api_key=list(KEYS), limits=limits, watch_health=True) as srv:
        quotas = srv.state.quotas
        plain = _post(srv, body, KEYS[0])
        assert plain.status_code == 200, plain.text
        used = plain.json()["usage"]["total_tokens"]
        assert quotas.used(key_id(KEYS[0])) == used
        streamed = _streamed_usage(srv, body, KEYS[1])
        anyio.run(eventually, lambda: quotas.running(key_id(KEYS[1])) == 0)
        assert quotas.used(key_id(KEYS[1])) == streamed == used
        assert used < 400  # far below the worst case it was admitted with
