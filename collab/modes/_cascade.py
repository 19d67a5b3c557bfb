"""cascade: small models draft, a larger model verifies and rewrites only when needed.

Drafters run on the small model(s); the verifier is the agent with role or
name ``verifier`` (else the last spec), normally on another served model
(``model`` in its spec). When the drafters agree (and ``verify`` is
``"on_disagreement"``), their answer stands and the large model is never
called. Otherwise the verifier receives the context and the drafts on its own
model: token ids are kept when both tokenizers are identical, re-tokenized
explicitly when not (the one documented exception to "never re-tokenize").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from ...engine_bridge import KVHandle
from .._agent import Turn
from .._config import ModeConfig
from .._context import CollaborationContext, split_final_role
from .._errors import InvalidCollaboration
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import all_agree, majority

ACCEPT = "ACCEPT"
VERIFY_PROMPT = (
    "Check the draft answers above. If the first draft is correct, reply with the single word "
    f"{ACCEPT}. Otherwise reply with the corrected answer only."
)


def _verify(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("always", "on_disagreement"):
        raise InvalidCollaboration(attribute.name, "must be always or on_disagreement")


@attrs.frozen(kw_only=True)
class CascadeConfig(ModeConfig):
    """cascade options: ``verify`` = ``always`` or ``on_disagreement`` (default)."""

    verify: str = attrs.field(default="on_disagreement", validator=_verify)


class Cascade(CollaborationOp[CascadeConfig]):
    """Small drafts, large verifies; escalate only on disagreement."""

    name = "cascade"
    Config = CascadeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (
        AgentSpec("drafter", count=2),
        AgentSpec("verifier", role="verifier"),
    )
    min_agents = 2

    def validate(self, config: CascadeConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        split_final_role(agents, "verifier")

    def max_turns(self, config: CascadeConfig, agents: Sequence[AgentSpec]) -> int:
        return sum(a.count for a in agents)  # each drafter once, the verifier at most once

    async def run(self, ctx: CollaborationContext[CascadeConfig]) -> ModeResult:
        config = ctx.config
        drafter_specs, verifier_spec = split_final_role(ctx.agents, "verifier")
        drafters = await ctx.spawn_all(drafter_specs, role="drafter")
        drafts = await ctx.answer_all(drafters, "draft")
        if not drafts:
            raise ctx.failure("no drafter produced a draft")
        ordered = list(drafts)
        answers = {name: await ctx.normalize(drafts[name].content) for name in ordered}
        for name, answer in answers.items():
            ctx.records[name].answer = answer
        agree = all_agree(answers) or (len(answers) == 1 and config.verify != "always")
        choices = ctx.choices
        winner = majority([answers[n] for n in ordered], choices)
        unnamed = bool(choices) and not winner  # no draft named a choice: nothing to keep
        if unnamed:
            agree = False
        best = next(n for n in ordered if answers[n] == winner) if winner else ordered[0]
        kept = winner if choices else drafts[best].content
        details: dict[str, object] = {"drafts": {n: drafts[n].content for n in ordered}}
        if agree and config.verify == "on_disagreement":
            details["escalated"] = False
            return ModeResult(answer=kept, early_stopped=True, details=details)

        details["escalated"] = True
        reason = "drafters disagree" if not agree else "verify=always"
        await ctx.emit("escalate", None, reason=reason)
        verifier = await ctx.spawn(verifier_spec.agent_names()[0], verifier_spec, "verifier")
        bridge = verifier.bridge
        same_tokens = all(
            bridge.tokenizer_fingerprint() == d.bridge.tokenizer_fingerprint() for d in drafters
        )
        details["retokenized"] = not same_tokens
        parts: list[str | KVHandle] = []
        for i, name in enumerate([best] + [n for n in ordered if n != best], 1):
            result = drafts[name].result
            assert result is not None
            parts.append(f"\nDraft {i}: ")
            parts.append(
                ctx.transfer(result.output, bridge) if same_tokens else drafts[name].content
            )
        if unnamed:
            named = ", ".join(choices or ())
            instructions = (
                f"\nNone of the drafts names one of: {named}. Reply with the correct one only."
            )
        else:
            instructions = "\n" + (verifier_spec.instructions or VERIFY_PROMPT)
        prompt = ctx.prompt(verifier_spec, parts=parts, instructions=instructions)
        # asked for a choice, the verifier is held to the choices (as a voter's answer step is)
        sampling = ctx.sampling(verifier_spec, temperature=0.0, constrained=unnamed)
        done = await ctx.turn(
            verifier, Turn(prompt, sampling, label="verify", priority=-1, keep=False)
        )
        if done.result is None:
            raise ctx.failure("the verifier produced nothing")
        text = done.content
        if unnamed:
            details["verdict"] = "answered"
            answer = await ctx.normalize(text)
            if not answer:
                raise ctx.failure("neither a draft nor the verifier named one of the choices")
            return ModeResult(answer=answer, details=details)
        if ACCEPT.lower() in text.lower()[: len(ACCEPT) + 8]:
            details["verdict"] = "accepted"
            return ModeResult(answer=kept, details=details)
        details["verdict"] = "rewritten"
        return ModeResult(answer=await ctx.normalize(text) if choices else text, details=details)
