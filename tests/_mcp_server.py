"""A real stdio MCP server for the tests (the official SDK's MCPServer): add, fail (, slow).

With ``MCP_PID_FILE`` in its environment it writes its process id there first (a test
that kills it finds it so).
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails (a ToolError: the SDK sends its message to the client)."""
    raise ToolError(f"refused: {reason}")


async def slow(marker: str) -> str:
    """Writes ``marker`` to the file named in argv[1], then waits forever."""
    await anyio.Path(sys.argv[1]).write_text(marker)
    await anyio.sleep_forever()
    return "unreachable"


if __name__ == "__main__":
    if os.environ.get("MCP_PID_FILE"):
        with open(os.environ["MCP_PID_FILE"], "w") as f:
            f.write(str(os.getpid()))
    if len(sys.argv) > 1:  # a marker file to write: offer the tool that never returns
        server.tool()(slow)
    server.run()
