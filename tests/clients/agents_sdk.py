"""The OpenAI Agents SDK against a microagent server, as a new user runs it (peer venv).

``python agents_sdk.py BASE_URL chat|responses stream|once [tool|none]`` runs one
agent, with one function tool (its calls forced by ``tool_choice="required"``) or
with none (the SDK then sends ``tools: []`` on every request), and prints a JSON
line: the tool's calls, the final output, (streamed) how many events the run
gave, and the usage the SDK counted.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

CALLS: list[str] = []


@function_tool
def lookup_stock(item: str) -> str:
    """Look up how many units of an item are in stock."""
    CALLS.append(item)
    return f"{item}: 17 units in stock"


async def main(base_url: str, api: str, how: str, tools: str = "tool") -> None:
    set_tracing_disabled(True)  # no traces to OpenAI's servers
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    model = (
        OpenAIChatCompletionsModel("default", client)
        if api == "chat"
        else OpenAIResponsesModel("default", client)
    )
    if tools == "tool":
        agent = Agent(
            name="clerk",
            instructions="You answer stock questions. Use the lookup_stock tool.",
            tools=[lookup_stock],
            model=model,
            model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0),
        )
        question = "How many units of SKU-1234 are left?"
    else:  # the simplest agent there is: instructions and a model
        agent = Agent(
            name="guide",
            instructions="You answer in one short sentence.",
            model=model,
            model_settings=ModelSettings(max_tokens=64, temperature=0),
        )
        question = "What is the capital of France?"
    events = 0
    if how == "stream":
        run = Runner.run_streamed(agent, question, max_turns=4)
        async for _ in run.stream_events():
            events += 1
        final = run.final_output
        usage = run.context_wrapper.usage
    else:
        result = await Runner.run(agent, question, max_turns=4)
        final = result.final_output
        usage = result.context_wrapper.usage
    print(
        json.dumps(
            {
                "calls": CALLS,
                "final": final,
                "events": events,
                "usage": {
                    "requests": usage.requests,
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                },
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
