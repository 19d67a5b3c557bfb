"""Hostile collaborations over HTTP on the ScriptedEngine: every request stays bounded.

Each test is an attacker's request against the real app (``docs/security.md``,
"Bounds on collaborations"): a regex that backtracks, a calculation that blows
up, a graph that never ends or fans out past the agent cap, a schema nested
deep enough to exhaust the stack. Every server here is watched
(``live_server(watch_health=True)``): another process polls ``GET /health`` every
250 ms for its whole life, and each answer must come within a second, where the old
server froze for up to 27 s.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import httpx
import pytest
from microagent.collab import (
    Graph,
    InvalidCollaboration,
    collaborate,
    prepare_collaboration,
)
from microagent.collab._calculator import CalculationError, calculate
from microagent.server import ServerLimits
from microagent.testing import ScriptedEngine
from test_server_helpers import LiveServer, live_server, scripted

USER = [{"role": "user", "content": "Write it."}]
CHAT = "/v1/chat/completions"


def _post(srv: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=120)


def _param(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text
    param = r.json()["error"]["param"]
    assert isinstance(param, str)
    return param


# -- client regexes --------------------------------------------------------------------------


def _regex_loop(pattern: str) -> dict[str, Any]:
    """a -> b, and b back to a once when ``pattern`` matches b's text (b is the answer)."""
    return {
        "messages": USER,
        "max_tokens": 128,
        "collaboration": {
            "mode": "graph",
            "nodes": [{"name": "a"}, {"name": "b"}],
            "edges": [
                {"from": "a", "to": "b"},
                {"from": "b", "to": "a", "when": {"regex": pattern}, "max_iterations": 1},
            ],
            "output": "b",
        },
    }


@pytest.mark.parametrize(
    ("pattern", "text", "status"),
    [  # the repro (stdlib re: 27 s on the loop; regex: no match at once)
        (r"^(?:[\w\s]|[\w\s]){28}!", "word " * 40, 200),
        # one the regex package backtracks on too: its timeout ends it, a 400 names it
        (r"^(a|aa)+$", "a" * 40 + "@", 400),
    ],
    ids=["issue-repro", "regex-backtracks-too"],
)
def test_a_backtracking_edge_regex_never_stalls_the_server(
    pattern: str, text: str, status: int
) -> None:
    engines = scripted(script=lambda ids, request: text)
    with live_server(engines, watch_health=True) as srv:
        r = _post(srv, CHAT, _regex_loop(pattern))
    assert r.status_code == status, r.text
    if status == 400:
        assert _param(r) == "collaboration.edges.when.regex"
        assert "catastrophic backtracking" in r.json()["error"]["message"]
    else:
        assert r.json()["collaboration"]["details"]["nodes"]["b"]["iterations"] == 1


def test_an_edge_regex_over_the_length_cap_is_refused_naming_the_field() -> None:
    with live_server(scripted(), watch_health=True) as srv:
        r = httpx.post(f"{srv.url}{CHAT}", json=_regex_loop("(a|b)" * 100), timeout=30)
        assert r.status_code == 400, r.text
        assert _param(r) == "collaboration.edges.when.regex"
        assert "limit is 256" in r.json()["error"]["message"]
        assert srv.engines["scripted"].history == []  # refused before anything ran


def _extracting_vote(extract: str, voters: int) -> dict[str, Any]:
    return {
        "messages": USER,
        "max_tokens": 64,
        "agents": [{"name": "voter", "count": voters}],
        "collaboration": {"mode": "vote", "answer": {"extract": extract}},
    }


