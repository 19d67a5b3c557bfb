"""debate (Du et al., 2023): N agents, R rounds, stop as soon as all agree.

Two prompt layouts (``DebateConfig.layout``):

- ``threads``: each agent keeps its own append-only thread (context → its
  instructions → its answer → the others' answers → its next answer …), so
  every round extends the agent's previous handle; each reader prefills its
  N-1 peers' answers, N·(N-1) messages a round.
- ``transcript``: one shared transcript (context → every answer so far, in
  a fixed order → the agent's own turn last), so a message is prefilled once
  for all its readers, N messages a round, and the transcript of round r is
  a prefix of round r+1's.

``auto`` (the default) takes the transcript from 3 agents on, where it reads
fewer messages; with 2 both read the same and the threads keep each agent's
own history. Answers arrive as handles and are spliced as token ids. Later
rounds run at higher engine priority: they are the critical path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import anyio
import attrs

from ...engine_bridge import KVHandle
from .._agent import Role, Turn, TurnDone
from .._config import ModeConfig, one_of
from .._context import CollaborationContext
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import all_agree, majority

DEBATE_PROMPT = (
    "These are the answers of the other agents. Considering them, give your updated answer, "
    "briefly. End with a line 'Answer: <your answer>'."
)
FIRST_PROMPT = "Answer the question, briefly. End with a line 'Answer: <your answer>'."
TRANSCRIPT_PROMPT = (
    "These are the answers of all agents so far; yours are those of agent {agent}. "
    "Considering them, give your updated answer, briefly. End with a line 'Answer: <your answer>'."
)
LAYOUTS = ("auto", "threads", "transcript")
#: from this many agents on, ``auto`` lays a debate out as one shared transcript
TRANSCRIPT_FROM_AGENTS = 3


@attrs.frozen(kw_only=True)
class DebateConfig(ModeConfig):
    """debate options (``rounds`` defaults to 2).

    Attributes:
        layout: ``threads`` (a thread per agent), ``transcript`` (one shared
            transcript, the agent's own turn last) or ``auto`` (the transcript
            from ``TRANSCRIPT_FROM_AGENTS`` agents on); see the module's docstring.
    """

    layout: str = attrs.field(default="auto", validator=one_of(LAYOUTS))


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
        layout = config.layout
        if layout == "auto":
            layout = "transcript" if len(agents) >= TRANSCRIPT_FROM_AGENTS else "threads"
        history: list[dict[str, TurnDone]] = []  # every finished round's turns
        latest: dict[str, TurnDone] = {}
        answers: dict[str, str] = {}
        ran = 0
        agreed_early = False
        for r in range(1, rounds + 1):
            ran = r
            previous = dict(latest)
            done_rounds = list(history)
            current: dict[str, TurnDone] = {}

            async def speak(
                agent: Role,
                r: int = r,
                previous: dict[str, TurnDone] = previous,
                done_rounds: list[dict[str, TurnDone]] = done_rounds,
                current: dict[str, TurnDone] = current,
            ) -> None:
                if layout == "transcript" and r > 1:
                    prompt = self._transcript_prompt(ctx, agent, done_rounds)
                else:
                    prompt = self._prompt(ctx, agent, r, previous)
                # later rounds are the critical path: lower value = served first
                sampling = ctx.sampling(agent.spec)
                turn = Turn(prompt, sampling, round=r, priority=-r, label=f"round {r}")
                done = await ctx.turn(agent, turn)
                if done.result is None:
                    return
                latest[agent.agent] = current[agent.agent] = done
                agent.thread = agent.bridge.chat.close_turn(done.result.handle)
                answers[agent.agent] = await ctx.normalize(done.content)
                agent.record.answer = answers[agent.agent]

            async with anyio.create_task_group() as tg:
                for agent in agents:
                    tg.start_soon(speak, agent)
            if not current:
                raise ctx.failure("no debater produced an answer")
            history.append(current)
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
            details={"answers": dict(answers), "layout": layout},
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

    def _transcript_prompt(
        self,
        ctx: CollaborationContext[DebateConfig],
        agent: Role,
        rounds: Sequence[dict[str, TurnDone]],
    ) -> KVHandle:
        """Context → every earlier round's answers (fixed order) → the agent's own turn.

        Everything before the own turn is the same for every reader on one
        model, so the engine prefills it once; round r's transcript is a prefix
        of round r+1's.
        """
        spec = agent.spec
        parts: list[str | KVHandle] = []
        for number, turns in enumerate(rounds, 1):
            for name in sorted(turns):
                result = turns[name].result
                if result is not None:
                    label = f"Round {number}, agent {name}: "
                    parts += [f"\n{label}" if parts else label, result.output]
        own = TRANSCRIPT_PROMPT.format(agent=agent.agent)
        instructions = "\n" + "\n".join(x for x in (spec.instructions, own) if x)
        return ctx.prompt(spec, instructions=instructions, parts=parts)
