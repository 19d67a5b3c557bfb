"""The OpenAI Agents SDK against a microagent server, as a new user runs it (peer venv).

``python agents_sdk.py BASE_URL chat|responses stream|once`` runs one agent with
one function tool and prints a JSON line: the tool's calls, the final output,
and (streamed) how many events the run gave.
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


async def main(base_url: str, api: str, how: str) -> None:
    set_tracing_disabled(True)  # no traces to OpenAI's servers
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    model = (
        OpenAIChatCompletionsModel("default", client)
        if api == "chat"
        else OpenAIResponsesModel("default", client)
    )
    agent = Agent(
        name="clerk",
        instructions="You answer stock questions. Use the lookup_stock tool.",
        tools=[lookup_stock],
        model=model,
        model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0),
    )
    question = "How many units of SKU-1234 are left?"
    events = 0
    if how == "stream":
        run = Runner.run_streamed(agent, question, max_turns=4)
        async for _ in run.stream_events():
            events += 1
        final = run.final_output
    else:
        result = await Runner.run(agent, question, max_turns=4)
        final = result.final_output
    print(json.dumps({"calls": CALLS, "final": final, "events": events}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
