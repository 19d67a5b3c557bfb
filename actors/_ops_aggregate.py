"""aggregate (mixture of agents): N proposers, then one aggregator writes the answer.

Proposers fork from the shared context with their own instructions (or LoRA
adapters). The aggregator is the critical path (higher engine priority): it
continues the first proposer's thread — a cached prefix — and receives the
other proposals as handles spliced as token ids, then its instructions.
The aggregator is the agent whose role or name is ``aggregator`` (else the last spec).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..engine_bridge import KVHandle
from ._collab import CollaborationContext, CollaborationOp, register_mode, split_final_role
from ._collab_config import ModeConfig
from ._collab_roles import Turn, clean_text
from ._collab_types import AgentSpec, CollaborationFailed

AGGREGATE_PROMPT = (
    "Above is one proposal; the other proposals follow. Combine the best parts of all proposals "
    "into one final answer. Reply with the final answer only."
)


@register_mode
class Aggregate(CollaborationOp):
    """Mixture of agents: proposals spliced as handles into one aggregator."""

    name = "aggregate"
    Config = ModeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (
        AgentSpec("proposer", count=3),
        AgentSpec("aggregator", role="aggregator"),
    )
    min_agents = 2

    def validate(self, config: ModeConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        split_final_role(agents, "aggregator")

    async def run(self, ctx: CollaborationContext) -> str:
        proposer_specs, aggregator_spec = split_final_role(ctx.agents, "aggregator")
        proposers = await ctx.spawn_all(proposer_specs, role="proposer")
        aggregator = await ctx.spawn(aggregator_spec.agent_names()[0], aggregator_spec, "aggregator")
        proposals = await ctx.answer_all(proposers, "proposal")
        if not proposals:
            raise CollaborationFailed("no proposer produced a proposal", tuple(ctx.records.values()))
        ordered = list(proposals)
        first = proposals[ordered[0]].result
        assert first is not None
        chat = aggregator.bridge.chat
        base = chat.close_turn(first.handle)
        parts: list[str | KVHandle] = []
        for name in ordered[1:]:
            result = proposals[name].result
            assert result is not None
            parts.append(f"\nProposal from {name}: ")
            parts.append(result.output)
        instructions = "\n".join(x for x in (AGGREGATE_PROMPT, aggregator_spec.instructions) if x)
        prompt = ctx.prompt(aggregator_spec, base=base, parts=parts, instructions="\n" + instructions)
        done = await ctx.turn(aggregator, Turn(prompt, ctx.sampling(aggregator_spec, temperature=0.0), label="aggregate", priority=-1))
        if done.result is None:
            raise CollaborationFailed("the aggregator produced nothing", tuple(ctx.records.values()))
        ctx.extra["proposals"] = {name: clean_text(proposals[name].text) for name in ordered}
        return clean_text(done.text)
