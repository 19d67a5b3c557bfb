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
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ._collab_types import AgentSpec, InvalidCollaboration
from ._validators import run_validator, validator_from_spec

#: Most instances one node may fan out to.
MAX_NODE_COUNT = 64

Predicate = Callable[[str], "bool | Awaitable[bool]"]


class InvalidGraph(InvalidCollaboration):
    """A graph is invalid; ``node`` names the node at fault (None when no node is)."""

    def __init__(self, node: str | None, reason: str, field: str = "collaboration.graph") -> None:
        self.node = node
        where = f"node {node!r}: " if node is not None else ""
        super().__init__(field, where + reason)


def _opt_str(value: object, node: str, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidGraph(node, f"{key} must be a string, got {type(value).__name__}", f"collaboration.nodes.{key}")


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

    name: str
    instructions: str = ""
    adapter: str | None = None
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    count: int = 1
    join: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidGraph(None, f"a node name must be a non-empty string, got {self.name!r}", "collaboration.nodes.name")
        name = self.name
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_NODE_COUNT:
            raise InvalidGraph(name, f"count must be an integer in 1..{MAX_NODE_COUNT}, got {self.count!r}", "collaboration.nodes.count")
        if not isinstance(self.instructions, str):
            raise InvalidGraph(name, "instructions must be a string", "collaboration.nodes.instructions")
        _opt_str(self.adapter, name, "adapter")
        _opt_str(self.model, name, "model")
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= t <= 2.0):
            raise InvalidGraph(name, f"temperature must be a number in [0, 2], got {t!r}", "collaboration.nodes.temperature")
        m = self.max_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidGraph(name, f"max_tokens must be a positive integer, got {m!r}", "collaboration.nodes.max_tokens")
        if not isinstance(self.join, bool):
            raise InvalidGraph(name, f"join must be true or false, got {self.join!r}", "collaboration.nodes.join")

    def spec(self) -> AgentSpec:
        """The agent spec of this node's role actors (role = the node name)."""
        return AgentSpec(
            self.name, count=self.count, instructions=self.instructions, adapter=self.adapter,
            model=self.model, temperature=self.temperature, max_tokens=self.max_tokens, role=self.name,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for f in attrs.fields(Node)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], defaults: AgentSpec | None = None) -> Node:
        """Build from JSON; fields missing here are taken from ``defaults`` (an agent of the request)."""
        if not isinstance(data, Mapping):
            raise InvalidGraph(None, "each node must be an object", "collaboration.nodes")
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InvalidGraph(None, f"a node needs a non-empty string name, got {name!r}", "collaboration.nodes.name")
        unknown = sorted(set(data) - _NODE_FIELDS)
        if unknown:
            raise InvalidGraph(name, f"unknown field {unknown[0]!r}; known: {sorted(_NODE_FIELDS)}", f"collaboration.nodes.{unknown[0]}")
        fields: dict[str, Any] = {}
        if defaults is not None:
            fields = {
                "instructions": defaults.instructions, "adapter": defaults.adapter, "model": defaults.model,
                "temperature": defaults.temperature, "max_tokens": defaults.max_tokens, "count": defaults.count,
            }
        fields.update({k: v for k, v in data.items() if v is not None or k in ("adapter", "model")})
        fields["instructions"] = fields.get("instructions") or ""
        return cls(**fields)


_NODE_FIELDS = {f.name for f in attrs.fields(Node)}


@attrs.frozen(eq=False)
class Condition:
    """A predicate on a node's output text (the text of its instances, blank-line joined).

    JSON forms: ``{"contains": s}``, ``{"not_contains": s}``, ``{"regex": p}``
    (``re.search``), ``{"validator": spec}`` (true when the validator passes,
    see ``validator_from_spec``). From Python: any callable ``text -> bool``
    (sync or async); such a condition has no JSON form.
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
            raise InvalidGraph(where, "an edge condition must be one of {contains}, {not_contains}, {regex}, {validator}", field)
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
            if not isinstance(value, str):
                raise InvalidGraph(where, "regex needs a string", field)
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise InvalidGraph(where, f"invalid regular expression {value!r}: {exc}", field) from None

            async def search(text: str) -> bool:
                return pattern.search(text) is not None

            return cls(kind, value, search)
        if kind == "validator":
            try:
                validator = validator_from_spec(value)
            except InvalidCollaboration as exc:
                raise InvalidGraph(where, f"invalid validator: {exc.reason}", field) from None

            async def passes(text: str) -> bool:
                return (await run_validator(validator, text)).ok

            return cls(kind, value, passes)
        raise InvalidGraph(where, f"unknown condition {kind!r}; use contains, not_contains, regex or validator", field)


@attrs.frozen
class Edge:
    """``source``'s output goes to ``target`` (when ``when`` holds); a loop edge has ``max_iterations``."""

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


