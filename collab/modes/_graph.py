"""graph: run a declared topology of roles as one scheduled computation on the engine.

Every node instance is a role actor; edges carry KV handles (a predecessor's
output segment, spliced as token ids, never re-tokenized).

Prompt layout (decided by the runtime, the same for every node)::

    <shared context handle>
    <user turn:
        "<pred> wrote:\\n" <pred output handle> "\\n\\n"      one per active forward
        ...                                                  predecessor instance, in
                                                             edge declaration order,
                                                             then instance order
        "Your previous answer:\\n" <own last output> "\\n\\n"  on a loop re-run only
        "<src> wrote:\\n" <loop source output> "\\n\\n"        (the feedback)
        <node instructions>>
    <assistant opening>

Shared things come first, so every node shares the context's blocks, siblings
fed by the same predecessor share that predecessor's output too, and the
instances of a fan-out share their whole prompt (it is warmed once before they
start).

Scheduling: ready nodes run concurrently on the one engine (``max_concurrency``
bounds the node instances generating at once; 1 makes the run sequential and
its cache accounting exactly predictable). A node runs when every forward
in-edge is resolved: a join needs all of them active, another node at least
one. A condition that is false kills its edge; nodes that can no longer run,
or whose result can no longer reach the output, are pruned — their running
engine requests aborted. A loop edge whose condition holds (within its
``max_iterations``) sends the flow back: its target re-runs with the feedback
and everything downstream of it is reset; otherwise the source's forward edges
fire.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import anyio
import attrs

from ...engine_bridge import GenerationResult, KVHandle
from .._agent import Role, Turn, TurnDone
from .._config import ModeConfig, int_in
from .._context import CollaborationContext
from .._errors import CollaborationError, InvalidCollaboration, InvalidGraph, NoAnswer
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from ..graph import Edge, Graph, as_graph

PREVIOUS_LABEL = "Your previous answer:\n"
SEPARATOR = "\n\n"
#: Most node instances of one graph, whatever ``max_agents`` a caller gives (which the
#: nodes' instances count toward, in ``prepare_collaboration``).
MAX_GRAPH_INSTANCES = 256


def input_label(agent: str) -> str:
    """The text put before a predecessor's output handle."""
    return f"{agent} wrote:\n"


def _raw_list(value: object) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return tuple(value)
    raise InvalidCollaboration("collaboration", "nodes and edges must be lists")


@attrs.frozen(kw_only=True)
class GraphConfig(ModeConfig):
    """graph options (the graph's dict form arrives as these options).

    Attributes:
        graph: a ``Graph`` (Python) or its dict form; or give the parts below.
        nodes: node objects (or names of the request's agents); default: the agents.
        edges: ``{"from", "to", "when"?, "max_iterations"?}`` objects.
        entry: entry node name(s); default: the nodes without predecessors.
        output: the node whose final text is the answer; default: the one sink.
        max_concurrency: node instances generating at once (0 = no limit).
    """

    graph: Any = None
    nodes: tuple[Any, ...] | None = attrs.field(default=None, converter=_raw_list)
    edges: tuple[Any, ...] | None = attrs.field(default=None, converter=_raw_list)
    entry: str | tuple[str, ...] | list[str] | None = None
    output: str | None = None
    max_concurrency: int = attrs.field(default=0, validator=int_in(0, 1024))

    def build_graph(self, agents: Sequence[AgentSpec] = ()) -> Graph:
        """The validated graph these options describe (raises ``InvalidGraph``)."""
        if self.graph is not None:
            if any(v is not None for v in (self.nodes, self.edges, self.entry, self.output)):
                raise InvalidGraph(None, "give either graph or nodes/edges/entry/output, not both")
            if isinstance(self.graph, Graph):
                return as_graph(self.graph)
            if not isinstance(self.graph, Mapping):
                raise InvalidGraph(
                    None, "graph must be a Graph or an object {nodes, edges, entry, output}"
                )
            return as_graph(self.graph, agents)
        data: dict[str, Any] = {"edges": list(self.edges or ())}
        if self.nodes is not None:
            data["nodes"] = list(self.nodes)
        if self.entry is not None:
            data["entry"] = self.entry
        if self.output is not None:
            data["output"] = self.output
        return as_graph(data, agents)


