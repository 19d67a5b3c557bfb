"""Tools agents call during their turns, run in the loop without a client round trip.

A ``Tool`` wraps a plain Python function (sync or async); its JSON schema comes
from the type hints, its description from the docstring. An agent with tools
generates under the engine's tool-call constraint; each call it makes runs
inside the agent's actor (so it is cancelled with the collaboration), bounded
by the tool's timeout and output limit; the result is appended to the agent's
thread as a tool turn and the agent generates again, while its KV stays
retained. A tool's exception, timeout or bad arguments come back to the model
as an error result: they never kill the collaboration or the engine.
"""

from __future__ import annotations

import inspect
import json
import statistics
import types
import typing
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import anyio
import attrs

from ..engine_bridge import TOOL_NAME, FunctionTool, ToolPlan
from ._errors import InvalidCollaboration
from ._spec import AgentSpec

DEFAULT_TOOL_TIMEOUT = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 4000
#: how many rounds of tool calls one agent turn may make before it must answer
DEFAULT_MAX_TOOL_STEPS = 4

ToolFunction = Callable[..., Any]


@attrs.define(eq=False)
class ToolTimes:
    """Recent durations of each tool, which predict when an agent waiting on it comes back.

    An agent's step that may call tools is retained with ``expected(names)`` as
    its next use: under pressure, the engine keeps it while the wait is short
    against what recomputing it would cost (``Retain.next_use``).
    """

    keep: int = 32
    _seen: dict[str, deque[float]] = attrs.field(factory=dict, init=False)

    def observe(self, name: str, seconds: float) -> None:
        self._seen.setdefault(name, deque(maxlen=self.keep)).append(max(0.0, seconds))

    def expected(self, names: Iterable[str]) -> float | None:
        """The median recent duration over ``names`` (None: none of them has run yet)."""
        durations = [d for name in names for d in self._seen.get(name, ())]
        return statistics.median(durations) if durations else None


#: This process's tool durations (``run_calls`` records every call).
TOOL_TIMES = ToolTimes()


@attrs.frozen
class ToolOutcome:
    """What one call returned to the model: its text, and whether the tool succeeded."""

    text: str
    ok: bool
    duration: float


