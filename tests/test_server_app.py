"""The HTTP API against a live uvicorn server backed by the ScriptedEngine.

Every bad-input case asserts its status and message, then a good request on
the same server succeeds: bad input never disturbs the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from microagent.server import ServerLimits
from test_server_helpers import LiveServer, eventually, live_server, scripted

LIMITS = ServerLimits(max_agents_per_spec=8, max_total_agents=12, max_body_bytes=64 * 1024, max_n=4)
USER = [{"role": "user", "content": "Is the answer yes or no?"}]
VOTE = {
    "messages": USER,
    "max_tokens": 8,
    "agents": [{"name": "voter", "count": 3}],
    "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
}


def _long_context_engines() -> Any:
    def make() -> Any:
        engines = scripted()()
        engines["scripted"].max_model_len = 512  # type: ignore[attr-defined]
        engines["scripted"].register_adapter("concise", "/adapters/concise")
        return engines

    return make


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(_long_context_engines(), limits=LIMITS) as srv:
        yield srv


def post(srv: LiveServer, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/v1/chat/completions", json=body, headers=srv.headers, timeout=30, **kwargs
    )


def assert_healthy(srv: LiveServer) -> None:
    """A good plain completion and a good vote succeed on this server."""
    r = post(srv, {"messages": USER, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    r = post(srv, VOTE)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")


def with_(**changes: Any) -> dict[str, Any]:
    return {**VOTE, **changes}


BAD_INPUTS = [
    pytest.param(
        with_(
            collaboration={
                "mode": "reflect",
                "validator": {"type": "python_tests", "tests": "assert True"},
            }
        ),
        "collaboration.validator.type",
        "disabled",
        id="code-validator-disabled",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "rounds": 2}),
        "collaboration.rounds",
        "no rounds",
        id="vote-has-no-rounds",
    ),
    pytest.param(
        with_(collaboration={"mode": "telepathy"}),
        "collaboration.mode",
        "unknown mode",
        id="unknown-mode",
    ),
    pytest.param(with_(model="gpt-17"), "model", "unknown model", id="unknown-model"),
    pytest.param(
        with_(agents=[{"name": "voter", "count": 3, "model": "gpt-17"}]),
        "agents[0].model",
        "unknown model",
        id="unknown-agent-model",
    ),
    pytest.param(
        with_(agents=[{"name": "voter", "count": 3, "adapter": "poet"}]),
        "agents[0].adapter",
        "unknown adapter",
        id="unknown-adapter",
    ),
    pytest.param(
        with_(agents=[{"count": 3}]), "agents[0].name", "is required", id="agent-without-name"
    ),
    pytest.param(
        with_(agents=[{"name": "voter", "colour": "red"}]),
        "agents[0].colour",
        "unknown field",
        id="agent-unknown-field",
    ),
    pytest.param(
        with_(agents=[{"name": "voter", "count": "3"}]),
        "agents[0].count",
        "must be an integer",
        id="agent-count-string",
    ),
    pytest.param(with_(agents=["voter"]), "agents[0]", "valid dictionary", id="agent-not-object"),
    pytest.param(
        with_(agents=[{"name": "voter", "count": 0}]),
        "agents[0].count",
        "in 1..64",
        id="count-zero",
    ),
    pytest.param(
        with_(agents=[{"name": "voter", "count": 9}]),
        "agents[0].count",
        "must be in 1..8",
        id="count-over-cap",
    ),
    pytest.param(
        with_(agents=[{"name": "a", "count": 8}, {"name": "b", "count": 5}]),
        "agents",
        "too many agents",
        id="too-many-agents",
    ),
    pytest.param(
        with_(agents=[{"name": "voter", "count": 2}, {"name": "voter-1"}]),
        "agents.name",
        "used twice",
        id="duplicate-agent-names",
    ),
    pytest.param(
        with_(messages=[{"role": "user", "content": "word " * 600}]),
        "messages",
        "allows 512",
        id="context-too-long",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "word " * 600}]},
        "messages",
        "allows 512",
        id="plain-context-too-long",
    ),
    pytest.param(
        {"messages": USER, "max_tokens": 600}, "max_tokens", "exceeds", id="context-plus-max-tokens"
    ),
    pytest.param(
        {"messages": USER, "temperature": 2.5}, "temperature", "in [0, 2]", id="temperature"
    ),
    pytest.param({"messages": USER, "top_p": 0}, "top_p", "in (0, 1]", id="top-p"),
    pytest.param({"messages": USER, "n": 0}, "n", "must be in 1..4", id="n-zero"),
    pytest.param(
        {"messages": USER, "max_tokens": 0}, "max_tokens", "must be >= 1", id="max-tokens-zero"
    ),
    pytest.param(
        {"messages": USER, "stop": ["a", "b", "c", "d", "e"]},
        "stop",
        "up to 4",
        id="too-many-stops",
    ),
    pytest.param(
        with_(agents=[{"name": "v", "temperature": 9.0}]),
        "agents[0].temperature",
        "must be a number in [0, 2]",
        id="agent-temperature",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "rounds": 99}),
        "collaboration.rounds",
        "1..16",
        id="rounds",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "answer": {"choices": []}}),
        "collaboration.answer.choices",
        "non-empty",
        id="empty-choices",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "answer": {"extract": "(a)(b)"}}),
        "collaboration.answer.extract",
        "at most one group",
        id="extract-two-groups",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "answer": {"extract": "number", "choices": ["a"]}}),
        "collaboration.answer.extract",
        "free answers",
        id="extract-with-choices",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "answer": {"extract": "(["}}),
        "collaboration.answer.extract",
        "regular expression",
        id="extract-bad-pattern",
    ),
    pytest.param(
        with_(collaboration={"mode": "vote", "warp": 9}),
        "collaboration.warp",
        "unknown option",
        id="unknown-option",
    ),
    pytest.param({"messages": []}, "messages", "at least 1 item", id="empty-messages"),
    pytest.param(
        {"messages": [{"role": "user", "content": "   "}]},
        "messages",
        "some text",
        id="blank-messages",
    ),
    pytest.param({"messages": "hello"}, "messages", "valid list", id="messages-not-list"),
    pytest.param(
        {"messages": [{"role": "wizard", "content": "x"}]},
        "messages[0].role",
        "Input should be",
        id="bad-role",
    ),
    pytest.param(
        {"messages": [{"role": "tool", "content": "0"}]},
        "messages[0].tool_call_id",
        "required",
        id="tool-message-without-call-id",
    ),
    pytest.param(
        {"messages": [*USER, {"role": "tool", "content": "0", "tool_call_id": "call_x"}]},
        "messages[1].tool_call_id",
        "must answer a tool call",
        id="tool-message-answering-no-call",
    ),
    pytest.param(
        {"messages": USER, "temprature": 0.5},
        "temprature",
        "unrecognized request argument",
        id="unknown-parameter",
    ),
    pytest.param(
        {"messages": USER, "logit_bias": {"1": 5}},
        "logit_bias",
        "not supported",
        id="refused-parameter",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "hi", "audio": {"id": "x"}}]},
        "messages[0].audio",
        "Extra inputs",
        id="unknown-message-field",
    ),
    pytest.param(
        {"messages": USER, "max_tokens": "10"},
        "max_tokens",
        "valid integer",
        id="max-tokens-string",
    ),
    pytest.param(
        {"messages": USER, "stream": "yes"}, "stream", "valid boolean", id="stream-string"
    ),
    pytest.param(
        {"messages": USER, "n": 2, "agents": [{"name": "v"}]}, "n", "must be 1", id="collab-n"
    ),
    pytest.param([1, 2, 3], None, "JSON object", id="body-not-object"),
]


@pytest.mark.parametrize(("body", "param", "message"), BAD_INPUTS)
def test_bad_input_is_400_and_server_keeps_working(
    server: LiveServer, body: Any, param: str | None, message: str
) -> None:
    r = post(server, body)
    assert r.status_code == (404 if param == "model" else 400), r.text  # vLLM's and OpenAI's
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"]
    assert_healthy(server)


def test_invalid_json_is_400(server: LiveServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["error"]["message"]
    assert_healthy(server)


def test_body_size_limit(server: LiveServer) -> None:
    big = {"messages": [{"role": "user", "content": "x" * (70 * 1024)}]}
    r = post(server, big)
    assert r.status_code == 413
    assert "exceeds the limit of 65536 bytes" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: counted while read
        yield json.dumps(big).encode()

    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    assert_healthy(server)


def test_unknown_route_is_404(server: LiveServer) -> None:
    r = httpx.get(f"{server.url}/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "no such route"
    r = httpx.get(f"{server.url}/v1/chat/completions")
    assert r.status_code == 405
    assert_healthy(server)


def test_bad_input_through_the_openai_sdk(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="scripted",
            messages=USER,
            extra_body={"agents": [{"name": "v"}], "collaboration": {"mode": "nope"}},  # type: ignore[arg-type]
        )
    assert info.value.status_code == 400
    assert "unknown mode 'nope'" in str(info.value)
    done = client.chat.completions.create(model="scripted", messages=USER, max_tokens=4)  # type: ignore[arg-type]
    assert done.choices[0].message.content


# -- plain completions -------------------------------------------------------------------------


def test_plain_completion(server: LiveServer) -> None:
    r = post(
        server,
        {"model": "scripted", "messages": USER, "max_tokens": 5, "n": 2, "seed": 3, "top_p": 0.9},
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"])
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 10
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_plain_completion_stop_and_default_model(server: LiveServer) -> None:
    r = post(server, {"model": "default", "messages": USER, "max_tokens": 30, "stop": ["."]})
    assert r.status_code == 200
    assert r.json()["model"] == "scripted"
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def sse_chunks(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_plain_stream_with_usage(server: LiveServer) -> None:
    body = {
        "messages": USER,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = post(server, body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(r.text)
    assert chunks[-1] == "[DONE]"
    usage = chunks[-2]["usage"]
    assert chunks[-2]["choices"] == []
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2] if c["choices"])
    assert text
    assert usage["completion_tokens"] >= 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


# -- collaborations ----------------------------------------------------------------------------


def test_vote_response(server: LiveServer) -> None:
    r = post(server, VOTE)
    assert r.status_code == 200
    body = r.json()
    collab = body["collaboration"]
    assert collab["mode"] == "vote"
    assert body["choices"][0]["message"]["content"] == collab["answer"]
    assert sum(collab["votes"].values()) >= 2
    assert len(collab["agents"]) == 3
    for agent in collab["agents"]:
        assert {
            "name",
            "role",
            "output",
            "finish_reason",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
        } <= set(agent)
    assert (
        body["usage"]["prompt_tokens_details"]["cached_tokens"] == collab["usage"]["cached_tokens"]
    )
    assert body["usage"]["prompt_tokens"] == collab["usage"]["prompt_tokens"]


def test_collaboration_stream(server: LiveServer) -> None:
    body = {
        "messages": USER,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
        "agents": [{"name": "debater", "count": 2}],
        "collaboration": {"mode": "debate", "rounds": 2},
    }
    r = post(server, body)
    assert r.status_code == 200
    chunks = sse_chunks(r.text)
    assert chunks[-1] == "[DONE]"
    events = [c["collaboration_event"] for c in chunks[:-1] if "collaboration_event" in c]
    types = {e["type"] for e in events}
    assert {"agent_started", "delta", "agent_finished", "final"} <= types
    assert {e["agent"] for e in events if e["type"] == "agent_started"} == {
        "debater-1",
        "debater-2",
    }
    content = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"]
    )
    final = next(
        c for c in chunks[:-1] if c["choices"] and c["choices"][0]["finish_reason"] == "stop"
    )
    assert content == final["collaboration"]["answer"]
    assert final["dropped_events"] == 0
    assert chunks[-2]["usage"]["prompt_tokens"] == final["collaboration"]["usage"]["prompt_tokens"]


def test_metrics_count_requests_and_collaborations(server: LiveServer) -> None:
    assert post(server, VOTE).status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    assert 'microagent:collaborations_total{mode="vote",status="ok"}' in text
    assert 'microagent:requests_total{kind="collaboration",status="200"}' in text
    assert 'microagent:engine_requests_running{model_name="scripted"} 0.0' in text
    assert server.metric("microagent:prompt_tokens_total") > 0


def test_metrics_report_retention_and_a_finished_collaboration_holds_nothing(
    server: LiveServer,
) -> None:
    """A debate retains each debater's thread between rounds; its end releases them all."""
    body = {
        "messages": USER,
        "max_tokens": 16,
        "agents": [{"name": "debater", "count": 2}],
        "collaboration": {"mode": "debate", "rounds": 2, "early_stop": False},
    }
    assert post(server, body).status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("microagent:engine_retent")
        or line.startswith("microagent:engine_retained")
    }
    assert values['microagent:engine_retained_blocks{model_name="scripted"}'] == 0
    assert values['microagent:engine_retentions{model_name="scripted"}'] == 0
    released = 'microagent:engine_retention_releases_total{cause="released",model_name="scripted"}'
    superseded = (
        'microagent:engine_retention_releases_total{cause="superseded",model_name="scripted"}'
    )
    assert values[released] >= 2  # one per debater, when the collaboration ended
    assert values[superseded] >= 2  # round 2 replaced each debater's round-1 thread
    assert values['microagent:engine_retained_hit_tokens_total{model_name="scripted"}'] > 0


