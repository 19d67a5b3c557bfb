"""Graph review: planner -> 2 coders -> reviewer -> (REJECTED: back to the coders, at most
twice) -> final, on one in-process vLLM engine serving the embedded default model.

The roles come from Markdown files in demos/roles/ (planner.md, coder.md, reviewer.md);
the graph is declared with ``Graph`` and run by the ``graph`` collaboration mode: the
task is prefilled once, the two coders' common prompt is warmed once, every output
travels to the next role as a KV handle, and the reviewer's verdict decides the loop.

    python demos/graph_review.py [--task TEXT] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio
from microagent import (
    CollaborationEvent,
    EngineBridge,
    Graph,
    Outcome,
    VLLMBridge,
    collaborate,
    load_roles,
)
from microagent.console import open_engines, quiet_engine_logs

HERE = Path(__file__).parent
TASK = "Write a Python function is_palindrome(s) that ignores case and spaces."


def build_graph(roles_dir: Path = HERE / "roles") -> Graph:
    """The review graph, from the role files (the docs page draws it)."""
    roles = load_roles(roles_dir)
    return (
        Graph()
        .add(roles["planner"].to_node())
        .add(roles["coder"].to_node(count=2))
        .add(roles["reviewer"].to_node())
        .node(
            "final",
            "Give the final version of the code, and nothing else.",
            max_tokens=256,
            temperature=0.0,
        )
        .edge("planner", "coder")
        .edge("coder", "reviewer")
        .edge("reviewer", "coder", when={"not_contains": "APPROVED"}, max_iterations=2)
        .edge("reviewer", "final")
    )


async def review(
    engine: EngineBridge, task: str = TASK, *, max_tokens: int = 256, on_event: object = None
) -> Outcome:
    """Run the review graph on ``engine``."""
    return await collaborate(
        engine, "graph", task, graph=build_graph(), on_event=on_event, max_tokens=max_tokens
    )  # type: ignore[arg-type]


async def main(task: str, as_json: bool) -> int:
    def on_event(e: CollaborationEvent) -> None:
        if as_json:
            return
        if e.type == "node_started":
            print(
                f"\n== {e.data['node']} (run {e.data['iteration']}) "
                f"<- {', '.join(e.data['inputs']) or 'task'}",
                flush=True,
            )
        elif e.type == "agent_finished":
            print(
                f"   {e.agent}: {e.data['finish_reason']}, {e.data['prompt_tokens']} prompt tokens "
                f"({e.data['cached_tokens']} cached), {e.data['completion_tokens']} generated",
                flush=True,
            )
        elif e.type in ("loop", "branch_pruned"):
            print(f"   [{e.type}] {e.data}", flush=True)

    engine = VLLMBridge("default")
    async with open_engines([engine]):
        outcome = await review(engine, task, on_event=on_event)
    if as_json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        print("\n== answer\n" + outcome.answer)
        u = outcome.usage
        print(
            f"\nusage: {u.prompt_tokens} prompt tokens, {u.cached_tokens} cached, "
            f"{u.completion_tokens} generated; {outcome.wall_time:.1f} s"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and torch's logs")
    args = parser.parse_args()
    quiet_engine_logs(args.verbose)  # vLLM's and torch's logs go to a file unless --verbose
    sys.exit(anyio.run(main, args.task, args.json, backend="asyncio"))
