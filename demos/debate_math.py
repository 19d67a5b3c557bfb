"""Debate on small math word problems: three agents, two rounds, stop when all agree.

Each agent keeps its own append-only thread (served from the prefix cache
round after round); the others' answers arrive as KV handles.

    python demos/debate_math.py [--problems 2]
"""

from __future__ import annotations

import argparse
import sys

import anyio
from microagent import AgentSpec, EngineBridge, Outcome, VLLMBridge, collaborate
from microagent.console import open_engines, quiet_engine_logs

PROBLEMS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "7"),
    ("A box holds 6 eggs. How many eggs are in 2 boxes?", "12"),
    ("Sara had 10 pencils and gave away 3. How many pencils are left?", "7"),
]


async def solve(
    engine: EngineBridge,
    problem: str,
    *,
    rounds: int = 2,
    max_tokens: int = 48,
    on_event: object = None,
) -> Outcome:
    return await collaborate(
        engine,
        "debate",
        problem,
        [AgentSpec("debater", count=3, temperature=0.7)],
        rounds=rounds,
        max_tokens=max_tokens,
        on_event=on_event,  # type: ignore[arg-type]
    )


def show(event: object) -> None:
    kind = getattr(event, "type", "")
    data = getattr(event, "data", {})
    if kind == "round":
        print(f"  round {data['round']}: {data['answers']}", flush=True)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and torch's logs")
    args = parser.parse_args(argv)
    quiet_engine_logs(args.verbose)  # vLLM's and torch's logs go to a file unless --verbose
    engine = VLLMBridge("default")
    async with open_engines([engine]):
        for problem, expected in PROBLEMS[: args.problems]:
            print(f"\n{problem}  (expected {expected})")
            outcome = await solve(engine, problem, on_event=show)
            u = outcome.usage
            print(
                f"  answer: {outcome.answer!r}  rounds: {outcome.rounds}  "
                f"early stop: {outcome.early_stopped}"
            )
            print(
                f"  prompt tokens {u.prompt_tokens}, cached {u.cached_tokens}, "
                f"generated {u.completion_tokens}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