# -- API key ------------------------------------------------------------------------------------


def test_api_key() -> None:
    with live_server(scripted(), api_key="s3cret") as srv:
        for path in ("/v1/models", "/metrics", "/v1/nothing"):
            r = httpx.get(f"{srv.url}{path}")
            assert r.status_code == 401, path
            assert "API key" in r.json()["error"]["message"]
        r = httpx.post(
            f"{srv.url}/v1/chat/completions", json=VOTE, headers={"authorization": "Bearer wrong"}
        )
        assert r.status_code == 401
        assert httpx.get(f"{srv.url}/health").status_code == 200
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in client.models.list()] == ["scripted"]
        assert post(srv, VOTE).status_code == 200


# -- overload and disconnect -------------------------------------------------------------


async def _post(client: httpx.AsyncClient, body: Any) -> None:
    await client.post("/v1/chat/completions", json=body)


def test_overload_gets_429_and_recovers() -> None:
    limits = ServerLimits(max_concurrent_collaborations=2)
    slow = scripted(decode_time_per_token=0.05)
    body = {**VOTE, "max_tokens": 40, "collaboration": {"mode": "vote", "early_stop": False}}
    with live_server(slow, limits=limits) as srv:

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                results: list[httpx.Response] = []

                async def one() -> None:
                    results.append(await client.post("/v1/chat/completions", json=body))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(one)
                    tg.start_soon(one)
                    await eventually(lambda: srv.state.collaborations >= 2)
                    r = await client.post("/v1/chat/completions", json=body)
                    assert r.status_code == 429
                    assert r.headers["retry-after"] == "1"
                    assert "overloaded" in r.json()["error"]["message"]
                assert [x.status_code for x in results] == [200, 200]
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200

        anyio.run(scenario)
        assert (
            'microagent:rejected_total{reason="concurrent_collaborations"} 1.0'
            in httpx.get(f"{srv.url}/metrics").text
        )