NodeState = Literal["pending", "running", "done", "pruned"]
EdgeState = Literal["unresolved", "active", "dead"]


@attrs.define(eq=False)
class _NodeRun:
    """Scheduler state of one node."""

    roles: list[Role]
    state: NodeState = "pending"
    runs: int = 0
    activation: int = 0  # bumped on start/prune/reset: results of older activations are stale
    results: list[GenerationResult | None] = attrs.Factory(list)  # latest, per instance
    text: str = ""
    feedback: list[tuple[str, list[GenerationResult | None]]] = attrs.Factory(list)
    inputs: list[list[str]] = attrs.Factory(list)  # per run: the agents whose outputs it received
    warm_scope: anyio.CancelScope | None = None


class GraphMode(CollaborationOp[GraphConfig]):
    """A user-declared graph of roles: DAG edges, conditions, bounded loops, joins, fan-out."""

    name = "graph"
    Config = GraphConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = ()
    agents_field = "collaboration.nodes"

    def validate(self, config: GraphConfig, agents: Sequence[AgentSpec]) -> None:
        graph = config.build_graph(agents)
        total = sum(n.count for n in graph.nodes.values())
        if total > MAX_GRAPH_INSTANCES:
            raise InvalidCollaboration(
                "collaboration.nodes", f"{total} node instances; the limit is {MAX_GRAPH_INSTANCES}"
            )

    def spawned_specs(self, config: GraphConfig, agents: Sequence[AgentSpec]) -> list[AgentSpec]:
        """One spec per node: its instances are the agents this graph spawns."""
        return [node.spec() for node in config.build_graph(agents).nodes.values()]

    def max_turns(self, config: GraphConfig, agents: Sequence[AgentSpec]) -> int:
        """The graph's turn bound (``Graph.max_turns``), which the run is held to."""
        return config.build_graph(agents).max_turns()

    async def run(self, ctx: CollaborationContext[GraphConfig]) -> ModeResult:
        config = ctx.config
        return await _Scheduler(ctx, config.build_graph(ctx.agents), config.max_concurrency).run()


