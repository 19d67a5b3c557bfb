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

from ..engine_bridge import KVHandle
from ._answers import all_agree, majority
from ._collab import (
    CollaborationContext,
    CollaborationOp,
    register_mode,
    split_final_role,
)
from ._collab_config import ModeConfig
from ._collab_roles import Turn, clean_text
from ._collab_types import AgentSpec, CollaborationFailed, InvalidCollaboration

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


@register_mode
class Cascade(CollaborationOp):
    """Small drafts, large verifies; escalate only on disagreement."""

    name = "cascade"
    Config = CascadeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (
        AgentSpec("drafter", count=2),
        AgentSpec("verifier", role="verifier"),
    )
    min_agents = 2

    def validate(self, config: ModeConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        split_final_role(agents, "verifier")

    async def run(self, ctx: CollaborationContext) -> str:
        config = ctx.config
        assert isinstance(config, CascadeConfig)
        drafter_specs, verifier_spec = split_final_role(ctx.agents, "verifier")
        drafters = await ctx.spawn_all(drafter_specs, role="drafter")
        drafts = await ctx.answer_all(drafters, "draft")
        if not drafts:
            raise CollaborationFailed("no drafter produced a draft", tuple(ctx.records.values()))
        ordered = list(drafts)
        answers = {name: ctx.normalize(drafts[name].text) for name in ordered}
        for name, answer in answers.items():
            ctx.records[name].answer = answer
        agree = all_agree(answers) or (len(answers) == 1 and config.verify != "always")
        choices = config.answer.choices if config.answer is not None else None
        winner = majority([answers[n] for n in ordered], choices)
        best = next(n for n in ordered if answers[n] == winner) if winner else ordered[0]
        ctx.extra["drafts"] = {n: clean_text(drafts[n].text) for n in ordered}
        if agree and config.verify == "on_disagreement":
            ctx.extra["escalated"] = False
            ctx.early_stopped = True
            return winner if choices else clean_text(drafts[best].text)

        ctx.extra["escalated"] = True
        await ctx.emit("escalate", None, reason="drafters disagree" if not agree else "verify=always")
        verifier = await ctx.spawn(verifier_spec.agent_names()[0], verifier_spec, "verifier")
        bridge = verifier.bridge
        same_tokens = all(bridge.tokenizer_fingerprint() == d.bridge.tokenizer_fingerprint() for d in drafters)
        ctx.extra["retokenized"] = not same_tokens
        parts: list[str | KVHandle] = []
        for i, name in enumerate([best] + [n for n in ordered if n != best], 1):
            result = drafts[name].result
            assert result is not None
            parts.append(f"\nDraft {i}: ")
            parts.append(ctx.transfer(result.output, bridge) if same_tokens else clean_text(result.text))
        prompt = ctx.prompt(verifier_spec, parts=parts, instructions="\n" + (verifier_spec.instructions or VERIFY_PROMPT))
        done = await ctx.turn(verifier, Turn(prompt, ctx.sampling(verifier_spec, temperature=0.0), label="verify", priority=-1))
        if done.result is None:
            raise CollaborationFailed("the verifier produced nothing", tuple(ctx.records.values()))
        text = clean_text(done.text)
        if ACCEPT.lower() in text.lower()[: len(ACCEPT) + 8]:
            ctx.extra["verdict"] = "accepted"
            return winner if choices else clean_text(drafts[best].text)
        ctx.extra["verdict"] = "rewritten"
        return ctx.normalize(text) if choices else text
