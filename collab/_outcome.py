"""What a collaboration reports: its events as they happen, per-agent records, the outcome.

These are the shapes the Python API returns and the HTTP API serialises
(``Outcome.to_dict()`` is the response's ``collaboration`` object).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

import attrs

AgentFinish = Literal["stop", "length", "pruned", "aborted", "error"]

#: The events the built-in modes emit. A custom mode may emit types of its own.
EventType = Literal[
    "agent_started",
    "delta",
    "agent_finished",
    "vote",
    "pruned",
    "round",
    "validation",
    "escalate",
    "node_started",
    "node_finished",
    "loop",
    "branch_pruned",
    "tool_call",
    "tool_result",
    "final",
]
BUILTIN_EVENTS: Final[frozenset[str]] = frozenset(get_args(EventType))


@attrs.frozen(kw_only=True)
class CollaborationEvent:
    """Something that happened in a collaboration, in order; ``agent`` is None for global events.

    ``type`` is an ``EventType`` for the built-in modes, or a custom mode's own name.
    """

    type: str
    agent: str | None = None
    time: float = 0.0
    data: Mapping[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.data, "type": self.type, "agent": self.agent, "time": round(self.time, 6)}


def event(
    type: str, agent: str | None = None, *, time: float = 0.0, **data: Any
) -> CollaborationEvent:
    """Make an event (``agent_started``, ``delta``, ``vote``, ``final``… see ``EventType``)."""
    return CollaborationEvent(type=type, agent=agent, time=time, data=data)


@attrs.define
class AgentRecord:
    """What one agent did: its output and the engine's token accounting for it.

    Written by the agent's own role actor (and, for its final answer, by the mode).
    """

    name: str
    role: str
    output: str = ""
    finish_reason: AgentFinish = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    messages: int = 0
    tool_calls: int = 0
    round: int | None = None
    answer: str | None = None
    error: str | None = None
    adapter: str | None = None
    model: str | None = None
    started: float | None = None
    finished: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "output": self.output,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        optional = {
            "answer": self.answer,
            "round": self.round,
            "error": self.error,
            "model": self.model,
        }
        out.update({key: value for key, value in optional.items() if value is not None})
        return out


@attrs.frozen
class Usage:
    """Token totals of a collaboration, with OpenAI's semantics.

    ``prompt_tokens`` counts every prompt token of every request, cached or not;
    ``cached_tokens`` the part served from the prefix cache; and
    ``saved_completion_tokens`` estimates what pruning avoided (per pruned
    agent: the mean completion of the finished agents minus what it generated).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    saved_completion_tokens: int = 0

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def to_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.frozen
class ModelUsage:
    """One model's share of a collaboration's tokens (its own tokenizer's counts).

    ``remote`` is True for a model behind an endpoint (``RemoteBridge``): its
    numbers are the ones that endpoint reported; nothing of it is a KV share.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    remote: bool = False

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Outcome:
    """The result of one collaboration.

    ``details`` holds what is particular to the mode (vote's style, reflect's
    history, the graph's node states…); it is serialised under its own key.
    """

    mode: str
    answer: str
    agents: tuple[AgentRecord, ...]
    usage: Usage
    rounds: int = 1
    early_stopped: bool = False
    votes: Mapping[str, int] | None = None
    wall_time: float = 0.0
    details: Mapping[str, Any] = attrs.field(factory=dict)
    #: per served model (local and remote), the tokens its agents used
    usage_by_model: Mapping[str, ModelUsage] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "answer": self.answer,
            "rounds": self.rounds,
            "early_stopped": self.early_stopped,
            "agents": [a.to_dict() for a in self.agents],
            "usage": self.usage.to_dict(),
            "usage_by_model": {name: u.to_dict() for name, u in self.usage_by_model.items()},
            "pruned": [a.name for a in self.agents if a.finish_reason == "pruned"],
            "wall_time": round(self.wall_time, 4),
            "details": dict(self.details),
        }
        if self.votes is not None:
            out["votes"] = dict(self.votes)
        return out
