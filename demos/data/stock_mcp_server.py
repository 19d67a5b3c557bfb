"""The demo's stock tool served over MCP (stdio), with the official SDK's MCPServer."""

from typing import Literal

from mcp.server.mcpserver import MCPServer

STOCK = {"apples": 12, "pears": 0, "plums": 7}
server = MCPServer("stock")


@server.tool()
def stock(item: Literal["apples", "pears", "plums"]) -> str:
    """How many units of an item are in stock."""
    return f"{STOCK[item]} {item} in stock"


if __name__ == "__main__":
    server.run()
