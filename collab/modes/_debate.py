"""debate (Du et al., 2023): N agents, R rounds, stop as soon as all agree.

Each agent keeps its own append-only thread (context → its instructions →
its answer → the others' answers → its next answer …), so every round's
prompt extends the agent's previous handle and is served from the prefix
cache. The others' answers arrive as handles and are spliced as token ids.
Later rounds run at higher engine priority: they are the critical path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import anyio
import attrs

from ...engine_bridge import KVHandle
from .._agent import Role, Turn, TurnDone
from .._config import ModeConfig
from .._context import CollaborationContext
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import all_agree, majority

DEBATE_PROMPT = (
    "These are the answers of the other agents. Considering them, give your updated answer, "
    "briefly. End with a line 'Answer: <your answer>'."
)
FIRST_PROMPT = "Answer the question, briefly. End with a line 'Answer: <your answer>'."


@attrs.frozen(kw_only=True)
class DebateConfig(ModeConfig):
    """debate options (``rounds`` defaults to 2)."""


class Debate(CollaborationOp[DebateConfig]):
    """Multi-agent debate with append-only per-agent threads and early stop on agreement."""

    uses_rounds = True
    name = "debate"
    Config = DebateConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("debater", count=3),)
    min_agents = 2

    def max_turns(self, config: DebateConfig, agents: Sequence[AgentSpec]) -> int:
        return sum(a.count for a in agents) * (config.rounds or 2)

    async def run(self, ctx: CollaborationContext[DebateConfig]) -> ModeResult:
        config = ctx.config
        rounds = config.rounds or 2
        agents = await ctx.spawn_all(role="debater")
        latest: dict[str, TurnDone] = {}
        answers: dict[str, str] = {}
        ran = 0
        agreed_early = False
        for r in range(1, rounds + 1):
            ran = r
            previous = dict(latest)

            async def speak(
                agent: Role, r: int = r, previous: dict[str, TurnDone] = previous
            ) -> None:
                prompt = self._prompt(ctx, agent, r, previous)
                # later rounds are the critical path: lower value = served first
                sampling = ctx.sampling(agent.spec)
                turn = Turn(prompt, sampling, round=r, priority=-r, label=f"round {r}")
                done = await ctx.turn(agent, turn)
                if done.result is None:
                    return
                latest[agent.agent] = done
                agent.thread = agent.bridge.chat.close_turn(done.result.handle)
                answers[agent.agent] = ctx.normalize(done.content)
                agent.record.answer = answers[agent.agent]

            async with anyio.create_task_group() as tg:
                for agent in agents:
                    tg.start_soon(speak, agent)
            if not latest:
                raise ctx.failure("no debater produced an answer")
            await ctx.emit("round", None, round=r, answers=dict(answers))
            if config.early_stop and all_agree(answers) and len(answers) == len(agents):
                agreed_early = r < rounds
                break
        choices = ctx.choices
        winner = majority([answers[a.agent] for a in agents if a.agent in answers], choices)
        answer = winner
        # the final answer is the full text of the first agent holding the winning answer
        for agent in agents:
            if answers.get(agent.agent) == winner and agent.agent in latest:
                answer = winner if choices else latest[agent.agent].content
                break
        return ModeResult(
            answer=answer,
            rounds=ran,
            early_stopped=agreed_early,
            details={"answers": dict(answers)},
        )

    def _prompt(
        self,
        ctx: CollaborationContext[DebateConfig],
        agent: Role,
        r: int,
        previous: dict[str, TurnDone],
    ) -> KVHandle:
        spec = agent.spec
        if r == 1 or agent.thread is None:
            instructions = "\n".join(x for x in (spec.instructions, FIRST_PROMPT) if x)
            return ctx.prompt(spec, instructions=instructions)
        parts: list[str | KVHandle] = []
        for name in sorted(previous):
            result = previous[name].result
            if name == agent.agent or result is None:
                continue
            parts += [f"\nAgent {name}: ", result.output]
        return ctx.prompt(spec, base=agent.thread, instructions=DEBATE_PROMPT, parts=parts)
