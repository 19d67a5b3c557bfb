"""A pydantic-ai agent (``pydantic-ai-slim[openai]``) against microagent, unchanged.

``python pydantic_ai_agent.py BASE_URL chat|responses structured|tool|stream`` runs
one agent and prints a JSON line:

* ``structured``: an ``output_type`` model, which pydantic-ai asks for as a forced
  call of its ``final_result`` tool (``tool_choice`` required): the validated output;
* ``tool``: a function tool beside the structured output, offered until it has been
  called once (pydantic-ai's ``prepare``; the default model would call it on every
  forced turn): the tool's calls, the results sent back, and the validated output;
* ``stream``: ``run_stream`` of a plain text answer: the text deltas.

Each line carries the usage pydantic-ai counted (requests, input and output tokens).
"""

from __future__ import annotations

import asyncio
import json
import sys

from pydantic import BaseModel
from pydantic_ai import Agent, AgentRunResult, RunContext
from pydantic_ai.messages import ModelRequest, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import UsageLimits

CALLS: list[str] = []


class Stock(BaseModel):
    """How many units of an item are in stock."""

    item: str
    units: int


def lookup_stock(item: str) -> str:
    """Look up how many units of an item are in stock."""
    CALLS.append(item)
    return f"{item}: 17 units in stock"


async def until_called(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
    """Offer the tool until it has been called once (then only the output tool is left)."""
    return None if CALLS else tool


def returns(result: AgentRunResult[Stock]) -> list[str]:
    """The tool results the model was sent back."""
    return [
        str(part.content)
        for message in result.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def main(base_url: str, api: str, how: str) -> None:
    provider = OpenAIProvider(base_url=base_url, api_key="unused")
    model = (
        OpenAIChatModel("default", provider=provider)
        if api == "chat"
        else OpenAIResponsesModel("default", provider=provider)
    )
    settings = ModelSettings(max_tokens=64, temperature=0)
    limits = UsageLimits(request_limit=4)
    out: dict[str, object] = {}
    if how == "stream":
        agent: Agent[None, object] = Agent(
            model, instructions="Answer in one short sentence.", model_settings=settings
        )
        deltas: list[str] = []
        async with agent.run_stream("What is the capital of France?", usage_limits=limits) as run:
            async for delta in run.stream_text(delta=True, debounce_by=None):
                deltas.append(delta)
        usage = run.usage
        out = {"deltas": len(deltas), "text": "".join(deltas)}
    elif how == "tool":
        agent = Agent(
            model,
            output_type=Stock,
            instructions="You answer stock questions. Look items up with lookup_stock.",
            model_settings=settings,
        )
        agent.tool_plain(prepare=until_called)(lookup_stock)
        result = await agent.run("How many units of SKU-1234 are left?", usage_limits=limits)
        usage = result.usage
        out = {"output": result.output.model_dump(), "calls": CALLS, "returns": returns(result)}
    else:
        agent = Agent(
            model,
            output_type=Stock,
            instructions="You answer stock questions.",
            model_settings=settings,
        )
        result = await agent.run(
            "How many units of SKU-1234 are left? The answer is 17.", usage_limits=limits
        )
        usage = result.usage
        out = {"output": result.output.model_dump(), "calls": CALLS}
    out["usage"] = {
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
