"""Code review: three reviewers vote on whether a ~2 400-token file has a bug,
then an aggregator writes the review. The README's main job (`make demo`).

Everything runs in this process on one vLLM engine serving the embedded default
model (SmolLM2-135M-Instruct). The file is prefilled once; the three reviewers
fork from it, reason, and answer yes/no with a constrained continuation of their
own reasoning (served from the prefix cache); the vote stops as soon as it is
decided; the aggregator continues the first majority reviewer's thread.

    python demos/code_review.py [--file PATH] [--reviewers 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio
from microagent import AgentSpec, EngineBridge, Outcome, VLLMBridge, collaborate
from microagent.console import LiveView, open_engines, quiet_engine_logs, summary_table

HERE = Path(__file__).parent
DEFAULT_FILE = HERE / "data" / "inventory.py"

SYSTEM = "You are a careful senior Python reviewer. You read code closely and you are brief."
REVIEWER = (
    "Does this file contain a bug? Look closely at reserve(): compare the check with its "
    "docstring and with demo(). Think it through in two or three sentences."
)
AGGREGATOR = (
    "Write the code review: name the bug (function, line, why) and the fix, "
    "in at most four sentences."
)


def messages(source: str, path: str) -> list[dict[str, str]]:
    """The task context: shared by every role, so it goes first (and is prefilled once)."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Here is `{path}`:\n```python\n{source}\n```"},
    ]


async def review(
    engine: EngineBridge,
    source: str,
    path: str = "inventory.py",
    *,
    reviewers: int = 3,
    max_tokens: int = 96,
    on_event: object = None,
) -> Outcome:
    """Run the review collaboration on ``engine`` and return its outcome."""
    agents = [
        AgentSpec("reviewer", count=reviewers, instructions=REVIEWER, temperature=0.8),
        AgentSpec("aggregator", role="aggregator", instructions=AGGREGATOR, max_tokens=128),
    ]
    return await collaborate(
        engine,
        "vote",
        messages(source, path),
        agents,
        answer={"choices": ["yes", "no"]},
        style="reason",
        max_tokens=max_tokens,
        on_event=on_event,  # type: ignore[arg-type]
    )


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE, help="the source file to review")
    parser.add_argument("--reviewers", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and torch's logs")
    args = parser.parse_args(argv)
    quiet_engine_logs(args.verbose)  # their logs go to a file unless --verbose
    source = args.file.read_text()
    print(f"reviewing {args.file.name} with {args.reviewers} reviewers", flush=True)
    engine = VLLMBridge("default")
    async with open_engines([engine]) as started:  # progress while the engine starts
        view = LiveView(sys.stdout)
        t0 = time.monotonic()
        outcome = await review(
            engine,
            source,
            args.file.name,
            reviewers=args.reviewers,
            max_tokens=args.max_tokens,
            on_event=view,
        )
        view.finish()
        seconds = time.monotonic() - t0
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        print()
        print(summary_table(outcome, seconds, engine_seconds=started.seconds))
        print(f"\nbug found by the vote: {outcome.details.get('decision')}")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