class _Scheduler:
    """Runs one graph: owns all node/edge state; node tasks report back over a stream."""

    def __init__(
        self, ctx: CollaborationContext[GraphConfig], graph: Graph, max_concurrency: int
    ) -> None:
        self.ctx = ctx
        self.graph = graph
        self.output = graph.output_node()
        self.depth = graph.depth()
        self.limiter = anyio.CapacityLimiter(max_concurrency) if max_concurrency else None
        self.nodes: dict[str, _NodeRun] = {}
        self.edges: dict[int, EdgeState] = {id(e): "unresolved" for e in graph.forward}
        self.loops_used: dict[int, int] = {id(e): 0 for e in graph.loops}
        #: engine requests started (turns and fan-out warm-ups), held to the graph's bound
        self.turns = 0
        self.max_turns = graph.max_turns()
        self.inflight = 0
        send, recv = anyio.create_memory_object_stream[tuple[str, int, list[TurnDone]]](math.inf)
        self.send, self.recv = send, recv

    async def run(self) -> ModeResult:
        ctx, graph = self.ctx, self.graph
        for name, node in graph.nodes.items():
            roles = await ctx.spawn_all([node.spec()], role=name)
            self.nodes[name] = _NodeRun(roles)
        failed: CollaborationError | None = None
        async with self.send, self.recv, anyio.create_task_group() as tg:
            self.tg = tg
            try:
                await self._advance()
                while self.inflight:
                    name, activation, done = await self.recv.receive()
                    self.inflight -= 1
                    st = self.nodes[name]
                    if activation != st.activation or st.state != "running":
                        continue  # pruned or reset meanwhile: a stale result
                    await self._finished(name, done)
                    await self._advance()
            except CollaborationError as exc:  # a condition's regex timed out, the turn bound
                failed = exc  # raised bare below, not inside the task group's ExceptionGroup
                tg.cancel_scope.cancel()
        if failed is not None:
            raise failed
        out = self.nodes[self.output]
        if out.state != "done":  # the graph's own conditions left it no path: not a failure
            raise NoAnswer(
                "collaboration.output",
                f"the output node {self.output!r} was {out.state}: the graph's conditions "
                "left no path to it, so the collaboration has no answer",
                tuple(ctx.records.values()),
            )
        rounds = max((st.runs for st in self.nodes.values()), default=1) or 1
        return ModeResult(answer=out.text, rounds=rounds, details=self._details())

    # -- node lifecycle -------------------------------------------------------------------
    def _edge(self, e: Edge) -> EdgeState:
        return self.edges[id(e)]

    async def _advance(self) -> None:
        """Prune what can no longer run or matter, then start every ready node (to a fixpoint)."""
        while True:
            changed = False
            for name in self.graph.nodes:
                st = self.nodes[name]
                if st.state != "pending":
                    continue
                ins = self.graph.in_edges(name)
                states = [self._edge(e) for e in ins]
                node = self.graph.nodes[name]
                if node.join and "dead" in states:
                    await self._prune(name, "a join input was pruned")
                    changed = True
                elif ins and "unresolved" not in states and "active" not in states:
                    await self._prune(name, "every input branch was pruned")
                    changed = True
            for name in self.graph.nodes:
                if self.nodes[name].state in ("pending", "running") and name not in self._needed():
                    await self._prune(name, "its result can no longer reach the output")
                    changed = True
            if not changed:
                break
        for name in self.graph.topological_order():
            st = self.nodes[name]
            if st.state != "pending":
                continue
            ins = self.graph.in_edges(name)
            states = [self._edge(e) for e in ins]
            if "unresolved" in states or ("dead" in states and self.graph.nodes[name].join):
                continue
            if ins and "active" not in states:
                continue
            if not ins and st.runs and not st.feedback:
                continue  # an entry runs once, again only when a loop sends it back
            await self._start(name)

    def _needed(self) -> set[str]:
        """Nodes whose result can still reach the output (through live edges and live nodes)."""
        alive = {n for n, st in self.nodes.items() if st.state != "pruned"}
        needed = {self.output} & alive
        changed = True
        while changed:
            changed = False
            for e in self.graph.edges:
                if e.source in needed or e.source not in alive or e.target not in needed:
                    continue
                live = (
                    self.loops_used[id(e)] < (e.max_iterations or 0)
                    if e.loop
                    else self._edge(e) != "dead"
                )
                if live:
                    needed.add(e.source)
                    changed = True
        return needed

    async def _start(self, name: str) -> None:
        ctx, graph = self.ctx, self.graph
        st = self.nodes[name]
        requests = len(st.roles) + (1 if len(st.roles) > 1 else 0)
        if self.turns + requests > self.max_turns:  # never, if run_bound is right: a guard
            raise ctx.failure(
                f"node {name!r} would take the graph past its bound of {self.max_turns} turns"
            )
        self.turns += requests
        st.state = "running"
        st.runs += 1
        st.activation += 1
        sources: list[tuple[str, list[GenerationResult | None]]] = [
            (e.source, self.nodes[e.source].results)
            for e in graph.in_edges(name)
            if self._edge(e) == "active"
        ]
        received = [r.agent for src, _ in sources for r in self.nodes[src].roles]
        previous = list(st.results)
        feedback, st.feedback = st.feedback, []
        prompts: list[KVHandle] = []
        for i, role in enumerate(st.roles):
            parts: list[str | KVHandle] = []
            for src, results in sources:
                parts += _inputs(self.nodes[src].roles, results)
            if feedback:
                own = previous[i] if i < len(previous) else None
                if own is not None:
                    parts += [PREVIOUS_LABEL, own.output, SEPARATOR]
                for src, results in feedback:
                    parts += _inputs(self.nodes[src].roles, results)
            prompts.append(
                ctx.prompt(role.spec, parts=parts, instructions=graph.nodes[name].instructions)
            )
        if feedback:
            received += [f"{name}(previous)"] + [
                r.agent for src, _ in feedback for r in self.nodes[src].roles
            ]
        st.inputs.append(received)
        await ctx.emit("node_started", None, node=name, iteration=st.runs, inputs=received)
        self.inflight += 1
        self.tg.start_soon(self._run_node, name, st.activation, prompts)

    async def _run_node(self, name: str, activation: int, prompts: list[KVHandle]) -> None:
        ctx = self.ctx
        st = self.nodes[name]
        priority = -self.depth[name]  # deeper nodes are nearer the answer: served first
        if len(prompts) > 1:
            common = _common_prefix(prompts)
            role = st.roles[0]
            # less than a block: nothing to cache; a remote caches nothing of ours
            if not role.bridge.remote and len(common) >= role.bridge.block_size + 1:
                handle = role.bridge.handle(common, adapter=role.spec.adapter)
                with anyio.CancelScope() as scope:  # prune/reset cancels it: the warm-up is aborted
                    st.warm_scope = scope
                    async with self._slot():
                        await ctx.warm(role, handle, priority)
                st.warm_scope = None
        done: list[TurnDone | None] = [None] * len(prompts)

        async def one(i: int) -> None:
            role = st.roles[i]
            sampling = ctx.sampling(role.spec)
            async with self._slot():
                if st.activation != activation:  # pruned or reset while waiting for a slot
                    done[i] = TurnDone(role.agent, None, skipped=True)
                    return
                done[i] = await ctx.turn(
                    role, Turn(prompts[i], sampling, priority=priority, label=name, round=st.runs)
                )

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        await self.send.send((name, activation, [d for d in done if d is not None]))

    def _slot(self) -> Any:
        return self.limiter if self.limiter is not None else _NoLimit()

    async def _finished(self, name: str, done: list[TurnDone]) -> None:
        graph = self.graph
        st = self.nodes[name]
        st.state = "done"
        st.results = [d.result for d in done]
        st.text = SEPARATOR.join(t for t in (d.content for d in done) if t)
        await self.ctx.emit("node_finished", None, node=name, iteration=st.runs, text=st.text)
        for e in graph.loop_edges(name):
            key = id(e)
            if self.loops_used[key] >= (e.max_iterations or 0):
                continue
            if e.when is not None and not await e.when.holds(st.text):
                continue
            self.loops_used[key] += 1
            await self._reset(e.target)
            self.nodes[e.target].feedback.append((name, st.results))
            await self.ctx.emit(
                "loop", None, node=e.target, source=name, iteration=self.loops_used[key]
            )
            return
        for e in graph.out_edges(name):
            ok = e.when is None or await e.when.holds(st.text)
            self.edges[id(e)] = "active" if ok else "dead"

    async def _reset(self, target: str) -> None:
        """A loop goes back to ``target``: it and everything downstream run again."""
        region = self.graph.descendants(target)
        for name in region:
            st = self.nodes[name]
            if st.warm_scope is not None:
                st.warm_scope.cancel()
            if st.state == "running":  # its input is about to change: drop the old work
                for role in st.roles:
                    if role.running_request is not None:
                        await role.bridge.abort(role.running_request)
            if st.state == "pruned":
                for role in st.roles:
                    role.actor.revive()
            st.activation += 1
            st.state = "pending"
        for e in self.graph.forward:
            if e.source in region:
                self.edges[id(e)] = "unresolved"

    async def _prune(self, name: str, reason: str) -> None:
        st = self.nodes[name]
        if st.warm_scope is not None:
            st.warm_scope.cancel()
        st.state = "pruned"
        st.activation += 1
        for e in self.graph.out_edges(name):
            self.edges[id(e)] = "dead"
        for role in st.roles:
            await self.ctx.prune(role, "branch_pruned")
        await self.ctx.emit("branch_pruned", None, node=name, reason=reason)

    def _details(self) -> dict[str, Any]:
        """Per node: ``{"output", "nodes": {name: {state, iterations, inputs, agents}}}``."""
        return {
            "output": self.output,
            "nodes": {
                name: {
                    "state": st.state,
                    "iterations": st.runs,
                    "inputs": st.inputs,
                    "agents": [r.agent for r in st.roles],
                }
                for name, st in self.nodes.items()
            },
        }


class _NoLimit:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def _inputs(
    roles: Sequence[Role], results: Sequence[GenerationResult | None]
) -> list[str | KVHandle]:
    parts: list[str | KVHandle] = []
    for role, result in zip(roles, results, strict=False):
        if result is not None:
            parts += [input_label(role.agent), result.output, SEPARATOR]
    return parts


def _common_prefix(handles: Sequence[KVHandle]) -> tuple[int, ...]:
    """The token ids every handle starts with (what a fan-out's instances share)."""
    first = handles[0]
    n = min((first.common_prefix_length(h) for h in handles[1:]), default=len(first))
    return first.token_ids[:n]