def test_a_backtracking_answer_extract_is_matched_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``answer.extract`` reads every voter's reply: a pattern that backtracks on it times
    out in a worker thread (a 400 naming it), never on the loop that answers /health."""
    import asyncio

    from microagent.collab import _context

    on_loop: list[bool] = []
    real = _context.normalize_answer

    def spy(text: str, *args: Any) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(text, *args)

    monkeypatch.setattr(_context, "normalize_answer", spy)
    engines = scripted(script=lambda ids, request: "a" * 40 + "@")
    with live_server(engines, watch_health=True) as srv:
        r = _post(srv, CHAT, _extracting_vote(r"^(a|aa)+$", 16))
    assert r.status_code == 400, r.text
    assert _param(r) == "collaboration.answer.extract"
    assert "catastrophic backtracking" in r.json()["error"]["message"]
    assert on_loop and not any(on_loop)  # every match ran on a worker thread


@pytest.mark.parametrize("field", ["extract", "regex"])
def test_answer_patterns_over_the_length_cap_are_refused_naming_the_field(field: str) -> None:
    body = _extracting_vote("a", 3)
    body["collaboration"]["answer"] = {field: "a" * 257}
    with live_server(scripted(), watch_health=True) as srv:
        r = httpx.post(f"{srv.url}{CHAT}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert _param(r) == f"collaboration.answer.{field}"
    assert "257 characters; the limit is 256" in r.json()["error"]["message"]


# -- the calculator --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("round(5, -10**7)", "round's digits"),  # 6-15 s on the loop before
        ("round(5, -10**9)", "round's digits"),  # passed every check before
        ("round(5, -100000000)", "round's digits"),  # a literal: refused before the sandbox
        ("round(2.5, 10**6)", "round's digits"),
        ("factorial(factorial(6))", "factorial is limited"),
        ("(2**999)**999", "too large"),
        ("2**(2**30)", "too large"),
        ("lcm(2**999, 3**620, 5**420, 7**350, 11**280) ** 4", "too large"),
        ("9" * 190 + " ** 50", "too large"),
    ],
    ids=[
        "round-computed-digits",
        "round-billion-digits",
        "round-literal-digits",
        "round-float",
        "nested-factorial",
        "nested-power",
        "power-of-power",
        "lcm-power",
        "long-digit-string",
    ],
)
@pytest.mark.anyio
async def test_a_calculation_that_would_blow_up_is_refused_quickly(
    expression: str, reason: str
) -> None:
    start = anyio.current_time()
    with pytest.raises(CalculationError, match=reason):
        await calculate(expression)
    assert anyio.current_time() - start < 4  # a sandbox start at most, never the blow-up


def test_round_with_huge_digits_over_http_leaves_the_server_responsive() -> None:
    def script(ids: tuple[int, ...], request: Any) -> str:
        return "round(5, -10**7)" if request.sampling.regex else "85"

    body = {
        "messages": [{"role": "user", "content": "What is 37 + 48?"}],
        "max_tokens": 16,
        "collaboration": {"mode": "compute"},
    }
    engines = scripted(script=script)
    with live_server(engines, limits=ServerLimits(allow_calculator=True), watch_health=True) as srv:
        r = _post(srv, CHAT, body)
    assert r.status_code == 200, r.text
    details = r.json()["collaboration"]["details"]
    assert details["path"] == "direct"
    assert "round's digits" in details["expressions"][0]["error"]


# -- graphs that never end, or fan out past the cap --------------------------------------------


def _graph(
    nodes: list[dict[str, Any]], edges: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    return {
        "messages": USER,
        "max_tokens": 8,
        "collaboration": {"mode": "graph", "nodes": nodes, "edges": edges, **extra},
    }


def test_a_loop_above_the_iteration_maximum_is_refused_before_it_runs() -> None:
    body = _graph(
        [{"name": "a"}, {"name": "b"}],
        [
            {"from": "a", "to": "b"},
            {"from": "b", "to": "a", "when": {"contains": " "}, "max_iterations": 1_000_000_000},
        ],
        output="b",
    )
    with live_server(scripted(), watch_health=True) as srv:
        # before: it ran until a budget stopped it (3,095 turns in 8 s without one)
        r = _post(srv, CHAT, body)
        assert r.status_code == 400, r.text
        assert _param(r) == "collaboration.edges.max_iterations"
        assert "at most 16" in r.json()["error"]["message"]
        assert srv.engines["scripted"].history == []


def test_a_graph_whose_turn_bound_is_too_large_is_refused() -> None:
    """Each loop is within its maximum, but together they would run thousands of turns."""
    names = [f"n{i}" for i in range(24)]
    edges: list[dict[str, Any]] = [{"from": a, "to": b} for a, b in itertools.pairwise(names)]
    edges += [{"from": names[-1], "to": n, "max_iterations": 16} for n in names[:-1]]
    body = _graph([{"name": n} for n in names], edges, output=names[-1])
    with live_server(scripted(), watch_health=True) as srv:
        r = httpx.post(f"{srv.url}{CHAT}", json=body, timeout=10)
        assert r.status_code == 400, r.text
        assert _param(r) == "collaboration.edges.max_iterations"
        assert "turns" in r.json()["error"]["message"]


@pytest.mark.anyio
async def test_a_graph_run_stays_within_its_turn_bound() -> None:
    """A loop that always fires: the engine sees at most the bound, and the bound is exact."""
    graph = (
        Graph()
        .node("plan", "Plan.")
        .node("draft", "Draft.", count=3)
        .node("review", "Review.")
        .edge("plan", "draft")
        .edge("draft", "review")
        .edge("review", "draft", when={"contains": " "}, max_iterations=2)
        .edge("review", "plan", when={"contains": " "}, max_iterations=1)
        .set_output("review")
    )
    prepared = prepare_collaboration("graph", None, {"graph": graph, "max_tokens": 8})
    bound = prepared.op.max_turns(prepared.config, prepared.agents)
    # plan runs at most 1 + 1, draft and review 1 + 2 + 1; draft's 3 instances + a warm-up
    assert bound == 2 * 1 + 4 * (3 + 1) + 4 * 1
    assert prepared.worst_case_tokens() == bound * 8
    async with ScriptedEngine(script=lambda ids, request: "not yet") as engine:
        outcome = await collaborate(engine, prepared, "Write it.")
        assert 0 < len(engine.history) <= bound
        assert outcome.details["nodes"]["review"]["iterations"] == 4


def _fan_out(count: int, width: int = 4) -> dict[str, Any]:
    """``width`` nodes of ``count`` instances each; the last joins the others."""
    names = [f"n{i}" for i in range(width)]
    nodes: list[dict[str, Any]] = [{"name": n, "count": count} for n in names]
    nodes[-1]["join"] = True
    return _graph(nodes, [{"from": n, "to": names[-1]} for n in names[:-1]])


def test_graph_nodes_count_toward_the_servers_agent_caps() -> None:
    limits = ServerLimits(max_total_agents=128, max_agents_per_spec=64)
    with live_server(scripted(), limits=limits, watch_health=True) as srv:
        # four inline nodes x 64: 256 agents, where `agents` is refused above 128
        r = _post(srv, CHAT, _fan_out(64))
        assert r.status_code == 400, r.text
        assert _param(r) == "collaboration.nodes"
        assert "256 agents in total; the limit is 128" in r.json()["error"]["message"]
        assert srv.engines["scripted"].history == []
    # the default per-spec cap (32) holds for a node
    with live_server(scripted(), watch_health=True) as srv:
        r = httpx.post(f"{srv.url}{CHAT}", json=_fan_out(33, width=2), timeout=30)
        assert r.status_code == 400, r.text
        assert _param(r) == "collaboration.nodes.count"
        r = httpx.post(f"{srv.url}{CHAT}", json=_fan_out(2), timeout=30)
        assert r.status_code == 200, r.text


def test_graph_nodes_count_toward_max_agents_in_the_library() -> None:
    options = _fan_out(8)["collaboration"]
    options.pop("mode")
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("graph", None, options, max_agents=31)
    assert info.value.field == "collaboration.nodes"
    assert prepare_collaboration("graph", None, options, max_agents=32).op.name == "graph"


# -- deep schemas --------------------------------------------------------------------------------


def _nested(levels: int) -> dict[str, Any]:
    """An object schema whose properties nest ``levels`` times (JSON depth 2 * levels + 1)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _with_schema(where: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """A request carrying ``schema`` at ``where``: (path, body, what a 400's field starts with)."""
    chat = CHAT
    if where == "response_format":
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        body = {"messages": USER, "max_tokens": 8, "response_format": fmt}
        return chat, body, "response_format.json_schema.schema"
    if where == "tools":
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        body = {"messages": USER, "max_tokens": 8, "tools": tools}
        return chat, body, "tools[0].function.parameters"
    if where == "validator":
        validator = {"type": "json_schema", "schema": schema}
        collab = {"mode": "reflect", "validator": validator}
        body = {"messages": USER, "max_tokens": 8, "collaboration": collab}
        return chat, body, "collaboration.validator.schema"
    if where == "edge validator":
        when = {"validator": {"type": "json_schema", "schema": schema}}
        edges: list[dict[str, Any]] = [
            {"from": "a", "to": "b"},
            {"from": "b", "to": "a", "when": when, "max_iterations": 1},
        ]
        body = _graph([{"name": "a"}, {"name": "b"}], edges, output="b")
        return chat, body, "collaboration.edges.when.validator.schema"
    assert where == "responses text.format"
    fmt = {"type": "json_schema", "name": "x", "schema": schema}
    body = {"input": "Write it.", "max_output_tokens": 8, "text": {"format": fmt}}
    return "/v1/responses", body, "text.format"


PLACES = ["response_format", "tools", "validator", "edge validator", "responses text.format"]


@pytest.mark.parametrize("where", PLACES)
def test_a_schema_nested_past_the_limit_is_a_400_naming_its_field(where: str) -> None:
    path, body, field = _with_schema(where, _nested(95))  # the issue's: under 4 KB, a 500
    with live_server(scripted(), watch_health=True) as srv:
        r = _post(srv, path, body)
        assert r.status_code == 400, r.text
        assert _param(r).startswith(field)
        assert "deeper than 32 levels" in r.json()["error"]["message"]
        # the deepest schema within the limit is served
        path, body, _ = _with_schema(where, _nested(15))  # JSON depth 31
        r = httpx.post(f"{srv.url}{path}", json=body, timeout=30)
        assert r.status_code == 200, r.text
