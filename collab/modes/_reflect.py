"""reflect (self-refine): draft → critique → revise, up to K rounds.

Stops when a validator tool passes (any sync/async callable: JSON schema,
tests in a subprocess…) or, without a validator, when the critic approves.
The whole exchange is one append-only thread, so each step's prompt extends
the previous step's handle and is served from the prefix cache. The
validator's error message is fed back to the critic and the reviser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from .._agent import Turn
from .._config import ModeConfig
from .._context import CollaborationContext
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._validators import Validator, Verdict, run_validator, validator_from_spec

APPROVAL = "APPROVED"
CRITIC_PROMPT = (
    "Review the answer above. If it is correct and complete, reply with the single word "
    f"{APPROVAL}. Otherwise, list the problems briefly."
)
REVISE_PROMPT = "Revise your answer to fix these problems. Reply with the revised answer only."


def _validator(value: Any) -> Validator | None:
    if value is None:
        return None
    return validator_from_spec(value)


@attrs.frozen(kw_only=True)
class ReflectConfig(ModeConfig):
    """reflect options.

    Attributes:
        validator: a callable, or an HTTP spec ``{"type": "json_schema", "schema": …}``.
        critic: ask the critic model even when the validator passes (default: only
            without a validator, or when it fails).
    """

    validator: Validator | None = attrs.field(default=None, converter=_validator)
    critic: bool = False


class Reflect(CollaborationOp[ReflectConfig]):
    """Self-refine with an optional validator tool; the first agent drafts, the second critiques."""

    uses_rounds = True
    name = "reflect"
    Config = ReflectConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (
        AgentSpec("drafter"),
        AgentSpec("critic", instructions=CRITIC_PROMPT),
    )

    def max_turns(self, config: ReflectConfig, agents: Sequence[AgentSpec]) -> int:
        return 1 + 2 * (config.rounds or 2)  # the draft, then a critique and a revision a round

    async def run(self, ctx: CollaborationContext[ReflectConfig]) -> ModeResult:
        config = ctx.config
        rounds = config.rounds or 2
        specs = list(ctx.agents)
        drafter_spec = specs[0]
        critic_spec = (
            specs[1] if len(specs) > 1 else AgentSpec("critic", instructions=CRITIC_PROMPT)
        )
        drafter = await ctx.spawn(drafter_spec.agent_names()[0], drafter_spec, "drafter")
        critic = await ctx.spawn(critic_spec.agent_names()[0], critic_spec, "critic")
        chat = drafter.bridge.chat
        # a critic on another model (a remote, say) gets text, not the drafter's handles
        crossing = critic.bridge.model != drafter.bridge.model

        prompt = ctx.prompt(drafter_spec)
        done = await ctx.turn(
            drafter, Turn(prompt, ctx.sampling(drafter_spec), label="draft", round=1)
        )
        if done.result is None:
            raise ctx.failure("the drafter produced nothing")
        draft = done.result
        history: list[dict[str, Any]] = []
        verdict: Verdict | None = None
        judged = None  # the draft ``verdict`` is about
        ran = 0
        stopped_early = False
        for r in range(1, rounds + 1):
            ran = r
            if config.validator is not None:
                verdict, judged = await run_validator(config.validator, draft.content), draft
            entry: dict[str, Any] = {"round": r, "draft": draft.content.strip()}
            if verdict is not None:
                entry["valid"] = verdict.ok
                entry["validator"] = verdict.message
                await ctx.emit(
                    "validation", drafter.agent, ok=verdict.ok, message=verdict.message, round=r
                )
            if verdict is not None and verdict.ok and not config.critic:
                history.append(entry)
                stopped_early = r < rounds
                break
            thread = chat.close_turn(draft.handle)
            feedback = _feedback(verdict)
            critic_instr = critic_spec.instructions or CRITIC_PROMPT
            if crossing:  # the critic reads the draft as text on its own model
                critique_prompt = ctx.prompt(
                    critic_spec,
                    parts=["Draft:\n", draft.output],
                    instructions=f"\n{feedback}{critic_instr}",
                )
            else:  # the critic continues the drafter's thread (its KV is cached)
                critique_prompt = ctx.prompt(
                    critic_spec,
                    base=thread,
                    instructions=f"{feedback}{critic_instr}",
                    bridge=drafter.bridge,
                )
            critique = await ctx.turn(
                critic,
                Turn(
                    critique_prompt,
                    ctx.sampling(critic_spec, temperature=0.0),
                    label="critique",
                    round=r,
                    priority=-1,
                ),
            )
            if critique.result is None:
                break
            entry["critique"] = critique.content
            history.append(entry)
            approved = APPROVAL.lower() in critique.content.lower() and (
                verdict is None or verdict.ok
            )
            await ctx.emit("round", None, round=r, approved=approved)
            if approved and config.early_stop:
                stopped_early = r < rounds
                break
            if r == rounds:
                break
            if crossing:  # the critique comes back as text into the drafter's thread
                revise_prompt = ctx.prompt(
                    drafter_spec,
                    base=thread,
                    parts=["Critique:\n", critique.result.output],
                    instructions="\n" + REVISE_PROMPT,
                )
            else:
                revise_prompt = ctx.prompt(
                    drafter_spec,
                    base=chat.close_turn(critique.result.handle),
                    instructions=REVISE_PROMPT,
                )
            revised = await ctx.turn(
                drafter,
                Turn(
                    revise_prompt,
                    ctx.sampling(drafter_spec),
                    label="revise",
                    round=r + 1,
                    priority=-1,
                ),
            )
            if revised.result is None:
                break
            draft = revised.result
        details: dict[str, Any] = {}
        if config.validator is not None:
            if judged is not draft or verdict is None:  # the final draft was never validated
                verdict = await run_validator(config.validator, draft.content)
            details["valid"] = verdict.ok
            if verdict.message:
                details["validator_message"] = verdict.message
        details["history"] = history
        answer = draft.content.strip()
        drafter.record.output = answer
        return ModeResult(answer=answer, rounds=ran, early_stopped=stopped_early, details=details)


def _feedback(verdict: Verdict | None) -> str:
    if verdict is None or verdict.ok:
        return ""
    return f"A validator rejected the answer: {verdict.message}\n"
