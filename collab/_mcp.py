"""MCP servers as tool sources: every tool a stdio MCP server lists becomes a ``Tool``.

``async with mcp_tools("python my_server.py") as tools`` starts the server as a
subprocess (the official ``mcp`` SDK's stdio client), lists its tools and
yields them; calling one sends ``tools/call`` on the open session, and leaving
the block stops the server. A call that the server answers with ``isError``
reaches the model as an error result, like a Python tool's exception.
``mcp_connection`` yields the same tools with an event set when the server's
output ends (it exited or crashed): what a supervisor restarts it on.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import attrs

from ._errors import CollaborationError
from ._tools import DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TOOL_TIMEOUT, Tool


class ToolServerError(CollaborationError):
    """An MCP server could not be started or listed (names the command)."""


class ToolCallFailed(Exception):
    """The MCP server answered a call with ``isError`` (the text is what the model sees)."""


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class McpServer:
    """How to start one MCP server over stdio: a command, its arguments, extra environment."""

    command: str
    args: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    env: Mapping[str, str] | None = attrs.field(default=None, eq=False)

    @classmethod
    def parse(cls, command_line: str) -> McpServer:
        """A server from one shell-like command line (``"python server.py --flag"``)."""
        words = shlex.split(command_line)
        if not words:
            raise ToolServerError("an MCP server needs a command")
        return cls(words[0], tuple(words[1:]))


@attrs.define(eq=False)
class McpConnection:
    """A started MCP server: its tools, and ``closed``, set once its output ended (the
    process exited or crashed; its tools' calls then fail)."""

    tools: list[Tool]
    closed: Any  # an anyio.Event (anyio is imported when a server starts)


@contextlib.asynccontextmanager
async def mcp_tools(
    server: McpServer | str,
    *,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> AsyncIterator[list[Tool]]:
    """Start ``server``, yield its tools, stop it when the block ends.

    Raises:
        ToolServerError: the server did not start, or did not answer the handshake
            and the tool listing within ``timeout`` seconds.
    """
    async with mcp_connection(server, timeout=timeout, max_output_chars=max_output_chars) as c:
        yield c.tools


@contextlib.asynccontextmanager
async def mcp_connection(
    server: McpServer | str,
    *,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> AsyncIterator[McpConnection]:
    """Start ``server`` and yield its tools with the event of its end (``McpConnection``);
    stop it when the block ends.

    Raises:
        ToolServerError: as ``mcp_tools``.
    """
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    spec = McpServer.parse(server) if isinstance(server, str) else server
    params = StdioServerParameters(
        command=spec.command, args=list(spec.args), env=dict(spec.env) if spec.env else None
    )
    where = shlex.join([spec.command, *spec.args])
    started = False
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:  # the contexts open task groups: enter them outside the deadline's scope
                streams = await stack.enter_async_context(stdio_client(params))
                closed = anyio.Event()
                relay = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(relay.cancel_scope.cancel)  # on exit, before the relay's group
                received = await relay.start(_relay, streams[0], closed)
                session = await stack.enter_async_context(ClientSession(received, streams[1]))
                with anyio.fail_after(timeout):
                    await session.initialize()
                    listed = await session.list_tools()
            except Exception as exc:  # cancellation is a BaseException: it passes through
                raise ToolServerError(f"MCP server {where!r}: {type(exc).__name__}: {exc}") from exc
            started = True
            tools = [
                Tool(
                    name=item.name,
                    fn=_caller(session, item.name),
                    description=item.description or "",
                    parameters=_clean_schema(item.input_schema),
                    timeout=timeout,
                    max_output_chars=max_output_chars,
                )
                for item in listed.tools
            ]
            yield McpConnection(tools, closed)
    except BaseExceptionGroup as group:  # the stdio client's task group wraps a start failure
        failure = _start_failure(group) if not started else None
        if failure is None:
            raise
        raise failure from None


async def _relay(source: Any, closed: Any, *, task_status: Any) -> None:
    """Pass the server's messages on to the session; set ``closed`` when they end (the
    process exited: its stdout closed)."""
    import anyio

    send, receive = anyio.create_memory_object_stream[Any](0)
    task_status.started(receive)
    try:
        async with send:
            async for message in source:
                await send.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
        pass
    finally:
        closed.set()


def _start_failure(group: BaseExceptionGroup[BaseException]) -> ToolServerError | None:
    for exc in group.exceptions:
        if isinstance(exc, ToolServerError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _start_failure(exc)
            if found is not None:
                return found
    return None


def _caller(session: Any, name: str) -> Any:
    async def call(**arguments: Any) -> str:
        result = await session.call_tool(name, arguments)
        text = "\n".join(
            str(getattr(part, "text", "")) for part in result.content if hasattr(part, "text")
        )
        if result.is_error:
            raise ToolCallFailed(text or f"{name} failed")
        return text

    call.__name__ = name
    return call


def _clean_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's input schema without pydantic's ``title`` noise (fewer prompt tokens)."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "title"}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    out = clean(dict(schema))
    out.setdefault("type", "object")
    return out  # type: ignore[no-any-return]
