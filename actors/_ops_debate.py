"""debate (Du et al., 2023): N agents, R rounds, stop as soon as all agree.

Each agent keeps its own append-only thread (context → its instructions →
its answer → the others' answers → its next answer …), so every round's
prompt extends the agent's previous handle and is served from the prefix
cache. The others' answers arrive as handles and are spliced as token ids.
Later rounds run at higher engine priority: they are the critical path.
"""

from __future__ import annotations

from typing import ClassVar

import anyio
import attrs

from ..engine_bridge import KVHandle
from ._answers import all_agree, majority
from ._collab import CollaborationContext, CollaborationOp, register_mode
from ._collab_config import ModeConfig
from ._collab_roles import Role, Turn, TurnDone
from ._collab_types import AgentSpec, CollaborationFailed

DEBATE_PROMPT = (
    "These are the answers of the other agents. Considering them, give your updated answer, "
    "briefly. End with a line 'Answer: <your answer>'."
)
FIRST_PROMPT = "Answer the question, briefly. End with a line 'Answer: <your answer>'."


@attrs.frozen(kw_only=True)
class DebateConfig(ModeConfig):
    """debate options (``rounds`` defaults to 2)."""


@register_mode
class Debate(CollaborationOp):
    """Multi-agent debate with append-only per-agent threads and early stop on agreement."""

    uses_rounds = True
    name = "debate"
    Config = DebateConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("debater", count=3),)
    min_agents = 2

    async def run(self, ctx: CollaborationContext) -> str:
        config = ctx.config
        rounds = config.rounds or 2
        agents = await ctx.spawn_all(role="debater")
        latest: dict[str, TurnDone] = {}
        answers: dict[str, str] = {}
        for r in range(1, rounds + 1):
            ctx.rounds = r
            previous = dict(latest)

            async def speak(agent: Role, r: int = r, previous: dict[str, TurnDone] = previous) -> None:
                prompt = self._prompt(ctx, agent, r, previous)
                # later rounds are the critical path: lower value = served first
                done = await ctx.turn(agent, Turn(prompt, ctx.sampling(agent.spec), round=r, priority=-r, label=f"round {r}"))
                if done.result is None:
                    return
                latest[agent.agent] = done
                agent.thread = agent.bridge.chat.close_turn(done.result.handle)
                answers[agent.agent] = ctx.normalize(done.text)
                agent.record.answer = answers[agent.agent]

            async with anyio.create_task_group() as tg:
                for agent in agents:
                    tg.start_soon(speak, agent)
            if not latest:
                raise CollaborationFailed("no debater produced an answer", tuple(ctx.records.values()))
            await ctx.emit("round", None, round=r, answers=dict(answers))
            if config.early_stop and all_agree(answers) and len(answers) == len(agents):
                ctx.early_stopped = r < rounds
                break
        ctx.extra["answers"] = dict(answers)
        choices = config.answer.choices if config.answer is not None else None
        winner = majority([answers[a.agent] for a in agents if a.agent in answers], choices)
        # the final answer is the full text of the first agent holding the winning answer
        for agent in agents:
            if answers.get(agent.agent) == winner and agent.agent in latest:
                return winner if choices else latest[agent.agent].text.replace("<|im_end|>", "").strip()
        return winner

    def _prompt(self, ctx: CollaborationContext, agent: Role, r: int, previous: dict[str, TurnDone]) -> KVHandle:
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
