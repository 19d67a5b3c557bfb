"""The graph model of the ``graph`` mode: nodes (roles), edges (who receives whose output).

A ``Graph`` is built in Python (``Graph().node(...).edge(...)``) or from its
JSON form (``Graph.from_dict``), and validated before anything runs: every
problem raises ``InvalidGraph`` naming the node at fault.

Vocabulary:

* A *forward* edge ``a -> b`` gives ``b`` the output of ``a``; forward edges
  must form a DAG. An edge may carry a condition (``when``) on ``a``'s output
  text: when it is false the edge is *dead* and the branch behind it is pruned.
* A *loop* edge (``max_iterations`` set) goes back to a node that reaches its
  source (review -> revise); it fires at most ``max_iterations`` times over
  the whole run, and while it fires the source's forward edges wait.
* A *join* node receives several predecessors (AND: it needs all of them and
  is pruned when one of its edges dies). A node that is not a join may have at
  most one unconditional predecessor; its conditional predecessors are
  alternatives (OR: it runs with those whose condition held).

Bounds: a loop's ``max_iterations`` is at most ``MAX_LOOP_ITERATIONS``, and a
graph's turn bound (``Graph.max_turns``: each node's instances times the runs it
can make) is at most ``MAX_GRAPH_TURNS``; a ``regex`` condition is a client
pattern (``_patterns``: a length cap, a timeout, matched off the event loop).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from .._errors import InvalidCollaboration, InvalidGraph
from .._patterns import compile_pattern, search_text
from .._spec import MAX_AGENT_COUNT, AgentSpec, agent_field_rules, check_agent_field
from .._validators import run_validator, validator_from_spec

#: Most instances one node may fan out to (an agent spec's own limit).
MAX_NODE_COUNT: Final = MAX_AGENT_COUNT
#: The largest ``max_iterations`` of a loop edge.
MAX_LOOP_ITERATIONS: Final = 16
#: The most nodes, and edges, of a graph's JSON form (validation walks the graph on the
#: event loop: a request cannot make that walk long).
MAX_GRAPH_NODES: Final = 256
MAX_GRAPH_EDGES: Final = 1024
#: The largest turn bound of a graph (``Graph.max_turns``): as many turns as the longest
#: debate (128 agents, 16 rounds).
MAX_GRAPH_TURNS: Final = 2048

Predicate = Callable[[str], "bool | Awaitable[bool]"]


def _agent_field(name: str) -> Any:
    """A node field that is ``AgentSpec.<name>``: its default is the spec's, its rule too.

    The rule is checked in ``Node.__attrs_post_init__``, where a broken one
    raises ``InvalidGraph`` naming the node rather than the spec's error.
    """
    return attrs.field(default=attrs.fields_dict(AgentSpec)[name].default)


@attrs.frozen
class Node:
    """One role of a graph.

    Attributes:
        name: unique node name (fan-out instances are ``name-1`` … ``name-N``).
        instructions: what the role does (the last part of its prompt).
        adapter: a registered LoRA adapter name.
        model: another served model's name.
        temperature: sampling temperature (default: the collaboration's).
        max_tokens: completion budget (default: the collaboration's).
        count: fan-out: that many identical instances, prompt warmed once.
        join: the node receives several unconditional predecessors (AND-join).
    """

    name: str = _agent_field("name")
    instructions: str = _agent_field("instructions")
    adapter: str | None = _agent_field("adapter")
    model: str | None = _agent_field("model")
    temperature: float | None = _agent_field("temperature")
    max_tokens: int | None = _agent_field("max_tokens")
    count: int = _agent_field("count")
    join: bool = False

    def __attrs_post_init__(self) -> None:
        reason = check_agent_field("name", self.name)
        if reason is not None:
            raise InvalidGraph(None, f"a node name {reason}", "collaboration.nodes.name")
        for key in NODE_AGENT_FIELDS[1:]:
            reason = check_agent_field(key, getattr(self, key))
            if reason is not None:
                raise InvalidGraph(self.name, f"{key} {reason}", f"collaboration.nodes.{key}")
        if not isinstance(self.join, bool):
            raise InvalidGraph(
                self.name,
                f"join must be true or false, got {self.join!r}",
                "collaboration.nodes.join",
            )

    def spec(self) -> AgentSpec:
        """The agent spec of this node's role actors (role = the node name)."""
        return AgentSpec(**{key: getattr(self, key) for key in NODE_AGENT_FIELDS}, role=self.name)

    @classmethod
    def from_spec(cls, spec: AgentSpec, **overrides: Any) -> Node:
        """A node with ``spec``'s fields (``overrides``, e.g. ``join=True``, replace them)."""
        return cls(**{**{key: getattr(spec, key) for key in NODE_AGENT_FIELDS}, **overrides})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for f in attrs.fields(Node)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], defaults: AgentSpec | None = None) -> Node:
        """Build from JSON; missing fields are taken from ``defaults`` (an agent of the request)."""
        if not isinstance(data, Mapping):
            raise InvalidGraph(None, "each node must be an object", "collaboration.nodes")
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InvalidGraph(
                None,
                f"a node needs a non-empty string name, got {name!r}",
                "collaboration.nodes.name",
            )
        unknown = sorted(set(data) - _NODE_FIELDS)
        if unknown:
            raise InvalidGraph(
                name,
                f"unknown field {unknown[0]!r}; known: {sorted(_NODE_FIELDS)}",
                f"collaboration.nodes.{unknown[0]}",
            )
        fields: dict[str, Any] = {}
        if defaults is not None:
            fields = {key: getattr(defaults, key) for key in NODE_AGENT_FIELDS[1:]}
        fields.update({k: v for k, v in data.items() if v is not None or k in ("adapter", "model")})
        fields["instructions"] = fields.get("instructions") or ""
        return cls(**fields)