def test_engine_queue_full_gets_503() -> None:
    limits = ServerLimits(max_engine_waiting=1)
    with live_server(scripted(max_num_seqs=1, decode_time_per_token=0.05), limits=limits) as srv:

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                async with anyio.create_task_group() as tg:
                    for _ in range(2):
                        tg.start_soon(_post, client, {"messages": USER, "max_tokens": 20})
                    engine = srv.engines["scripted"]
                    await eventually(lambda: engine.stats().scheduler_waiting >= 1)
                    r = await client.post(
                        "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}
                    )
                    assert r.status_code == 503
                    assert "retry-after" in r.headers
                r = await client.post(
                    "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}
                )
                assert r.status_code == 200

        anyio.run(scenario)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_disconnect_cancels_the_collaboration(stream: bool) -> None:
    slow = scripted(decode_time_per_token=0.05)
    body = {
        "messages": USER,
        "max_tokens": 200,
        "stream": stream,
        "agents": [{"name": "debater", "count": 3}],
        "collaboration": {"mode": "debate", "rounds": 3},
    }
    with live_server(slow) as srv:
        engine = srv.engines["scripted"]

        async def scenario() -> None:
            running_when_left = False  # the client leaves a collaboration that still runs
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                if stream:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        seen = 0
                        async for line in r.aiter_lines():
                            if line.startswith("data: ") and "collaboration_event" in line:
                                seen += 1
                            if seen >= 3:
                                running_when_left = bool(srv.state.collaborations)
                                break
                else:
                    with anyio.move_on_after(60):
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(_post, client, body)
                            await eventually(engine.live_requests)
                            running_when_left = bool(srv.state.collaborations)
                            tg.cancel_scope.cancel()
            assert running_when_left
            await eventually(
                lambda: (
                    srv.metric("microagent:engine_requests_running") == 0
                    and not srv.state.collaborations
                ),
                5,
            )

        anyio.run(scenario)
        assert not engine.live_requests()
        assert engine.stats().requests_aborted >= 1
        text = httpx.get(f"{srv.url}/metrics").text
        assert 'microagent:collaborations_total{mode="debate",status="cancelled"} 1.0' in text
        assert "microagent:collaborations_running 0.0" in text


