"""Data of a collaboration: agent specs, events, per-agent records, the outcome.

These are the shapes the Python API returns and the HTTP API serialises
(``Outcome.to_dict()`` is the response's ``collaboration`` object).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

AgentFinish = Literal["stop", "length", "pruned", "aborted", "error"]


class InvalidCollaboration(ValueError):
    """A collaboration request is invalid; ``field`` names the offending input."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class CollaborationFailed(RuntimeError):
    """A collaboration could not produce an answer (every role failed, engine died…).

    ``records`` holds what each agent did before the failure.
    """

    def __init__(self, reason: str, records: tuple[AgentRecord, ...] = (), cause: BaseException | None = None) -> None:
        self.reason = reason
        self.records = records
        self.cause = cause
        super().__init__(reason)


def _positive(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 1:
        raise InvalidCollaboration(attribute.name, f"must be >= 1, got {value}")


def _temperature(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 2.0:
        raise InvalidCollaboration(attribute.name, f"must be in [0, 2], got {value}")


def _name(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidCollaboration(attribute.name, "must be a non-empty string")


@attrs.frozen
class AgentSpec:
    """One role of a collaboration (``count`` > 1 makes that many identical agents).

    Agents of a spec are named ``name`` (count 1) or ``name-1`` … ``name-N``.
    ``model`` picks another served model (cascade); ``adapter`` a LoRA adapter.
    """

    name: str = attrs.field(validator=_name)
    count: int = attrs.field(default=1, validator=_positive)
    instructions: str = ""
    adapter: str | None = None
    model: str | None = None
    temperature: float | None = attrs.field(default=None, validator=_temperature)
    max_tokens: int | None = attrs.field(default=None, validator=_positive)
    top_p: float | None = None
    role: str | None = None

    def agent_names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(1, self.count + 1)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentSpec:
        """Build from a JSON object, with errors that name the field."""
        if not isinstance(data, Mapping):
            raise InvalidCollaboration("agents", "each agent must be an object")
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidCollaboration(f"agents.{unknown[0]}", "unknown field")
        for key, value in data.items():
            expected = _AGENT_FIELD_TYPES[key]
            if value is None and key != "name" and key != "count" and key != "instructions":
                continue
            if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
                names = " or ".join(t.__name__ for t in expected)
                raise InvalidCollaboration(f"agents.{key}", f"must be {names}, got {type(value).__name__}")
        try:
            return cls(**data)
        except InvalidCollaboration as exc:
            raise InvalidCollaboration(f"agents.{exc.field}", exc.reason) from None
        except TypeError as exc:
            raise InvalidCollaboration("agents", str(exc)) from None


_AGENT_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "count": (int,),
    "instructions": (str,),
    "adapter": (str,),
    "model": (str,),
    "temperature": (int, float),
    "max_tokens": (int,),
    "top_p": (int, float),
    "role": (str,),
}


@attrs.frozen
class AnswerSpec:
    """How answers are constrained: fixed ``choices`` or a ``regex`` (or free text)."""

    choices: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    regex: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.choices is not None and self.regex is not None:
            raise InvalidCollaboration("answer", "give choices or regex, not both")
        if self.choices is not None:
            if not self.choices or not all(isinstance(c, str) and c.strip() for c in self.choices):
                raise InvalidCollaboration("answer.choices", "must be a non-empty list of non-empty strings")
            if len(set(self.choices)) != len(self.choices):
                raise InvalidCollaboration("answer.choices", "must not repeat a choice")
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as exc:
                raise InvalidCollaboration("answer.regex", f"invalid regular expression: {exc}") from None

    @property
    def constrained(self) -> bool:
        return self.choices is not None or self.regex is not None


# --- events -----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CollaborationEvent:
    """Something that happened in a collaboration, in order; ``agent`` is None for global events."""

    type: str
    agent: str | None = None
    time: float = 0.0
    data: Mapping[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "agent": self.agent, "time": round(self.time, 6), **self.data}


def event(type: str, agent: str | None = None, *, time: float = 0.0, **data: Any) -> CollaborationEvent:
    """Make an event: ``agent_started``, ``delta``, ``agent_finished``, ``vote``, ``pruned``, ``round``, ``final``…"""
    return CollaborationEvent(type=type, agent=agent, time=time, data=data)


# --- results ------------------------------------------------------------------------


@attrs.define
class AgentRecord:
    """What one agent did: its output and the engine's token accounting for it."""

    name: str
    role: str
    output: str = ""
    finish_reason: AgentFinish = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    messages: int = 0
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
        if self.answer is not None:
            out["answer"] = self.answer
        if self.round is not None:
            out["round"] = self.round
        if self.error is not None:
            out["error"] = self.error
        if self.model is not None:
            out["model"] = self.model
        return out


@attrs.frozen
class Usage:
    """Token totals of a collaboration (OpenAI semantics, DESIGN.md "Usage numbers")."""

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
class Outcome:
    """The result of one collaboration."""

    mode: str
    answer: str
    agents: tuple[AgentRecord, ...]
    usage: Usage
    rounds: int = 1
    early_stopped: bool = False
    votes: Mapping[str, int] | None = None
    wall_time: float = 0.0
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "answer": self.answer,
            "rounds": self.rounds,
            "early_stopped": self.early_stopped,
            "agents": [a.to_dict() for a in self.agents],
            "usage": self.usage.to_dict(),
            "pruned": [a.name for a in self.agents if a.finish_reason == "pruned"],
            "wall_time": round(self.wall_time, 4),
        }
        if self.votes is not None:
            out["votes"] = dict(self.votes)
        out.update(self.extra)
        return out