#: The agent fields a node carries, in ``Node``'s order (it adds ``join``): each is an
#: ``AgentSpec`` field, with that field's type, default and rule. A node's role is its
#: name, so ``role`` is not one; nor are ``top_p`` and ``tools``. A test lists the ones
#: left out: a new ``AgentSpec`` field fails it until ``Node`` declares it or it is listed.
NODE_AGENT_FIELDS: Final = tuple(
    f.name for f in attrs.fields(Node) if f.name in agent_field_rules()
)
_NODE_FIELDS = {f.name for f in attrs.fields(Node)}


@attrs.frozen(eq=False)
class Condition:
    """A predicate on a node's output text (the text of its instances, blank-line joined).

    JSON forms: ``{"contains": s}``, ``{"not_contains": s}``, ``{"regex": p}``
    (a search for ``p``, at most ``MAX_PATTERN_CHARS`` long, in a worker thread; a
    match past ``MATCH_TIMEOUT_S`` fails the collaboration with an ``InvalidGraph``
    naming ``collaboration.edges.when.regex``, never a silent false), ``{"validator":
    spec}`` (true when the validator passes, see ``validator_from_spec``). From
    Python: any callable ``text -> bool`` (sync or async); such a condition has no
    JSON form.
    """

    kind: str
    value: Any
    _check: Callable[[str], Awaitable[bool]] = attrs.field(alias="check", repr=False)

    async def holds(self, text: str) -> bool:
        return await self._check(text)

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "callable":
            raise ValueError("a condition given as a Python callable has no JSON form")
        return {self.kind: self.value}

    @classmethod
    def build(cls, spec: Condition | Predicate | Mapping[str, Any], where: str) -> Condition:
        """A condition from a callable or a JSON form; ``where`` names the edge's source node."""
        if isinstance(spec, Condition):
            return spec
        if callable(spec):
            fn = spec

            async def call(text: str) -> bool:
                result = fn(text)
                if inspect.isawaitable(result):
                    result = await result
                return bool(result)

            return cls("callable", getattr(fn, "__name__", "callable"), call)
        field = "collaboration.edges.when"
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise InvalidGraph(
                where,
                "an edge condition must be one of {contains}, {not_contains}, {regex}, {validator}",
                field,
            )
        ((kind, value),) = spec.items()
        if kind in ("contains", "not_contains"):
            if not isinstance(value, str) or not value:
                raise InvalidGraph(where, f"{kind} needs a non-empty string", field)
            needle = value
            negate = kind == "not_contains"

            async def contains(text: str) -> bool:
                return (needle in text) != negate

            return cls(kind, value, contains)
        if kind == "regex":
            regex_field = f"{field}.regex"
            try:
                pattern = compile_pattern(value, regex_field)
            except InvalidCollaboration as exc:
                raise InvalidGraph(where, exc.reason, regex_field) from None

            async def search(text: str) -> bool:
                try:
                    return await search_text(pattern, text, regex_field)
                except InvalidCollaboration as exc:  # it ran past its timeout
                    raise InvalidGraph(where, exc.reason, regex_field) from None

            return cls(kind, value, search)
        if kind == "validator":
            try:
                validator = validator_from_spec(value)
            except InvalidCollaboration as exc:  # ...validator.schema: ...when.validator.schema
                inner = exc.field.removeprefix("collaboration.validator")
                raise InvalidGraph(
                    where, f"invalid validator: {exc.reason}", f"{field}.validator{inner}"
                ) from None

            async def passes(text: str) -> bool:
                return (await run_validator(validator, text)).ok

            return cls(kind, value, passes)
        raise InvalidGraph(
            where,
            f"unknown condition {kind!r}; use contains, not_contains, regex or validator",
            field,
        )


