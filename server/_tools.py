"""The request's ``tools`` and ``tool_choice``, checked: a 400 naming the field at fault.

The call format, its constraints and its parsing are the engine bridge's
(``engine_bridge/_tool_calls.py``); this module turns the OpenAI request's
JSON into a ``ToolPlan`` and renders the history's calls and results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..collab import (
    InvalidCollaboration,
    McpServer,
    Tool,
    ToolServerError,
    calculator_tool,
    check_schema_depth,
    sandbox_unavailable,
)
from ..engine_bridge import (
    TOOL_NAME,
    TOOL_NAME_PATTERN,
    FunctionTool,
    RequestRefused,
    ToolChoice,
    ToolFormat,
    ToolPlan,
    render_tool_calls,
)
from ._errors import bad_request
from ._openapi import MAX_TOOLS

# -- requests ------------------------------------------------------------------------------


def tool_plan(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    parallel_tool_calls: bool | None,
    call_format: ToolFormat | None = None,
) -> ToolPlan | None:
    """The request's tools, checked (a 400 naming the field at fault); ``None`` without tools.

    ``call_format``: the model's (``serve --tool-call-parser``); a format that does not
    allow ``auto`` refuses it with vLLM's 400.
    """
    if not tools:  # ``tools: []`` is no tools (the OpenAI Agents SDK sends it for every agent)
        if tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    parsed: list[FunctionTool] = []
    for i, raw in enumerate(tools):
        parsed.append(_function_tool(raw, f"tools[{i}]"))
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", "tools")
    choice, named = _choice(tool_choice, names)
    if call_format is None:
        return ToolPlan(tuple(parsed), choice, named, parallel_tool_calls)
    if choice == "auto" and not call_format.auto:
        raise bad_request(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
            "to be set",
            "tool_choice",
        )
    return ToolPlan(tuple(parsed), choice, named, parallel_tool_calls, call_format)


def _function_tool(raw: Mapping[str, Any], where: str) -> FunctionTool:
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        raise bad_request(f'{where}.type must be "function"', f"{where}.type")
    unknown = sorted(set(raw) - {"type", "function"})
    if unknown:
        raise bad_request(f"{where}: unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
    fn = raw.get("function")
    if not isinstance(fn, Mapping):
        raise bad_request(f"{where}.function must be an object", f"{where}.function")
    unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if unknown:
        field = f"{where}.function.{unknown[0]}"
        raise bad_request(f"{field}: unknown field", field)
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request(
            f"{where}.function.name must match {TOOL_NAME_PATTERN}", f"{where}.function.name"
        )
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise bad_request(
            f"{where}.function.description must be a string", f"{where}.function.description"
        )
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    check_json_schema(parameters, f"{where}.function.parameters")
    return FunctionTool(name, description, parameters)


def _choice(
    choice: str | Mapping[str, Any] | None, names: Sequence[str]
) -> tuple[ToolChoice, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request(
                f'tool_choice must be "none", "auto", "required" or a function, got {choice!r}',
                "tool_choice",
            )
        return choice, None  # type: ignore[return-value]
    fn = choice.get("function") if choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise bad_request(
            'tool_choice must be {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"tool_choice names {name!r}, which is not in tools ({sorted(names)})",
            "tool_choice.function.name",
        )
    return "named", name


def check_json_schema(schema: object, param: str) -> None:
    """A 400 naming ``param`` unless ``schema`` is a JSON Schema the engine can apply
    (nested at most ``MAX_SCHEMA_DEPTH`` levels, valid, without ``$ref``)."""
    if not isinstance(schema, Mapping):
        raise bad_request(f"{param} must be a JSON Schema object", param)
    try:  # before anything walks it recursively (jsonschema, the engine's grammar)
        check_schema_depth(schema, param)
    except InvalidCollaboration as exc:
        raise bad_request(f"{param}: {exc.reason}", param) from None
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise bad_request(f"{param} is not a valid JSON Schema: {exc.message}", param) from None
    if "$ref" in json.dumps(schema):
        raise bad_request(f"{param}: $ref is not supported", param)


def history_calls(
    content: str | None,
    calls: Sequence[Mapping[str, Any]],
    where: str,
    call_format: ToolFormat | None = None,
) -> str:
    """An assistant message's ``tool_calls`` as the model wrote them (a 400 when malformed)."""
    try:
        if call_format is not None:
            return render_tool_calls(content, calls, where, call_format)
        return render_tool_calls(content, calls, where)
    except RequestRefused as exc:
        raise bad_request(f"{exc.field}: {exc.reason}", exc.field) from None


def builtin_calculator() -> Tool:
    """``serve --calculator``'s tool; a ValueError when no sandbox can be built (fail closed)."""
    reason = sandbox_unavailable()
    if reason is not None:
        raise ValueError(f"--calculator: this machine cannot sandbox its evaluations: {reason}")
    return calculator_tool()


def load_tool(spec: str) -> Tool:
    """``NAME=module:function`` (``serve --tool``) as a ``Tool``; a ValueError names the fault."""
    name, sep, target = spec.partition("=")
    module_name, colon, attr = target.partition(":")
    if not sep or not colon or not name or not module_name or not attr:
        raise ValueError(f"--tool {spec!r}: expected NAME=MODULE:FUNCTION")
    import importlib

    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--tool {spec!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"--tool {spec!r}: {target} is not callable")
    try:
        return Tool.from_function(fn, name=name)
    except InvalidCollaboration as exc:
        raise ValueError(f"--tool {spec!r}: {exc.reason}") from None


def mcp_server(spec: str) -> tuple[str, McpServer]:
    """``NAME=COMMAND`` (``serve --mcp``) as a named ``McpServer``; a ValueError names the fault."""
    name, sep, command = spec.partition("=")
    if not sep or not name or not command.strip():
        raise ValueError(f"--mcp {spec!r}: expected NAME=COMMAND")
    try:
        return name, McpServer.parse(command)
    except (ValueError, ToolServerError) as exc:
        raise ValueError(f"--mcp {spec!r}: {exc}") from None
