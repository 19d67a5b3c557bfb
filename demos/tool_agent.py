"""Agents that call tools inside the loop: a Python function and a real MCP server.

Two analysts debate a question about an inventory; each turn starts with a
constrained tool call (valid arguments by construction, even on the 135M
default model), the tool runs inside the agent's actor while its KV stays
retained, the result is appended to its thread and it answers from there —
no client round trip, no re-sent history.

    python demos/tool_agent.py [--mcp]   # --mcp: the stock tool is served by an MCP server
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import anyio
from microagent import AgentSpec, EngineBridge, Outcome, VLLMBridge, collaborate
from microagent.collab import CollaborationEvent, McpServer, Tool, mcp_tools
from microagent.console import open_engines, quiet_engine_logs

STOCK = {"apples": 12, "pears": 0, "plums": 7}
QUESTION = "Can we ship 5 pears today? Check the stock first."
MCP_SERVER = Path(__file__).parent / "data" / "stock_mcp_server.py"


def stock(item: Literal["apples", "pears", "plums"]) -> str:
    """How many units of an item are in stock."""
    return f"{STOCK[item]} {item} in stock"


async def ask(
    engine: EngineBridge,
    tools: Sequence[Tool | object],
    *,
    max_tokens: int = 48,
    on_event: object = None,
) -> Outcome:
    return await collaborate(
        engine,
        "debate",
        QUESTION,
        [AgentSpec("analyst", count=2, temperature=0.7)],
        rounds=1,
        max_tokens=max_tokens,
        tools=tools,  # type: ignore[arg-type]
        tool_choice="required",  # the 135M model rarely decides to call on its own
        max_tool_steps=1,
        on_event=on_event,  # type: ignore[arg-type]
    )


def show(event: CollaborationEvent) -> None:
    data = event.data
    if event.type == "tool_call":
        print(f"  {event.agent} calls {data['name']}({data['arguments']})", flush=True)
    elif event.type == "tool_result":
        mark = "ok" if data["ok"] else "error"
        print(f"  {event.agent} <- {data['output']!r} ({mark}, {data['duration']:.3f} s)")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mcp", action="store_true", help="serve the tool from an MCP server")
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and torch's logs")
    args = parser.parse_args(argv)
    quiet_engine_logs(args.verbose)
    engine = VLLMBridge("default")
    async with open_engines([engine]):
        print(QUESTION)
        if args.mcp:
            async with mcp_tools(McpServer(sys.executable, (str(MCP_SERVER),))) as tools:
                outcome = await ask(engine, tools, on_event=show)
        else:
            outcome = await ask(engine, [stock], on_event=show)
        u = outcome.usage
        print(f"  answer: {outcome.answer!r}")
        print(
            f"  tool calls {sum(r.tool_calls for r in outcome.agents)}, prompt tokens "
            f"{u.prompt_tokens}, cached {u.cached_tokens}, generated {u.completion_tokens}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
