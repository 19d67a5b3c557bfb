"""The graph model and the ``graph`` mode on the ScriptedEngine."""

from __future__ import annotations

from typing import Any

import attrs
import jsonschema
import pytest
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    Graph,
    InvalidCollaboration,
    InvalidGraph,
    collaborate,
    prepare_collaboration,
)
from microagent.collab.graph import NODE_AGENT_FIELDS, Node, graph_json_schema
from microagent.collab.modes import GraphConfig
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

TASK = "Write a Python function fizzbuzz(n). " * 8


def review_graph(max_iterations: int = 2) -> Graph:
    """planner -> 2 coders -> reviewer -> (not APPROVED: back to the coders, bounded) -> final.

    Reused by the real-engine and openai-SDK tests.
    """
    return (
        Graph()
        .node("planner", "Write a short numbered plan for the task.")
        .node("coder", "Implement the plan as one Python function.", count=2)
        .node(
            "reviewer",
            "Review the code. Reply APPROVED if it is correct, else REJECTED with the problems.",
        )
        .node("final", "Give the final code.")
        .edge("planner", "coder")
        .edge("coder", "reviewer")
        .edge("reviewer", "coder", when={"not_contains": "APPROVED"}, max_iterations=max_iterations)
        .edge("reviewer", "final")
    )


def last_user_turn(request: EngineRequest) -> str:
    return request.prompt.text.rsplit("<|im_start|>user", 1)[-1]


def review_script(approve_on: int | None) -> Any:
    """Scripted replies keyed on each node's instructions; the reviewer approves at approve_on."""
    reviews = iter(range(1, 100))

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        turn = last_user_turn(request)
        if request.sampling.max_tokens == 1:
            return "warm"
        if "Review the code" in turn:
            k = next(reviews)
            return "APPROVED" if k == approve_on else f"REJECTED review {k}"
        if "Implement the plan" in turn:
            return "def fizzbuzz ( n ) : pass"
        if "numbered plan" in turn:
            return "1 . loop 2 . print"
        return "final code"

    return script


@pytest.mark.parametrize(("approve_on", "coder_runs"), [(1, 1), (2, 2), (None, 3)])
async def test_review_loop_end_to_end(approve_on: int | None, coder_runs: int) -> None:
    events: list[CollaborationEvent] = []
    async with ScriptedEngine(script=review_script(approve_on)) as engine:
        outcome = await collaborate(
            engine, "graph", TASK, graph=review_graph(), on_event=events.append
        )
        assert engine.live_requests() == frozenset()
        assert await engine.wait_idle(1.0)
    assert outcome.answer == "final code"
    graph = outcome.details["nodes"]
    assert graph["coder"]["iterations"] == coder_runs  # at most 1 + max_iterations
    assert graph["reviewer"]["iterations"] == coder_runs
    assert graph["final"]["iterations"] == 1 and graph["planner"]["iterations"] == 1
    assert graph["reviewer"]["inputs"][0] == ["coder-1", "coder-2"]
    if coder_runs > 1:  # a re-run receives the plan, its own previous answer, then the review
        assert graph["coder"]["inputs"][1] == ["planner", "coder(previous)", "reviewer"]
    started = [e.data["node"] for e in events if e.type == "node_started"]
    assert started == ["planner", "coder", "reviewer"] * 1 + ["coder", "reviewer"] * (
        coder_runs - 1
    ) + ["final"]
    assert [e.type for e in events].count("node_finished") == len(started)
    assert {e.agent for e in events if e.type == "agent_started"} == {
        "planner",
        "coder-1",
        "coder-2",
        "reviewer",
        "final",
    }
    # the coders' prompts share everything: warmed once per run of the fan-out
    warms = [r for r in engine.history if r.sampling.max_tokens == 1]
    assert len(warms) == coder_runs
    reviewer_prompts = [r for r in engine.history if "Review the code" in last_user_turn(r)]
    for r in reviewer_prompts:
        text = last_user_turn(r)
        assert (
            text.index("coder-1 wrote:")
            < text.index("coder-2 wrote:")
            < text.index("Review the code")
        )


