"""Supervision strategies, restart kinds and the supervision log."""

from __future__ import annotations

import enum
from collections import deque

import attrs


class RestartKind(enum.Enum):
    """When a child is restarted (Erlang child restart types)."""

    PERMANENT = "permanent"
    """Always: after a failure and after it stopped itself."""
    TRANSIENT = "transient"
    """Only after an abnormal end (an exception, or ``self.stop(reason)`` with a
    reason other than ``"normal"``/``"shutdown"``)."""
    TEMPORARY = "temporary"
    """Never: the failure is reported to the supervisor, which lets it stay dead."""


@attrs.frozen
class OneForOne:
    """Restart only the child that failed.

    Attributes:
        max_restarts: restarts allowed within ``within`` seconds; one more
            escalates (the supervisor stops its children and fails itself).
        within: the sliding window, in seconds (``anyio.current_time``).
    """

    max_restarts: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    within: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))


@attrs.frozen
class OneForAll:
    """Restart every child of the supervisor when one fails (siblings see reason ``"restart"``).

    Attributes:
        max_restarts: group restarts allowed within ``within`` seconds.
        within: the sliding window, in seconds.
    """

    max_restarts: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    within: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))


SupervisionStrategy = OneForOne | OneForAll


class Directive(enum.Enum):
    """What a supervisor decided about a child that ended."""

    RESTART = "restart"
    STOP = "stop"
    ESCALATE = "escalate"


@attrs.frozen
class SupervisionEvent:
    """One supervisor decision (the log that proves failures are never swallowed).

    Attributes:
        supervisor: path of the deciding supervisor (``"/"`` for the runtime root).
        child: path of the child.
        reason: why the child's incarnation ended (an exception for failures).
        directive: what was done.
        at: ``anyio.current_time()`` of the decision.
    """

    supervisor: str
    child: str
    reason: BaseException | str
    directive: Directive
    at: float


@attrs.define
class RestartWindow:
    """Counts restarts within a sliding window (the restart intensity)."""

    strategy: SupervisionStrategy
    times: deque[float] = attrs.field(factory=deque)

    def allow(self, now: float) -> bool:
        """Record a restart at ``now`` if the intensity allows it."""
        while self.times and now - self.times[0] > self.strategy.within:
            self.times.popleft()
        if len(self.times) >= self.strategy.max_restarts:
            return False
        self.times.append(now)
        return True


@attrs.frozen
class CleanupFailure:
    """An ``on_stop`` that raised or overran ``stop_timeout`` (reported, not swallowed)."""

    actor: str
    cause: BaseException
    at: float