def _names(value: object, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(x, str) for x in items):
        raise InvalidGraph(None, f"{what} must be a node name or a non-empty list of names", f"collaboration.{what}")
    return tuple(items)


@attrs.define
class Graph:
    """A collaboration graph: build it, validate it, run it with ``collaborate(engine, "graph", ctx, graph=g)``.

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

    nodes: dict[str, Node] = attrs.field(factory=dict)
    edges: list[Edge] = attrs.field(factory=list)
    entry: tuple[str, ...] | None = None
    output: str | None = None

    # -- building ------------------------------------------------------------------
    def add(self, node: Node) -> Graph:
        """Add a node (names are unique)."""
        if node.name in self.nodes:
            raise InvalidGraph(node.name, "duplicate node name", "collaboration.nodes.name")
        self.nodes[node.name] = node
        return self

    def node(self, name: str, instructions: str = "", **fields: Any) -> Graph:
        """Add a node: ``node("coder", "Implement it.", count=2, adapter="lora-a")``."""
        return self.add(Node(name, instructions, **fields))

    def edge(
        self,
        source: str,
        target: str,
        *,
        when: Condition | Predicate | Mapping[str, Any] | None = None,
        max_iterations: int | None = None,
    ) -> Graph:
        """Add an edge; ``when`` makes it conditional, ``max_iterations`` makes it a bounded loop."""
        if max_iterations is not None and (isinstance(max_iterations, bool) or not isinstance(max_iterations, int) or max_iterations < 1):
            raise InvalidGraph(source, f"max_iterations of edge {source} -> {target} must be a positive integer, got {max_iterations!r}", "collaboration.edges.max_iterations")
        cond = None if when is None else Condition.build(when, source)
        self.edges.append(Edge(source, target, cond, max_iterations))
        return self

    def set_entry(self, *names: str) -> Graph:
        self.entry = names
        return self

    def set_output(self, name: str) -> Graph:
        self.output = name
        return self

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
            raise InvalidGraph(None, f"unknown graph field {unknown[0]!r}", f"collaboration.{unknown[0]}")
        by_name = {a.name: a for a in agents}
        graph = cls(entry=_names(data.get("entry"), "entry"), output=None)
        output = data.get("output")
        if output is not None and not isinstance(output, str):
            raise InvalidGraph(None, "output must be a node name", "collaboration.output")
        graph.output = output
        nodes = data.get("nodes")
        if nodes is None:
            for spec in agents:
                graph.add(Node(spec.name, spec.instructions, spec.adapter, spec.model, spec.temperature, spec.max_tokens, spec.count))
        else:
            if not isinstance(nodes, list | tuple):
                raise InvalidGraph(None, "nodes must be a list", "collaboration.nodes")
            for item in nodes:
                if isinstance(item, Node):
                    graph.add(item)
                elif isinstance(item, str):
                    graph.add(Node.from_dict({"name": item}, by_name.get(item)))
                else:
                    name = item.get("name") if isinstance(item, Mapping) else None
                    graph.add(Node.from_dict(item, by_name.get(name) if isinstance(name, str) else None))
        edges = data.get("edges", ())
        if not isinstance(edges, list | tuple):
            raise InvalidGraph(None, "edges must be a list", "collaboration.edges")
        for item in edges:
            if isinstance(item, Edge):
                graph.edges.append(item)
                continue
            if isinstance(item, list | tuple) and len(item) == 2:
                item = {"from": item[0], "to": item[1]}
            if not isinstance(item, Mapping):
                raise InvalidGraph(None, "each edge must be an object {from, to, when?, max_iterations?}", "collaboration.edges")
            extra = sorted(set(item) - {"from", "to", "when", "max_iterations"})
            src, dst = item.get("from"), item.get("to")
            if not isinstance(src, str) or not isinstance(dst, str):
                raise InvalidGraph(src if isinstance(src, str) else None, "an edge needs string 'from' and 'to' node names", "collaboration.edges")
            if extra:
                raise InvalidGraph(src, f"unknown edge field {extra[0]!r}", f"collaboration.edges.{extra[0]}")
            graph.edge(src, dst, when=item.get("when"), max_iterations=item.get("max_iterations"))
        return graph

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
    def forward(self) -> list[Edge]:
        return [e for e in self.edges if not e.loop]

    @property
    def loops(self) -> list[Edge]:
        return [e for e in self.edges if e.loop]

    def in_edges(self, name: str) -> list[Edge]:
        """Forward edges into ``name``, in declaration order (the prompt order)."""
        return [e for e in self.edges if not e.loop and e.target == name]

    def out_edges(self, name: str) -> list[Edge]:
        return [e for e in self.edges if not e.loop and e.source == name]

    def loop_edges(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.loop and e.source == name]

    def descendants(self, name: str) -> set[str]:
        """``name`` and every node it reaches through forward edges."""
        seen = {name}
        todo = [name]
        while todo:
            n = todo.pop()
            for e in self.out_edges(n):
                if e.target not in seen:
                    seen.add(e.target)
                    todo.append(e.target)
        return seen

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
            raise InvalidGraph(sinks[0] if sinks else None, f"cannot tell the output node (candidates: {sinks}); set output", "collaboration.output")
        return sinks[0]

    def run_bound(self, name: str) -> int:
        """The most runs ``name`` can make: 1 + the iterations of every loop re-running it."""
        return 1 + sum(e.max_iterations or 0 for e in self.loops if name in self.descendants(e.target))

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
        unconditional predecessors is a join.
        """
        if not self.nodes:
            raise InvalidGraph(None, "the graph has no nodes", "collaboration.nodes")
        seen: set[tuple[str, str, bool]] = set()
        for e in self.edges:
            for end in (e.source, e.target):
                if end not in self.nodes:
                    raise InvalidGraph(end, f"edge {e.source} -> {e.target} names an unknown node {end!r}", "collaboration.edges")
            key = (e.source, e.target, e.loop)
            if key in seen:
                raise InvalidGraph(e.source, f"duplicate edge {e.source} -> {e.target}", "collaboration.edges")
            seen.add(key)
        for name in (*(self.entry or ()), *((self.output,) if self.output is not None else ())):
            if name not in self.nodes:
                raise InvalidGraph(name, "entry/output names an unknown node", "collaboration.entry" if self.output != name else "collaboration.output")
        order = self.topological_order()
        if len(order) != len(self.nodes):
            stuck = next(n for n in self.nodes if n not in order and self._on_cycle(n))
            raise InvalidGraph(stuck, "is on a cycle without a bound; make the edge back a loop edge with max_iterations", "collaboration.edges")
        for e in self.loops:
            if e.source not in self.descendants(e.target):
                raise InvalidGraph(e.source, f"loop edge {e.source} -> {e.target} does not go back: {e.target!r} does not reach {e.source!r}", "collaboration.edges")
        entries = self.entries()
        if not entries:
            raise InvalidGraph(None, "the graph has no entry node", "collaboration.entry")
        for name in entries:
            if self.in_edges(name):
                raise InvalidGraph(name, "an entry node cannot have forward predecessors", "collaboration.entry")
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
                raise InvalidGraph(name, f"cannot reach the output node {output!r}", "collaboration.edges")
        for name, node in self.nodes.items():
            plain = [e.source for e in self.in_edges(name) if e.when is None]
            if len(plain) > 1 and not node.join:
                raise InvalidGraph(name, f"receives several unconditional inputs ({', '.join(plain)}) but is not a join node; set join", "collaboration.nodes.join")
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


