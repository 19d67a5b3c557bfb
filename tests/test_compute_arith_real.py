"""compute's programs of named steps on the real engine (the default model, temperature 0).

Nothing is patched: the steps the model writes are evaluated by the sandboxed
calculator, and the test recomputes every recorded value with Python itself
(each step first checked by the calculator's own language check, in process).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from _engine import RealEngine
from microagent.collab import AgentSpec, Outcome, collaborate
from microagent.collab._arith import CONSTANTS, FUNCTIONS, check_step

pytestmark = pytest.mark.engine

QUESTION = "A box holds 6 eggs. Tom buys 4 boxes and breaks 5 eggs. How many eggs are left?"


def python_value(step: str, env: dict[str, Any]) -> Any:
    """``step``'s value computed by Python (``eval``), after the language check."""
    name, _ = check_step(step, env)
    expression = step.partition("=")[2]
    value = eval(expression, {"__builtins__": {}, **FUNCTIONS, **CONSTANTS}, dict(env))
    env[name] = value
    return value


def test_compute_steps_are_evaluated_in_the_sandbox_and_reach_the_next_step(
    real_engine: RealEngine,
) -> None:
    events: list[Any] = []

    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge,
            "compute",
            QUESTION,
            [AgentSpec("solver", temperature=0.0)],
            steps=3,
            expression_tokens=24,
            max_tokens=32,
            on_event=events.append,
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    (program,) = outcome.details["programs"]
    steps = program["steps"]
    evaluated = [s for s in steps if "value" in s]
    # the model wrote a step that ran, and was asked for another after it
    assert len(steps) >= 2 and "value" in steps[0], program
    env: dict[str, Any] = {}
    for step in evaluated:  # the sandbox's values are Python's values of the same steps
        expected = python_value(step["step"], env)
        assert math.isclose(step["value"], expected), (step, expected)
    # each step's turn was shown the earlier steps with the sandbox's values
    for k, step in enumerate(steps):
        assert len(step["seen"]) == k
        for before, line in zip(evaluated, step["seen"], strict=False):
            assert line.startswith(before["step"]) and line.endswith(f"# = {before['value']:g}")
    results = [e.data for e in events if e.type == "tool_result" and e.data["label"] == "step"]
    assert [r["ok"] for r in results] == ["value" in s for s in steps]  # one sandbox call each
    assert [r["output"] for r in results if r["ok"]] == [str(s["value"]) for s in evaluated]
    # the prompts grew with the steps shown: step 2's prompt holds step 1's line
    prompts = [
        e.data["prompt_tokens"]
        for e in events
        if e.type == "agent_finished" and e.data["label"] == "step"
    ]
    assert len(prompts) == len(steps) and prompts == sorted(set(prompts))
    if program.get("answer"):
        assert outcome.details["path"] == "computed"
        assert outcome.answer == program["answer"]
