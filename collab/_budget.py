"""Token budgets: a collaboration's worst case, known before it runs, and a meter as it runs.

The worst case counts completion tokens (what decoding costs), all agents together:
the mode's turn bound (``CollaborationOp.max_turns``) times the largest turn it may
ask for, times the steps of an agent's tool loop; a server adds each turn's prompt
and refuses a request whose worst case is over its budget before anything runs. The
meter (``TokenMeter``, used by ``CollaborationContext.turn``) holds the budget as the
collaboration runs, in prompt plus completion tokens (what an API key's quota
counts): a turn whose prompt and ``max_tokens`` could take the total past it is not
sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._errors import CollaborationFailed

if TYPE_CHECKING:
    from ._run import PreparedCollaboration


class TokenBudgetExceeded(CollaborationFailed):
    """A turn was not sent: its prompt and ``max_tokens`` could take the collaboration past
    its budget."""


def largest_turn(prepared: PreparedCollaboration) -> int:
    """The most completion tokens one turn of ``prepared`` may ask for."""
    config = prepared.config
    sizes = [config.max_tokens, int(getattr(config, "answer_tokens", 0) or 0)]
    spawned = prepared.op.spawned_specs(config, prepared.agents)  # a graph's nodes
    sizes += [a.max_tokens for a in spawned if a.max_tokens is not None]
    return max(sizes)


def worst_case_tokens(prepared: PreparedCollaboration, *, tool_steps: int = 0) -> int | None:
    """Completion tokens ``prepared`` spends at most; ``None`` when its mode has no bound.

    Args:
        prepared: the validated collaboration.
        tool_steps: the agents' ``max_tool_steps`` when they have tools (each step of
            the loop is a generation of its own), else 0.
    """
    turns = prepared.op.max_turns(prepared.config, prepared.agents)
    if turns is None:
        return None
    return turns * largest_turn(prepared) * (1 + tool_steps)


@attrs.define
class TokenMeter:
    """Prompt and completion tokens spent and promised to turns in flight, against a budget."""

    budget: int | None
    spent: int = 0
    in_flight: int = 0

    def reserve(self, tokens: int) -> None:
        """Promise ``tokens`` to a turn about to be sent, or raise when over budget."""
        if self.budget is not None and self.spent + self.in_flight + tokens > self.budget:
            raise TokenBudgetExceeded(
                f"the collaboration's token budget of {self.budget} tokens would be "
                f"exceeded: {self.spent} spent, {self.in_flight} in flight, the next turn may "
                f"take {tokens}"
            )
        self.in_flight += tokens

    def settle(self, reserved: int, used: int) -> None:
        """A turn that reserved ``reserved`` ended having generated ``used``."""
        self.in_flight -= reserved
        self.spent += used
