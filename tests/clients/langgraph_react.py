"""A LangGraph ReAct agent (``create_react_agent`` + langchain-openai) against microagent.

``python langgraph_react.py BASE_URL required|auto [QUESTION]`` prints a JSON line: the
tool's calls, the tool results the model read next, whether the graph finished
or stopped at its step limit, and the last message's text.
"""

from __future__ import annotations

import json
import sys

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

CALLS: list[str] = []


@tool
def lookup_stock(item: str) -> str:
    """Look up how many units of an item are in stock."""
    CALLS.append(item)
    return f"{item}: 17 units in stock"


QUESTION = "How many units of SKU-1234 are left?"


def main(base_url: str, choice: str, question: str = QUESTION) -> None:
    llm = ChatOpenAI(
        model="default", base_url=base_url, api_key="unused", temperature=0, max_tokens=64
    )
    model = llm.bind_tools([lookup_stock], tool_choice=choice) if choice == "required" else llm
    graph = create_react_agent(model, tools=[lookup_stock])
    messages: list[object] = []
    finished = True
    try:
        for update in graph.stream(
            {"messages": [("user", question)]},
            config={"recursion_limit": 5},
            stream_mode="updates",
        ):
            for node in update.values():
                messages.extend(node.get("messages", []))
    except GraphRecursionError:
        finished = False
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    ais = [m for m in messages if isinstance(m, AIMessage)]
    print(
        json.dumps(
            {
                "calls": CALLS,
                "tool_results": results,
                "model_turns": len(ais),
                "finished": finished,
                "last": str(ais[-1].content) if ais else None,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