@attrs.frozen
class Edge:
    """``source``'s output goes to ``target`` (if ``when`` holds); loops: ``max_iterations``."""

    source: str
    target: str
    when: Condition | None = None
    max_iterations: int | None = None

    @property
    def loop(self) -> bool:
        return self.max_iterations is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.source, "to": self.target}
        if self.when is not None:
            out["when"] = self.when.to_dict()
        if self.max_iterations is not None:
            out["max_iterations"] = self.max_iterations
        return out


def _edge(
    source: str,
    target: str,
    when: Condition | Predicate | Mapping[str, Any] | None,
    max_iterations: int | None,
) -> Edge:
    """An edge, its condition built and its ``max_iterations`` checked (``InvalidGraph``)."""
    if max_iterations is not None and (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or not 1 <= max_iterations <= MAX_LOOP_ITERATIONS
    ):
        raise InvalidGraph(
            source,
            f"max_iterations of edge {source} -> {target} must be an integer from 1 to "
            f"{MAX_LOOP_ITERATIONS} (at most {MAX_LOOP_ITERATIONS}), got {max_iterations!r}",
            "collaboration.edges.max_iterations",
        )
    cond = None if when is None else Condition.build(when, source)
    return Edge(source, target, cond, max_iterations)


def _names(value: object, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list | tuple)
        or not items
        or not all(isinstance(x, str) for x in items)
    ):
        raise InvalidGraph(
            None,
            f"{what} must be a node name or a non-empty list of names",
            f"collaboration.{what}",
        )
    return tuple(items)


@attrs.frozen
class _Adjacency:
    """Edge lists by node, computed once per graph."""

    forward: tuple[Edge, ...]
    loops: tuple[Edge, ...]
    into: Mapping[str, tuple[Edge, ...]]
    out_of: Mapping[str, tuple[Edge, ...]]
    loops_from: Mapping[str, tuple[Edge, ...]]
    #: ``Graph.descendants`` by node, filled as asked (each walk once: validation and the
    #: turn bound ask for it per loop and per node)
    reach: dict[str, frozenset[str]] = attrs.field(factory=dict)

    @classmethod
    def of(cls, edges: Sequence[Edge]) -> _Adjacency:
        into: dict[str, list[Edge]] = {}
        out_of: dict[str, list[Edge]] = {}
        loops_from: dict[str, list[Edge]] = {}
        for e in edges:
            if e.loop:
                loops_from.setdefault(e.source, []).append(e)
            else:
                into.setdefault(e.target, []).append(e)
                out_of.setdefault(e.source, []).append(e)

        def frozen(m: dict[str, list[Edge]]) -> Mapping[str, tuple[Edge, ...]]:
            return MappingProxyType({k: tuple(v) for k, v in m.items()})

        return cls(
            forward=tuple(e for e in edges if not e.loop),
            loops=tuple(e for e in edges if e.loop),
            into=frozen(into),
            out_of=frozen(out_of),
            loops_from=frozen(loops_from),
        )


def _edge_tuple(edges: Iterable[Edge]) -> tuple[Edge, ...]:
    return tuple(edges)


def _frozen_nodes(nodes: Mapping[str, Node]) -> Mapping[str, Node]:
    return MappingProxyType(dict(nodes))