@attrs.frozen
class Tool:
    """A function an agent may call (``Tool.from_function(fn)`` reads its schema off the hints).

    Attributes:
        name: what the model calls it (``[A-Za-z0-9_-]{1,64}``).
        fn: the function; called with the call's arguments as keywords. Async
            functions run on the collaboration's event loop, sync ones in a worker
            thread (abandoned, not killed, on timeout or cancellation).
        description: what it does, for the model.
        parameters: the JSON schema of its arguments (an object).
        timeout: seconds one call may take; then the model gets a timeout error.
        max_output_chars: a longer result is cut to this size (and says so).
    """

    name: str
    fn: ToolFunction = attrs.field(eq=False)
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(factory=dict, eq=False)
    timeout: float = DEFAULT_TOOL_TIMEOUT
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS

    def __attrs_post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.name):
            raise InvalidCollaboration(
                "tools", f"tool name {self.name!r} is not {TOOL_NAME.pattern}"
            )
        if self.timeout <= 0 or self.max_output_chars < 1:
            raise InvalidCollaboration(
                "tools", f"tool {self.name!r}: timeout and output limit must be > 0"
            )

    @classmethod
    def from_function(
        cls,
        fn: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> Tool:
        """A tool from a type-hinted function (its docstring's first paragraph describes it)."""
        doc = inspect.getdoc(fn) or ""
        return cls(
            name=name or fn.__name__,
            fn=fn,
            description=description if description is not None else doc.split("\n\n")[0],
            parameters=parameters_schema(fn),
            timeout=timeout,
            max_output_chars=max_output_chars,
        )

    def describe(self) -> FunctionTool:
        return FunctionTool(self.name, self.description, self.parameters)

    async def call(self, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run one call; every failure becomes an error text for the model (not an exception)."""
        start = anyio.current_time()
        ok = False
        try:
            inspect.signature(self.fn).bind(**arguments)
        except TypeError as exc:  # arguments the function does not take
            return ToolOutcome(f"error: bad arguments for {self.name}: {exc}", False, 0.0)
        try:
            with anyio.fail_after(self.timeout):
                if inspect.iscoroutinefunction(self.fn):
                    value = await self.fn(**arguments)
                else:
                    value = await anyio.to_thread.run_sync(
                        lambda: self.fn(**arguments), abandon_on_cancel=True
                    )
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            ok = True
        except TimeoutError:
            text = f"error: {self.name} timed out after {self.timeout:g} s"
        except Exception as exc:
            text = f"error: {type(exc).__name__}: {exc}"
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n[cut at {self.max_output_chars} characters]"
        return ToolOutcome(text, ok, anyio.current_time() - start)


#: Tools as callers give them: ``Tool``s or plain functions.
ToolInput = Tool | ToolFunction


def as_tools(tools: Iterable[ToolInput] | None) -> dict[str, Tool]:
    """Tools by name (functions wrapped with ``Tool.from_function``); names must be unique."""
    out: dict[str, Tool] = {}
    for item in tools or ():
        tool = item if isinstance(item, Tool) else Tool.from_function(item)
        if tool.name in out:
            raise InvalidCollaboration("tools", f"tool name {tool.name!r} is used twice")
        out[tool.name] = tool
    return out


def unknown_agent_tool(
    specs: Sequence[AgentSpec], names: Iterable[str]
) -> tuple[int, AgentSpec, str] | None:
    """The first agent (index, spec) naming a tool not in ``names``, and that tool; or None."""
    known = set(names)
    for i, spec in enumerate(specs):
        for name in spec.tools or ():
            if name not in known:
                return i, spec, name
    return None


AgentToolChoice = Literal["auto", "required"]


def agent_tool_plan(tools: Mapping[str, Tool], choice: AgentToolChoice = "auto") -> ToolPlan:
    """The agents' plan: every tool offered; ``required``: one call it must make.

    ``auto`` allows parallel calls; ``required`` asks for exactly one (a small model
    asked for a list of calls repeats itself until the budget is spent).
    """
    offered = tuple(t.describe() for t in tools.values())
    return ToolPlan(offered, choice, parallel=choice == "auto")


async def run_calls(
    tools: Mapping[str, Tool], calls: Sequence[Mapping[str, Any]]
) -> list[ToolOutcome]:
    """Run a reply's calls concurrently; results in call order."""
    outcomes: list[ToolOutcome | None] = [None] * len(calls)

    async def one(i: int, call: Mapping[str, Any]) -> None:
        fn = call.get("function", {})
        tool = tools.get(str(fn.get("name")))
        if tool is None:
            outcomes[i] = ToolOutcome(f"error: no tool named {fn.get('name')!r}", False, 0.0)
            return
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            outcomes[i] = ToolOutcome("error: arguments must be a JSON object", False, 0.0)
            return
        outcome = outcomes[i] = await tool.call(arguments)
        TOOL_TIMES.observe(tool.name, outcome.duration)

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return [o for o in outcomes if o is not None]


# -- schemas from type hints --------------------------------------------------------------


def parameters_schema(fn: ToolFunction) -> dict[str, Any]:
    """The JSON schema of ``fn``'s keyword arguments, from its type hints."""
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in hints:
            raise InvalidCollaboration(
                "tools", f"{fn.__name__}: parameter {name!r} has no type hint"
            )
        properties[name] = _schema(hints[name], f"{fn.__name__}.{name}")
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _schema(hint: Any, where: str) -> dict[str, Any]:
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, Sequence) and args:
        return {"type": "array", "items": _schema(args[0], where)}
    if origin in (dict, Mapping):
        return {"type": "object"}
    if origin in (Union, types.UnionType):
        branches = [_schema(a, where) for a in args if a is not type(None)]
        if type(None) in args:
            branches.append({"type": "null"})
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    raise InvalidCollaboration("tools", f"{where}: no JSON schema for type {hint!r}")
