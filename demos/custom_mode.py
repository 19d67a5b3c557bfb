"""A custom CollaborationOp and a custom Actor behaviour, written only against the public API.

`solve_and_check`: N solvers answer an arithmetic question; a `Checker` actor
(plain Python, no model) verifies each answer the solvers send it through its
mailbox; the first verified answer wins and the other solvers are pruned —
their engine requests aborted.

    python demos/custom_mode.py "What is 17 * 3?"
"""

from __future__ import annotations

import re
import sys
from typing import ClassVar

import anyio
import attrs
from microagent import (
    Actor,
    AgentSpec,
    CollaborationContext,
    CollaborationOp,
    EngineBridge,
    ModeConfig,
    ModeResult,
    Outcome,
    Turn,
    VLLMBridge,
    collaborate,
    handles,
    register_mode,
)
from microagent.console import open_engines, quiet_engine_logs


@attrs.frozen
class Check:
    """Ask the checker whether ``answer`` solves ``question``."""

    question: str
    answer: str


class Checker(Actor):
    """A custom behaviour: evaluates simple arithmetic and counts what it checked."""

    def __init__(self) -> None:
        self.checked = 0

    @handles(Check)
    async def check(self, message: Check) -> bool:
        self.checked += 1
        expr = re.search(r"(\d+)\s*([-+*/x])\s*(\d+)", message.question)
        got = re.findall(r"-?\d+", message.answer)
        if expr is None or not got:
            return False
        a, op, b = int(expr.group(1)), expr.group(2), int(expr.group(3))
        value = {"+": a + b, "-": a - b, "*": a * b, "x": a * b, "/": a // b if b else None}[op]
        return value is not None and int(got[-1]) == value


@register_mode
class SolveAndCheck(CollaborationOp[ModeConfig]):
    """N solvers race; the checker verifies; the first verified answer wins."""

    name = "solve_and_check"
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (
        AgentSpec("solver", count=3, instructions="Answer with the number only.", temperature=0.9),
    )

    async def run(self, ctx: CollaborationContext[ModeConfig]) -> ModeResult:
        question = str(ctx.messages[-1]["content"]) if ctx.messages else ""
        checker = ctx.spawn_actor(Checker, name="checker")
        solvers = await ctx.spawn_all(role="solver")
        winner: list[str] = []

        async def solve(role) -> None:  # type: ignore[no-untyped-def]
            done = await ctx.turn(
                role, Turn(ctx.prompt(role.spec), ctx.sampling(role.spec, max_tokens=12))
            )
            if done.result is None or winner:
                return
            ok = await checker.ask(Check(question, done.content), timeout=5)
            await ctx.emit("checked", role.agent, ok=ok, answer=done.content)
            if ok and not winner:
                winner.append(done.content)
                for other in solvers:
                    if other is not role:
                        await ctx.prune(other, "another solver was verified first")

        async with anyio.create_task_group() as tg:
            for role in solvers:
                tg.start_soon(solve, role)
        return ModeResult(
            answer=winner[0] if winner else "no verified answer",
            early_stopped=bool(winner),
            details={"verified": bool(winner)},
        )


async def run(engine: EngineBridge, question: str, *, on_event: object = None) -> Outcome:
    return await collaborate(engine, "solve_and_check", question, on_event=on_event)  # type: ignore[arg-type]


async def main() -> int:
    words = [a for a in sys.argv[1:] if a != "--verbose"]
    question = words[0] if words else "What is 17 * 3?"
    quiet_engine_logs("--verbose" in sys.argv)  # vLLM's and torch's logs go to a file
    engine = VLLMBridge("default")
    async with open_engines([engine]):
        outcome = await run(
            engine,
            question,
            on_event=lambda e: (
                print(" ", e.type, e.agent or "", dict(e.data))
                if e.type in ("checked", "pruned")
                else None
            ),
        )
    print(f"answer: {outcome.answer}  verified: {outcome.details['verified']}")
    for agent in outcome.agents:
        print(f"  {agent.name:<10} {agent.finish_reason:<8} {agent.output!r}")
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