@attrs.frozen
class Graph:
    """A collaboration graph: build, validate, run: ``collaborate(engine, "graph", ctx, graph=g)``.

    A graph is immutable: each builder method returns a new graph (chain them).
    Edge lists by node are computed once per graph.

    Example::

        g = (Graph()
             .node("planner", "Write a short plan.")
             .node("coder", "Implement the plan.", count=2)
             .node("reviewer", "Review the code. Say APPROVED or REJECTED.")
             .node("final", "Write the final answer.")
             .edge("planner", "coder").edge("coder", "reviewer")
             .edge("reviewer", "coder", when={"not_contains": "APPROVED"}, max_iterations=2)
             .edge("reviewer", "final"))
    """

    nodes: Mapping[str, Node] = attrs.field(factory=dict, converter=_frozen_nodes)
    edges: tuple[Edge, ...] = attrs.field(default=(), converter=_edge_tuple)
    entry: tuple[str, ...] | None = None
    output: str | None = None
    _adjacency: _Adjacency = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_adjacency", _Adjacency.of(self.edges))

    # -- building ------------------------------------------------------------------
    def add(self, node: Node) -> Graph:
        """This graph with ``node`` added (names are unique)."""
        if node.name in self.nodes:
            raise InvalidGraph(node.name, "duplicate node name", "collaboration.nodes.name")
        return attrs.evolve(self, nodes={**self.nodes, node.name: node})

    def node(self, name: str, instructions: str = "", **fields: Any) -> Graph:
        """This graph with a node added: ``node("coder", "Implement it.", count=2)``."""
        return self.add(Node(name, instructions, **fields))

    def edge(
        self,
        source: str,
        target: str,
        *,
        when: Condition | Predicate | Mapping[str, Any] | None = None,
        max_iterations: int | None = None,
    ) -> Graph:
        """This graph with an edge added (``when``: conditional; ``max_iterations``: a loop)."""
        return attrs.evolve(self, edges=(*self.edges, _edge(source, target, when, max_iterations)))

    def set_entry(self, *names: str) -> Graph:
        """This graph with its entry nodes set."""
        return attrs.evolve(self, entry=names)

    def set_output(self, name: str) -> Graph:
        """This graph with its output node set."""
        return attrs.evolve(self, output=name)

    # -- JSON ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], agents: Sequence[AgentSpec] = ()) -> Graph:
        """Build from ``{"nodes": [...], "edges": [...], "entry": ..., "output": ...}``.

        A node may give only its name when an agent of the request (``agents``)
        has that name: the agent's instructions, adapter, model, sampling and
        count are its defaults. Without ``nodes``, every agent is a node.
        """
        if not isinstance(data, Mapping):
            raise InvalidGraph(None, "the graph must be an object")
        unknown = sorted(set(data) - {"nodes", "edges", "entry", "output"})
        if unknown:
            raise InvalidGraph(
                None, f"unknown graph field {unknown[0]!r}", f"collaboration.{unknown[0]}"
            )
        by_name = {a.name: a for a in agents}
        output = data.get("output")
        if output is not None and not isinstance(output, str):
            raise InvalidGraph(None, "output must be a node name", "collaboration.output")
        graph = cls(entry=_names(data.get("entry"), "entry"), output=output)
        nodes = data.get("nodes")
        if nodes is None:
            for spec in agents:
                graph = graph.add(Node.from_spec(spec))
        else:
            if not isinstance(nodes, list | tuple):
                raise InvalidGraph(None, "nodes must be a list", "collaboration.nodes")
            if len(nodes) > MAX_GRAPH_NODES:
                raise InvalidGraph(
                    None,
                    f"{len(nodes)} nodes; the limit is {MAX_GRAPH_NODES}",
                    "collaboration.nodes",
                )
            for item in nodes:
                if isinstance(item, Node):
                    graph = graph.add(item)
                elif isinstance(item, str):
                    graph = graph.add(Node.from_dict({"name": item}, by_name.get(item)))
                else:
                    name = item.get("name") if isinstance(item, Mapping) else None
                    defaults = by_name.get(name) if isinstance(name, str) else None
                    graph = graph.add(Node.from_dict(item, defaults))
        edges = data.get("edges", ())
        if not isinstance(edges, list | tuple):
            raise InvalidGraph(None, "edges must be a list", "collaboration.edges")
        if len(edges) > MAX_GRAPH_EDGES:
            raise InvalidGraph(
                None, f"{len(edges)} edges; the limit is {MAX_GRAPH_EDGES}", "collaboration.edges"
            )
        built: list[Edge] = []
        for item in edges:
            if isinstance(item, Edge):
                built.append(item)
                continue
            if isinstance(item, list | tuple) and len(item) == 2:
                item = {"from": item[0], "to": item[1]}
            if not isinstance(item, Mapping):
                raise InvalidGraph(
                    None,
                    "each edge must be an object {from, to, when?, max_iterations?}",
                    "collaboration.edges",
                )
            extra = sorted(set(item) - {"from", "to", "when", "max_iterations"})
            src, dst = item.get("from"), item.get("to")
            if not isinstance(src, str) or not isinstance(dst, str):
                raise InvalidGraph(
                    src if isinstance(src, str) else None,
                    "an edge needs string 'from' and 'to' node names",
                    "collaboration.edges",
                )
            if extra:
                raise InvalidGraph(
                    src, f"unknown edge field {extra[0]!r}", f"collaboration.edges.{extra[0]}"
                )
            built.append(_edge(src, dst, item.get("when"), item.get("max_iterations")))
        return attrs.evolve(graph, edges=(*graph.edges, *built))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (raises ValueError when a condition is a Python callable)."""
        out: dict[str, Any] = {
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "edges": [e.to_dict() for e in self.edges],
        }
        if self.entry is not None:
            out["entry"] = list(self.entry)
        if self.output is not None:
            out["output"] = self.output
        return out

    # -- structure -----------------------------------------------------------------------
    @property
    def forward(self) -> tuple[Edge, ...]:
        """The forward edges (they form a DAG), in declaration order."""
        return self._adjacency.forward

    @property
    def loops(self) -> tuple[Edge, ...]:
        """The loop edges, in declaration order."""
        return self._adjacency.loops

    def in_edges(self, name: str) -> tuple[Edge, ...]:
        """Forward edges into ``name``, in declaration order (the prompt order)."""
        return self._adjacency.into.get(name, ())

    def out_edges(self, name: str) -> tuple[Edge, ...]:
        """Forward edges out of ``name``, in declaration order."""
        return self._adjacency.out_of.get(name, ())

    def loop_edges(self, name: str) -> tuple[Edge, ...]:
        """Loop edges out of ``name``, in declaration order."""
        return self._adjacency.loops_from.get(name, ())

    def descendants(self, name: str) -> frozenset[str]:
        """``name`` and every node it reaches through forward edges (walked once per node)."""
        found = self._adjacency.reach.get(name)
        if found is not None:
            return found
        seen = {name}
        todo = [name]
        while todo:
            n = todo.pop()
            for e in self.out_edges(n):
                if e.target not in seen:
                    seen.add(e.target)
                    todo.append(e.target)
        self._adjacency.reach[name] = found = frozenset(seen)
        return found

    def entries(self) -> tuple[str, ...]:
        """The entry nodes: as set, else the nodes without forward predecessors."""
        if self.entry is not None:
            return self.entry
        targets = {e.target for e in self.forward}
        return tuple(n for n in self.nodes if n not in targets)

    def output_node(self) -> str:
        """The output node: as set, else the one node without forward successors."""
        if self.output is not None:
            return self.output
        sources = {e.source for e in self.forward}
        sinks = [n for n in self.nodes if n not in sources and not self.loop_edges(n)]
        if len(sinks) != 1:
            raise InvalidGraph(
                sinks[0] if sinks else None,
                f"cannot tell the output node (candidates: {sinks}); set output",
                "collaboration.output",
            )
        return sinks[0]

    def run_bound(self, name: str) -> int:
        """The most runs ``name`` can make: 1 + the iterations of every loop re-running it.

        A node runs again only when a loop resets it (a loop whose target reaches it), and
        each loop fires at most ``max_iterations`` times over the whole run.
        """
        return 1 + sum(
            e.max_iterations or 0 for e in self.loops if name in self.descendants(e.target)
        )

    def max_turns(self) -> int:
        """The most engine requests one run makes: per node, its runs (``run_bound``) times
        its instances, plus the warm-up of a fan-out's shared prompt (one request per run
        of a node with ``count`` > 1). The scheduler holds a run to it."""
        return sum(
            self.run_bound(name) * (node.count + (1 if node.count > 1 else 0))
            for name, node in self.nodes.items()
        )

    def topological_order(self) -> list[str]:
        """Node names in forward-edge order (declaration order among ready nodes)."""
        indeg = {n: 0 for n in self.nodes}
        for e in self.forward:
            indeg[e.target] += 1
        order: list[str] = []
        ready = [n for n in self.nodes if indeg[n] == 0]
        while ready:
            n = ready.pop(0)
            order.append(n)
            for e in self.out_edges(n):
                indeg[e.target] -= 1
                if indeg[e.target] == 0:
                    ready.append(e.target)
        return order

    def depth(self) -> dict[str, int]:
        """Longest forward distance from an entry (used as the engine priority)."""
        depth = {n: 0 for n in self.nodes}
        for n in self.topological_order():
            for e in self.out_edges(n):
                depth[e.target] = max(depth[e.target], depth[n] + 1)
        return depth

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> Graph:
        """Check the graph; return it, or raise ``InvalidGraph`` naming the node.

        Rules: at least one node; edges, entry and output name known nodes; no
        duplicate edge; forward edges form no cycle (a cycle needs a loop edge
        with ``max_iterations``); a loop edge goes back to a node that reaches
        its source; entry nodes have no forward predecessor; every node is
        reachable from an entry and reaches the output; a node with several
        unconditional predecessors is a join; the turn bound (``max_turns``) is at most
        ``MAX_GRAPH_TURNS``.
        """
        if not self.nodes:
            raise InvalidGraph(None, "the graph has no nodes", "collaboration.nodes")
        seen: set[tuple[str, str, bool]] = set()
        for e in self.edges:
            for end in (e.source, e.target):
                if end not in self.nodes:
                    raise InvalidGraph(
                        end,
                        f"edge {e.source} -> {e.target} names an unknown node {end!r}",
                        "collaboration.edges",
                    )
            key = (e.source, e.target, e.loop)
            if key in seen:
                raise InvalidGraph(
                    e.source, f"duplicate edge {e.source} -> {e.target}", "collaboration.edges"
                )
            seen.add(key)
        for name in (*(self.entry or ()), *((self.output,) if self.output is not None else ())):
            if name not in self.nodes:
                raise InvalidGraph(
                    name,
                    "entry/output names an unknown node",
                    "collaboration.entry" if self.output != name else "collaboration.output",
                )
        order = self.topological_order()
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if n not in order and self._on_cycle(n))
            raise InvalidGraph(
                stuck,
                "is on a cycle without a bound; make the edge back a loop edge with max_iterations",
                "collaboration.edges",
            )
        for e in self.loops:
            if e.source not in self.descendants(e.target):
                raise InvalidGraph(
                    e.source,
                    f"loop edge {e.source} -> {e.target} does not go back: "
                    f"{e.target!r} does not reach {e.source!r}",
                    "collaboration.edges",
                )
        entries = self.entries()
        if not entries:
            raise InvalidGraph(None, "the graph has no entry node", "collaboration.entry")
        for name in entries:
            if self.in_edges(name):
                raise InvalidGraph(
                    name, "an entry node cannot have forward predecessors", "collaboration.entry"
                )
        reached: set[str] = set()
        for name in entries:
            reached |= self.descendants(name)
        for name in self.nodes:
            if name not in reached:
                raise InvalidGraph(name, "is unreachable from the entry", "collaboration.edges")
        output = self.output_node()
        reaching = {output}
        changed = True
        while changed:
            changed = False
            for e in self.edges:
                if e.target in reaching and e.source not in reaching:
                    reaching.add(e.source)
                    changed = True
        for name in self.nodes:
            if name not in reaching:
                raise InvalidGraph(
                    name, f"cannot reach the output node {output!r}", "collaboration.edges"
                )
        for name, node in self.nodes.items():
            plain = [e.source for e in self.in_edges(name) if e.when is None]
            if len(plain) > 1 and not node.join:
                raise InvalidGraph(
                    name,
                    f"receives several unconditional inputs ({', '.join(plain)}) "
                    "but is not a join node; set join",
                    "collaboration.nodes.join",
                )
        turns = self.max_turns()
        if turns > MAX_GRAPH_TURNS:
            raise InvalidGraph(
                None,
                f"the graph may run up to {turns} turns (each node's instances times its "
                f"runs, loops included); the limit is {MAX_GRAPH_TURNS}: lower the loops' "
                "max_iterations or the nodes' count",
                "collaboration.edges.max_iterations",
            )
        return self

    def _on_cycle(self, name: str) -> bool:
        todo = [e.target for e in self.out_edges(name)]
        seen: set[str] = set()
        while todo:
            n = todo.pop()
            if n == name:
                return True
            if n not in seen:
                seen.add(n)
                todo.extend(e.target for e in self.out_edges(n))
        return False


def as_graph(value: Graph | Mapping[str, Any], agents: Iterable[AgentSpec] = ()) -> Graph:
    """A validated graph from a ``Graph`` or its dict form."""
    graph = value if isinstance(value, Graph) else Graph.from_dict(value, tuple(agents))
    return graph.validate()