async def test_loop_feedback_is_spliced_as_handles() -> None:
    async with ScriptedEngine(script=review_script(2)) as engine:
        await collaborate(engine, "graph", TASK, graph=review_graph())
        reviews = [r for r in engine.history if "Review the code" in last_user_turn(r)]
        revisions = [
            r
            for r in engine.history
            if r.sampling.max_tokens > 1 and "Your previous answer" in last_user_turn(r)
        ]
        assert len(revisions) == 2
        first_review_out = engine.tokenize("REJECTED review 1")
        for r in revisions:
            ids = r.prompt.token_ids
            assert any(
                ids[k : k + len(first_review_out)] == tuple(first_review_out)
                for k in range(len(ids))
            )
            assert engine.chat.context([{"role": "user", "content": TASK}]).is_prefix_of(r.prompt)
        assert len(reviews) == 2


async def test_false_condition_prunes_the_branch_and_aborts_its_requests() -> None:
    # slow: "n1" is still generating when the gate's condition kills the join's other input
    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        turn = last_user_turn(request)
        if "Gate" in turn:
            return "no"
        if "Slow" in turn:
            return " ".join(["step"] * 60)
        return "done"

    g = (
        Graph()
        .node("start", "Begin.")
        .node("gate", "Gate.")
        .node("slow", "Slow.", count=2)
        .node("join", "Combine.", join=True)
        .node("alt", "Alternative.")
        .node("out", "Answer.")
        .edge("start", "gate")
        .edge("start", "slow")
        .edge("gate", "join", when={"contains": "yes"})
        .edge("slow", "join")
        .edge("gate", "alt", when={"not_contains": "yes"})
        .edge("join", "out", when={"contains": "done"})
        .edge("alt", "out", when={"contains": "done"})
    )
    events: list[CollaborationEvent] = []
    async with ScriptedEngine(script=script, decode_time_per_token=0.01) as engine:
        outcome = await collaborate(engine, "graph", TASK, graph=g, on_event=events.append)
        assert engine.live_requests() == frozenset()
        assert await engine.wait_idle(1.0)
        assert engine.stats().requests_aborted >= 1
    assert outcome.answer == "done"
    nodes = outcome.details["nodes"]
    assert nodes["join"]["state"] == "pruned" and nodes["slow"]["state"] == "pruned"
    assert nodes["out"]["inputs"] == [["alt"]]
    pruned = {e.data["node"] for e in events if e.type == "branch_pruned"}
    assert pruned == {"join", "slow"}
    records = {a.name: a for a in outcome.agents}
    assert records["slow-1"].finish_reason == "pruned" and records["join"].requests == 0


async def test_callable_and_validator_conditions() -> None:
    seen: list[str] = []

    def is_json(text: str) -> bool:
        seen.append(text)
        return text.startswith("{")

    g = (
        Graph()
        .node("a", "Emit.")
        .node("b", "JSON path.")
        .node("c", "Text path.")
        .node("d", "Out.")
        .edge("a", "b", when=is_json)
        .edge("a", "c", when={"validator": {"type": "json"}})
        .edge("b", "d")
        .edge("c", "d", when={"regex": "^x"})
    )
    async with ScriptedEngine(
        script=lambda p, r: '{"k": 1}' if "Emit" in last_user_turn(r) else "x"
    ) as engine:
        outcome = await collaborate(engine, "graph", TASK, graph=g)
    assert seen == ['{"k": 1}']
    assert outcome.details["nodes"]["d"]["inputs"] == [["b", "c"]]
    with pytest.raises(ValueError, match="callable"):
        g.to_dict()