def graph_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of a graph's dict form, for the server's OpenAPI document."""
    condition = {
        "type": "object",
        "description": "A predicate on the source node's output text.",
        "oneOf": [
            {"required": ["contains"], "properties": {"contains": {"type": "string", "minLength": 1}}, "additionalProperties": False},
            {"required": ["not_contains"], "properties": {"not_contains": {"type": "string", "minLength": 1}}, "additionalProperties": False},
            {"required": ["regex"], "properties": {"regex": {"type": "string"}}, "additionalProperties": False},
            {"required": ["validator"], "properties": {"validator": {"type": "object", "required": ["type"]}}, "additionalProperties": False},
        ],
    }
    node = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "instructions": {"type": "string"},
            "adapter": {"type": ["string", "null"]},
            "model": {"type": ["string", "null"]},
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
            "max_tokens": {"type": ["integer", "null"], "minimum": 1},
            "count": {"type": "integer", "minimum": 1, "maximum": MAX_NODE_COUNT},
            "join": {"type": "boolean"},
        },
    }
    edge = {
        "type": "object",
        "required": ["from", "to"],
        "additionalProperties": False,
        "properties": {
            "from": {"type": "string"},
            "to": {"type": "string"},
            "when": condition,
            "max_iterations": {"type": "integer", "minimum": 1},
        },
    }
    names = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "CollaborationGraph",
        "type": "object",
        "properties": {
            "nodes": {"type": "array", "items": {"oneOf": [{"type": "string"}, node]}},
            "edges": {"type": "array", "items": edge},
            "entry": names,
            "output": {"type": "string"},
        },
        "additionalProperties": False,
    }


def as_graph(value: Graph | Mapping[str, Any], agents: Iterable[AgentSpec] = ()) -> Graph:
    """A validated graph from a ``Graph`` or its dict form."""
    graph = value if isinstance(value, Graph) else Graph.from_dict(value, tuple(agents))
    return graph.validate()
