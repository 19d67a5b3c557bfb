"""vote: self-consistency with exact early stopping.

N voters fork from the shared context. ``direct`` voters answer at once,
constrained to the choices (or regex); ``reason`` voters first reason freely,
then their own output handle is extended with an answer cue and a constrained
continuation — the cue's prompt hits the cache on the whole reasoning.

Exact early stop: as soon as the leading answer can no longer be overtaken
(``Tally.decided``), the voters still running are pruned and their engine
requests aborted. The answer is then exactly what the full vote would give on
the same outputs. ``wave`` > 0 samples voters k at a time, so later waves are
never started when the first ones agree.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import attrs

from ...engine_bridge import KVHandle
from .._agent import Role, Turn
from .._config import ModeConfig, int_in
from .._context import CollaborationContext, find_role
from .._errors import InvalidCollaboration
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import Tally

ANSWER_CUE = "Therefore, the final answer is"


def _style(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("auto", "direct", "reason"):
        raise InvalidCollaboration(attribute.name, f"must be auto, direct or reason, got {value!r}")


@attrs.frozen(kw_only=True)
class VoteConfig(ModeConfig):
    """vote options.

    Attributes:
        style: ``direct`` (answer at once), ``reason`` (reason, then answer from
            the reasoning's handle) or ``auto`` (reason when answers are constrained
            and max_tokens allows reasoning, direct otherwise).
        wave: start voters k at a time (0 = all at once).
        answer_tokens: budget of the constrained answer step.
    """

    style: str = attrs.field(default="auto", validator=_style)
    wave: int = attrs.field(default=0, validator=int_in(0, 64))
    answer_tokens: int = attrs.field(default=16, validator=int_in(1, 256))


class Vote(CollaborationOp[VoteConfig]):
    """Self-consistency: N voters, majority answer, exact early stop."""

    name = "vote"
    Config = VoteConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("voter", count=5),)

    async def run(self, ctx: CollaborationContext[VoteConfig]) -> ModeResult:
        config = ctx.config
        style = config.style
        if style == "auto":
            style = (
                "direct" if (config.answer is not None and config.max_tokens <= 32) else "reason"
            )
        voter_specs, aggregator_spec = find_role(ctx.agents, "aggregator")
        voters = await ctx.spawn_all(voter_specs, role="voter")
        tally = Tally(total_voters=len(voters), choices=ctx.choices)
        decided = False

        async def cast(voter: Role) -> None:
            nonlocal decided
            answer_text = await self._vote(ctx, voter, style)
            if answer_text is None:
                return
            # a vote that lands after the decision is still counted: it cannot change
            # the winner (that is what "decided" means), and it is real output
            answer = ctx.normalize(answer_text)
            voter.record.answer = answer
            tally.add(answer)
            await ctx.emit(
                "vote", voter.agent, answer=answer, votes=tally.as_dict(), remaining=tally.remaining
            )
            if config.early_stop and not decided and tally.remaining > 0 and tally.decided():
                decided = True
                # every voter without an answer is pruned: running ones are aborted,
                # those of later waves never start
                for other in voters:
                    if other.record.answer is None and other is not voter:
                        await ctx.prune(other, "early_stop")

        wave = config.wave or len(voters)
        for start in range(0, len(voters), wave):
            async with anyio.create_task_group() as tg:
                for voter in voters[start : start + wave]:
                    tg.start_soon(cast, voter)
            if decided:
                break
        winner = tally.leader()
        details: dict[str, object] = {"style": style}
        answer = winner
        if aggregator_spec is not None:
            details["decision"] = winner
            majority = [v for v in voters if v.record.answer == winner]
            answer = await self._summarize(ctx, aggregator_spec, majority, winner)
        return ModeResult(
            answer=answer, early_stopped=decided, votes=tally.as_dict(), details=details
        )

    async def _summarize(
        self,
        ctx: CollaborationContext[VoteConfig],
        spec: AgentSpec,
        majority: list[Role],
        winner: str,
    ) -> str:
        """The aggregator writes the final text from the majority voters' reasoning.

        It continues the first majority voter's thread (a cached prefix) and gets
        the other majority voters' reasoning spliced as handles.
        """
        aggregator = await ctx.spawn(spec.agent_names()[0], spec, "aggregator")
        chat = aggregator.bridge.chat
        threads = [v.thread for v in majority if v.thread is not None]
        base = chat.close_turn(threads[0]) if threads else None
        parts: list[str | KVHandle] = []
        for voter in majority[1:]:
            if voter.thread is not None and voter.reasoning is not None:
                parts += [f"\nReviewer {voter.agent}: ", voter.reasoning]
        instructions = "\n".join(
            x
            for x in (f"The majority answer is: {winner}.", spec.instructions or SUMMARY_PROMPT)
            if x
        )
        prompt = ctx.prompt(spec, base=base, parts=parts, instructions=instructions)
        done = await ctx.turn(
            aggregator,
            Turn(
                prompt,
                ctx.sampling(spec, temperature=0.0),
                label="aggregate",
                priority=-2,
                keep=False,
            ),
        )
        return done.content or winner

    async def _vote(
        self, ctx: CollaborationContext[VoteConfig], voter: Role, style: str
    ) -> str | None:
        config = ctx.config
        spec = voter.spec
        instructions = spec.instructions or _default_instructions(ctx, style)
        prompt = ctx.prompt(spec, instructions=instructions)
        if style == "direct":
            done = await ctx.turn(
                voter,
                Turn(
                    prompt,
                    ctx.sampling(spec, max_tokens=config.answer_tokens, constrained=True),
                    label="answer",
                    keep=False,
                ),
            )
            return (
                None
                if done.result is None or done.result.finish_reason == "abort"
                else done.content
            )
        first = await ctx.turn(voter, Turn(prompt, ctx.sampling(spec), label="reason"))
        if first.result is None or first.result.finish_reason == "abort":
            return None
        voter.thread = first.result.handle
        voter.reasoning = first.result.output
        if config.answer is None:
            return first.content
        # The answer step continues the voter's own handle: its reasoning is a cached prefix.
        chat = voter.bridge.chat
        base = chat.close_turn(first.result.handle)
        cue = (
            f"{ANSWER_CUE} one of: {', '.join(config.answer.choices)}."
            if config.answer.choices
            else ANSWER_CUE + ":"
        )
        prompt2 = ctx.prompt(spec, base=base, instructions=cue)
        second = await ctx.turn(
            voter,
            Turn(
                prompt2,
                ctx.sampling(spec, max_tokens=config.answer_tokens, constrained=True),
                label="answer",
                priority=-1,
                keep=False,  # its reasoning stays retained: the aggregator continues it
            ),
        )
        if second.result is None or second.result.finish_reason == "abort":
            return None
        voter.record.output = f"{first.content}\n{ANSWER_CUE}: {second.content}"
        return second.content


SUMMARY_PROMPT = "Write the final answer for the user, using the reviewers' reasoning. Be concise."


def _default_instructions(ctx: CollaborationContext[VoteConfig], style: str) -> str:
    answer = ctx.config.answer
    if answer is not None and answer.choices:
        options = ", ".join(answer.choices)
        if style == "direct":
            return f"Answer with exactly one of: {options}."
        return f"Think step by step, briefly, then give your answer (one of: {options})."
    if style == "direct":
        return "Answer concisely."
    return "Think step by step, briefly. End with a line 'Answer: <your answer>'."