async def test_graph_from_http_options_and_agents() -> None:
    options = {
        "nodes": [{"name": "writer"}, {"name": "critic", "instructions": "Critique."}],
        "edges": [{"from": "writer", "to": "critic"}],
        "max_concurrency": 1,
    }
    agents = [{"name": "writer", "instructions": "Write.", "temperature": 0.1}]
    prepared = prepare_collaboration("graph", agents, options)
    assert isinstance(prepared.config, GraphConfig)
    graph = prepared.config.build_graph(prepared.agents)
    assert (
        graph.nodes["writer"].instructions == "Write." and graph.nodes["writer"].temperature == 0.1
    )
    async with ScriptedEngine() as engine:
        outcome = await collaborate(engine, "graph", TASK, agents, **options)
    assert outcome.mode == "graph" and outcome.answer
    assert [a.role for a in outcome.agents] == ["writer", "critic"]


async def test_dict_form_round_trips_and_matches_its_schema() -> None:
    g = review_graph()
    data = g.to_dict()
    jsonschema.Draft202012Validator.check_schema(graph_json_schema())
    jsonschema.validate(data, graph_json_schema())
    again = Graph.from_dict(data)
    assert again.to_dict() == data
    assert again.validate().run_bound("coder") == 3 and again.run_bound("planner") == 1


async def test_node_agent_fields_are_agent_spec_fields() -> None:
    """A node's agent fields are ``AgentSpec``'s: same types, defaults, rules and schema.

    A new ``AgentSpec`` field fails here until ``Node`` carries it or it is
    named below as one a node leaves out (a node's role is its name).
    """
    spec_fields, node_fields = attrs.fields_dict(AgentSpec), attrs.fields_dict(Node)
    assert set(spec_fields) - set(NODE_AGENT_FIELDS) == {"role", "top_p", "tools"}
    assert set(node_fields) - set(NODE_AGENT_FIELDS) == {"join"}
    for name in NODE_AGENT_FIELDS:
        assert node_fields[name].type == spec_fields[name].type, name
        assert node_fields[name].default == spec_fields[name].default, name
    for name in NODE_AGENT_FIELDS[1:]:  # each agent rule is checked, and names the node
        broken: dict[str, Any] = {name: object()}
        with pytest.raises(InvalidGraph) as info:
            Node("n", **broken)
        assert info.value.node == "n" and info.value.field == f"collaboration.nodes.{name}"
    node_schema = graph_json_schema()["properties"]["nodes"]["items"]["oneOf"][1]
    assert list(node_schema["properties"]) == [*NODE_AGENT_FIELDS, "join"]


def _base() -> dict[str, Any]:
    return {
        "nodes": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
    }


def _with(**changes: Any) -> dict[str, Any]:
    data = _base()
    data.update(changes)
    return data


INVALID: list[tuple[str, dict[str, Any], str | None]] = [
    (
        "unknown edge node",
        _with(edges=[{"from": "a", "to": "b"}, {"from": "b", "to": "ghost"}]),
        "ghost",
    ),
    ("unknown entry", _with(entry="nope"), "nope"),
    ("unknown output", _with(output="nowhere"), "nowhere"),
    (
        "unbounded cycle",
        _with(edges=[{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "b"}]),
        "b",
    ),
    (
        "unreachable",
        _with(
            nodes=[{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}],
            edges=[
                {"from": "a", "to": "b"},
                {"from": "b", "to": "c"},
                {"from": "d", "to": "c", "when": {"contains": "x"}},
            ],
            entry="a",
        ),
        "d",
    ),
    (
        "fan-in without join",
        _with(edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "c"}, {"from": "b", "to": "c"}]),
        "c",
    ),
    (
        "duplicate name",
        _with(nodes=[{"name": "a"}, {"name": "b"}, {"name": "b"}, {"name": "c"}]),
        "b",
    ),
    ("bad count", _with(nodes=[{"name": "a"}, {"name": "b", "count": 0}, {"name": "c"}]), "b"),
    (
        "count too large",
        _with(nodes=[{"name": "a"}, {"name": "b", "count": 1000}, {"name": "c"}]),
        "b",
    ),
    (
        "loop not going back",
        _with(
            edges=[
                {"from": "a", "to": "b"},
                {"from": "b", "to": "c"},
                {"from": "a", "to": "c", "max_iterations": 2, "when": {"contains": "x"}},
            ]
        ),
        "a",
    ),
    (
        "bad max_iterations",
        _with(
            edges=[
                {"from": "a", "to": "b"},
                {"from": "b", "to": "c"},
                {"from": "c", "to": "b", "max_iterations": 0},
            ]
        ),
        "c",
    ),
    (
        "bad condition",
        _with(edges=[{"from": "a", "to": "b", "when": {"smells": "x"}}, {"from": "b", "to": "c"}]),
        "a",
    ),
    (
        "bad regex",
        _with(edges=[{"from": "a", "to": "b", "when": {"regex": "("}}, {"from": "b", "to": "c"}]),
        "a",
    ),
    (
        "bad validator",
        _with(
            edges=[
                {"from": "a", "to": "b", "when": {"validator": {"type": "nope"}}},
                {"from": "b", "to": "c"},
            ]
        ),
        "a",
    ),
    (
        "dead end",
        _with(edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "c"}], output="c"),
        "b",
    ),
    ("two sinks", _with(edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "c"}]), "b"),
    ("entry with inputs", _with(entry=["a", "b"]), "b"),
    (
        "unknown node field",
        _with(nodes=[{"name": "a"}, {"name": "b", "colour": "red"}, {"name": "c"}]),
        "b",
    ),
    (
        "bad temperature",
        _with(nodes=[{"name": "a"}, {"name": "b", "temperature": 9}, {"name": "c"}]),
        "b",
    ),
    (
        "duplicate edge",
        _with(edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"}]),
        "a",
    ),
    ("no nodes", {"nodes": [], "edges": []}, None),
]


