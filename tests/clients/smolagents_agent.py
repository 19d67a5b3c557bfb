"""A smolagents ``ToolCallingAgent`` over ``OpenAIServerModel`` against microagent.

``python smolagents_agent.py BASE_URL once|stream`` runs the agent with one function
tool; every model step sends ``tool_choice: "required"`` with that tool and
smolagents' own ``final_answer`` tool (plus its stop sequences), and ``stream``
streams each step's tool-call deltas. It prints a JSON line: each step's tool calls
(name and arguments), the errors smolagents recorded per step, the run's state
and output, and its token usage.
"""

from __future__ import annotations

import contextlib
import json
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool
from smolagents.memory import ActionStep


@tool
def lookup_stock(item: str) -> str:
    """Look up how many units of an item are in stock.

    Args:
        item: The item's name or SKU.
    """
    return f"{item}: 17 units in stock"


def main(base_url: str, how: str) -> None:
    model = OpenAIServerModel(
        model_id="default", api_base=base_url, api_key="unused", temperature=0, max_tokens=64
    )
    with contextlib.redirect_stdout(sys.stderr):  # its live display: the JSON line is ours
        agent = ToolCallingAgent(
            tools=[lookup_stock],
            model=model,
            max_steps=4,
            stream_outputs=how == "stream",
            verbosity_level=0,
        )
        run = agent.run("How many units of SKU-1234 are left?", return_full_result=True)
    calls: list[dict[str, object]] = []
    errors: list[str] = []
    observations: list[str] = []
    for step in agent.memory.steps:
        if not isinstance(step, ActionStep):
            continue
        calls += [{"name": c.name, "arguments": c.arguments} for c in step.tool_calls or []]
        if step.error is not None:
            errors.append(f"{type(step.error).__name__}: {step.error}")
        if step.observations:
            observations.append(step.observations)
    usage = run.token_usage
    print(
        json.dumps(
            {
                "calls": calls,
                "errors": errors,
                "observations": observations,
                "state": run.state,
                "output": run.output,
                "usage": {
                    "input_tokens": usage.input_tokens if usage else 0,
                    "output_tokens": usage.output_tokens if usage else 0,
                },
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