GRAPH = {
    "messages": USER,
    "max_tokens": 8,
    "collaboration": {
        "mode": "graph",
        "nodes": [
            {"name": "planner", "instructions": "Plan."},
            {"name": "coder", "instructions": "Code.", "count": 2},
            {"name": "reviewer", "instructions": "Review.", "join": True},
        ],
        "edges": [
            {"from": "planner", "to": "coder"},
            {"from": "coder", "to": "reviewer"},
            {
                "from": "reviewer",
                "to": "coder",
                "when": {"not_contains": "APPROVED"},
                "max_iterations": 2,
            },
        ],
        "entry": "planner",
        "output": "reviewer",
    },
}


def test_graph_collaboration_over_http(server: LiveServer) -> None:
    r = post(server, GRAPH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["collaboration"]["mode"] == "graph"
    agents = {a["name"] for a in body["collaboration"]["agents"]}
    assert {"planner", "coder-1", "coder-2", "reviewer"} <= agents
    assert body["choices"][0]["message"]["content"] == body["collaboration"]["answer"]


@pytest.mark.parametrize(
    ("change", "node"),
    [
        ({"edges": [{"from": "planner", "to": "ghost"}]}, "ghost"),
        (
            {
                "edges": [
                    {"from": "planner", "to": "coder"},
                    {"from": "coder", "to": "planner"},
                    {"from": "coder", "to": "reviewer"},
                ]
            },
            "planner",
        ),
    ],
)
def test_invalid_graph_is_400_naming_the_node(
    server: LiveServer, change: dict[str, Any], node: str
) -> None:
    body = json.loads(json.dumps(GRAPH))
    body["collaboration"].update(change)
    r = post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert node in error["message"], error
    assert_healthy(server)