@pytest.mark.parametrize(("case", "data", "node"), INVALID, ids=[c[0] for c in INVALID])
async def test_invalid_graphs_name_the_node(
    case: str, data: dict[str, Any], node: str | None
) -> None:
    with pytest.raises(InvalidGraph) as info:
        Graph.from_dict(data).validate()
    assert info.value.node == node, str(info.value)
    if node is not None:
        assert repr(node) in str(info.value)
    # the server validates through prepare_collaboration: the same typed error (a 400)
    with pytest.raises(InvalidGraph) as again:
        prepare_collaboration("graph", None, data)
    assert isinstance(again.value, InvalidCollaboration) and again.value.node == node
    assert again.value.field.startswith("collaboration")


async def test_valid_base_graph_and_graph_option_exclusivity() -> None:
    assert Graph.from_dict(_base()).validate().output_node() == "c"
    with pytest.raises(InvalidGraph):
        prepare_collaboration("graph", None, {"graph": _base(), "edges": []})
    with pytest.raises(InvalidCollaboration, match="max_concurrency"):
        prepare_collaboration("graph", None, {**_base(), "max_concurrency": -1})


async def test_a_fan_out_warm_up_runs_at_its_collaborations_priority() -> None:
    """The warm-up is a request of its collaboration (its group): the policy's priority
    (arrival level plus the node's offset, as the node's own turns), so a later
    collaboration's warm-up never jumps ahead of an earlier one's turns."""
    from microagent.collab._scheduling import LEVEL_SPAN

    async with ScriptedEngine(script=review_script(1)) as engine:
        for _ in range(2):
            await collaborate(engine, "graph", TASK, graph=review_graph())
    warms = [r for r in engine.history if r.sampling.max_tokens == 1]
    turns = [r for r in engine.history if r.sampling.max_tokens != 1]
    assert len(warms) >= 2 and all(w.group is not None for w in warms)
    for warm in warms:
        coders = [  # the fan-out the warm-up prepared: prompts that extend it
            r for r in turns if r.group == warm.group and warm.prompt.is_prefix_of(r.prompt)
        ]
        level = {r.priority // LEVEL_SPAN for r in turns if r.group == warm.group}
        assert warm.priority // LEVEL_SPAN in level  # not a raw offset
        assert coders and all(c.priority == warm.priority for c in coders)
    first = warms[0]
    second = next(w for w in warms if w.group != first.group)
    assert second.priority > max(r.priority for r in turns if r.group == first.group)
