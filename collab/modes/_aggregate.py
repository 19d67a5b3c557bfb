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

from ...engine_bridge import KVHandle
from .._agent import Turn
from .._config import ModeConfig
from .._context import CollaborationContext, split_final_role
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec

AGGREGATE_PROMPT = (
    "Above is one proposal; the other proposals follow. Combine the best parts of all proposals "
    "into one final answer. Reply with the final answer only."
)


class Aggregate(CollaborationOp[ModeConfig]):
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

    def max_turns(self, config: ModeConfig, agents: Sequence[AgentSpec]) -> int:
        return sum(a.count for a in agents)  # each proposer once, the aggregator once

    async def run(self, ctx: CollaborationContext[ModeConfig]) -> ModeResult:
        proposer_specs, aggregator_spec = split_final_role(ctx.agents, "aggregator")
        proposers = await ctx.spawn_all(proposer_specs, role="proposer")
        aggregator = await ctx.spawn(
            aggregator_spec.agent_names()[0], aggregator_spec, "aggregator"
        )
        proposals = await ctx.answer_all(proposers, "proposal")
        if not proposals:
            raise ctx.failure("no proposer produced a proposal")
        ordered = list(proposals)
        first = proposals[ordered[0]].result
        assert first is not None
        chat = aggregator.bridge.chat
        parts: list[str | KVHandle] = []
        base: KVHandle | None = None
        if first.handle.model == aggregator.bridge.model:  # continue the first proposal
            base = chat.close_turn(first.handle)
            rest = ordered[1:]
        else:  # another model (a remote aggregator): every proposal crosses as text
            rest = ordered
        for name in rest:
            result = proposals[name].result
            assert result is not None
            parts.append(f"\nProposal from {name}: ")
            parts.append(result.output)
        instructions = "\n".join(x for x in (AGGREGATE_PROMPT, aggregator_spec.instructions) if x)
        prompt = ctx.prompt(
            aggregator_spec, base=base, parts=parts, instructions="\n" + instructions
        )
        done = await ctx.turn(
            aggregator,
            Turn(
                prompt,
                ctx.sampling(aggregator_spec, temperature=0.0),
                label="aggregate",
                priority=-1,
                keep=False,
            ),
        )
        if done.result is None:
            raise ctx.failure("the aggregator produced nothing")
        texts = {name: proposals[name].content for name in ordered}
        return ModeResult(answer=done.content, details={"proposals": texts})
