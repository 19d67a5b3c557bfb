"""An AutoGen AgentChat ``AssistantAgent`` (autogen-ext's OpenAI client) against microagent.

``python autogen_agent.py BASE_URL once|stream|structured`` runs one agent and prints
a JSON line. ``once`` and ``stream`` give it a function tool and reflect on its
result (AutoGen's reflection request sends the tools with ``tool_choice: "none"``);
``stream`` streams the model's tokens too. ``structured`` asks for an
``output_content_type`` (a ``json_schema`` response format). The line holds the
tool calls (name and raw arguments), the tool results, the errors AutoGen
recorded, the final text or structured content, how many streamed chunks came,
and the prompt and completion tokens summed over the run's messages.
"""

from __future__ import annotations

import asyncio
import json
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.messages import (
    ModelClientStreamingChunkEvent,
    StructuredMessage,
    TextMessage,
    ToolCallExecutionEvent,
    ToolCallRequestEvent,
    ToolCallSummaryMessage,
)
from autogen_ext.models.openai import OpenAIChatCompletionClient
from pydantic import BaseModel


async def lookup_stock(item: str) -> str:
    """Look up how many units of an item are in stock."""
    return f"{item}: 17 units in stock"


class Stock(BaseModel):
    """How many units of an item are in stock."""

    item: str
    units: int


async def main(base_url: str, how: str) -> None:
    client = OpenAIChatCompletionClient(
        model="default",
        base_url=base_url,
        api_key="unused",
        temperature=0,
        max_tokens=64,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": True,
            "structured_output": True,
            "family": "unknown",
        },
    )
    if how == "structured":
        agent = AssistantAgent(
            "clerk",
            model_client=client,
            system_message="You answer stock questions as JSON.",
            output_content_type=Stock,
        )
        task = "How many units of SKU-1234 are left? The answer is 17."
    else:
        agent = AssistantAgent(
            "clerk",
            model_client=client,
            tools=[lookup_stock],
            system_message="You answer stock questions. Use the lookup_stock tool.",
            reflect_on_tool_use=True,
            model_client_stream=how == "stream",
        )
        task = "How many units of SKU-1234 are left?"
    chunks = 0
    result: TaskResult | None = None
    async for message in agent.run_stream(task=task):
        if isinstance(message, TaskResult):
            result = message
        elif isinstance(message, ModelClientStreamingChunkEvent):
            chunks += 1
    assert result is not None
    calls: list[dict[str, str]] = []
    results: list[str] = []
    errors: list[str] = []
    prompt = completion = 0
    for m in result.messages:
        if m.models_usage is not None:
            prompt += m.models_usage.prompt_tokens
            completion += m.models_usage.completion_tokens
        if isinstance(m, ToolCallRequestEvent):
            calls += [{"name": c.name, "arguments": c.arguments} for c in m.content]
        elif isinstance(m, ToolCallExecutionEvent):
            results += [r.content for r in m.content]
            errors += [r.content for r in m.content if r.is_error]
    final = result.messages[-1]
    print(
        json.dumps(
            {
                "calls": calls,
                "tool_results": results,
                "errors": errors,
                "final_type": type(final).__name__,
                "final": final.content.model_dump()
                if isinstance(final, StructuredMessage)
                else final.content
                if isinstance(final, TextMessage | ToolCallSummaryMessage)
                else None,
                "chunks": chunks,
                "stop_reason": result.stop_reason,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
            }
        )
    )
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:3]))
