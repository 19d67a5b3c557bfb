"""The mode contract: ``CollaborationOp[C]``, what ``run`` returns, and ``ModeRegistry``.

A mode is a ``CollaborationOp`` subclass with a typed config (an attrs class
derived from ``ModeConfig``) and one ``run(ctx)`` method. ``run`` spawns role
actors through the context, sends them KV handles, and returns a
``ModeResult``; the context records every agent, every event and the usage.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import attrs

from ._config import ModeConfig
from ._errors import InvalidCollaboration
from ._spec import AgentSpec

if TYPE_CHECKING:
    from ._context import CollaborationContext

C = TypeVar("C", bound=ModeConfig)


@attrs.frozen(kw_only=True)
class ModeResult:
    """What a mode's ``run`` returns.

    Attributes:
        answer: the final answer text.
        rounds: rounds the mode ran (1 for modes without rounds).
        early_stopped: it stopped before its budget because the result was settled.
        votes: the tally, for modes that vote.
        details: what is particular to the mode (JSON-like; ``Outcome.details``).
    """

    answer: str
    rounds: int = 1
    early_stopped: bool = False
    votes: Mapping[str, int] | None = None
    details: Mapping[str, Any] = attrs.field(factory=dict)


class CollaborationOp(abc.ABC, Generic[C]):
    """Base class of a collaboration mode, generic over its config class.

    Subclasses set ``name`` (the registry key, also the HTTP ``collaboration.mode``),
    ``Config`` (the ``ModeConfig`` subclass that ``C`` names) and ``default_agents``
    (used when a request names no agents), and implement ``run``.
    """

    name: ClassVar[str]
    Config: ClassVar[type[ModeConfig]] = ModeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("agent", count=3),)
    min_agents: ClassVar[int] = 1
    #: Whether the mode has rounds (``rounds`` is refused by modes without them).
    uses_rounds: ClassVar[bool] = False
    #: The request field its agents come from (``graph``: its nodes): the field an agent
    #: cap's error names.
    agents_field: ClassVar[str] = "agents"

    def validate(self, config: C, agents: Sequence[AgentSpec]) -> None:
        """Check mode-specific rules; raise ``InvalidCollaboration`` naming the field."""
        total = sum(a.count for a in agents)
        if total < self.min_agents:
            raise InvalidCollaboration(
                "agents", f"mode {self.name!r} needs at least {self.min_agents} agents, got {total}"
            )

    def spawned_specs(self, config: C, agents: Sequence[AgentSpec]) -> Sequence[AgentSpec]:
        """The specs one run spawns role actors for (default: ``agents``; ``graph``: its
        nodes). ``max_agents`` caps their instances, and the largest turn reads them."""
        return agents

    def max_turns(self, config: C, agents: Sequence[AgentSpec]) -> int | None:
        """At most how many turns (engine generations) one run makes; ``None``: unknown.

        A server's per-collaboration token budget refuses a request up front when this
        bound times the largest turn exceeds it; with ``None`` the budget is enforced
        only as the run goes (``CollaborationContext.turn``).
        """
        return None

    @abc.abstractmethod
    async def run(self, ctx: CollaborationContext[C]) -> ModeResult:
        """Run the collaboration and return its result."""


AnyOp = CollaborationOp[Any]


class ModeRegistry:
    """Collaboration modes by name: which ``collaboration.mode`` values a caller may use.

    ``microagent`` keeps one default registry holding the built-in modes
    (``register_mode`` adds to it); build your own to run with a chosen set.
    """

    def __init__(self, modes: Iterable[type[AnyOp]] = ()) -> None:
        self._modes: dict[str, type[AnyOp]] = {}
        for op in modes:
            self.register(op)

    def register(self, op: type[AnyOp]) -> type[AnyOp]:
        """Register ``op`` under its ``name`` (a class decorator too); replaces a same-named one."""
        if not (isinstance(op, type) and issubclass(op, CollaborationOp)):
            raise TypeError("a mode must subclass CollaborationOp")
        name = getattr(op, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{op.__name__} must set a non-empty class attribute `name`")
        self._modes[name] = op
        return op

    def unregister(self, name: str) -> None:
        """Forget the mode ``name`` (nothing happens if it is not registered)."""
        self._modes.pop(name, None)

    def get(self, name: str) -> type[AnyOp]:
        """The mode registered as ``name``.

        Raises:
            InvalidCollaboration: no such mode (names ``collaboration.mode``).
        """
        try:
            return self._modes[name]
        except KeyError:
            raise InvalidCollaboration(
                "collaboration.mode", f"unknown mode {name!r}; registered modes: {self.names()}"
            ) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._modes)

    def copy(self) -> ModeRegistry:
        """A registry with the same modes (changes to either leave the other alone)."""
        return ModeRegistry(self._modes.values())

    def __contains__(self, name: object) -> bool:
        return name in self._modes

    def __iter__(self) -> Iterator[type[AnyOp]]:
        return iter(list(self._modes.values()))

    def __len__(self) -> int:
        return len(self._modes)
