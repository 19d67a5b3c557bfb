"""Typed errors of the engine bridge; each carries the context needed to act on it."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


def find_cause(exc: BaseException | None, kind: type[E] | tuple[type[E], ...]) -> E | None:
    """The first ``kind`` behind ``exc``, breadth first: ``exc`` itself, the ``cause``
    attribute our errors carry, ``__cause__``/``__context__``, and every member of an
    exception group (a role's failure arrives wrapped in task groups and
    ``CollaborationFailed``). Each exception is visited once, so cycles end.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [] if exc is None else [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (getattr(current, "cause", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                todo.append(linked)
    return None


class EngineBridgeError(Exception):
    """Base class of every error raised by an engine bridge."""


class EngineDied(EngineBridgeError):
    """The engine process died while a request was in flight.

    The bridge restarts the engine (bounded attempts); ``epoch`` is the epoch
    of the engine that died, so callers can tell which handles were affected.
    """

    def __init__(self, cause: BaseException | str, epoch: int) -> None:
        self.cause = cause
        self.epoch = epoch
        super().__init__(f"engine (epoch {epoch}) died: {cause!r}")


class EngineUnavailable(EngineBridgeError):
    """The engine could not be (re)started within the configured attempts."""


class RequestRefused(EngineBridgeError, ValueError):
    """A request was refused before reaching the engine (it would be invalid or unsafe).

    ``field`` names the offending input (``"seed"``, ``"max_tokens"``, ``"prompt"``…).
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class ModelPreparationError(EngineBridgeError):
    """A model could not be resolved or prepared (missing package, bad path, conversion failed)."""


class UnknownAdapter(EngineBridgeError, KeyError):
    """A LoRA adapter name was used that was never registered with the bridge."""

    def __init__(self, name: str, known: tuple[str, ...] = ()) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown adapter {name!r}; registered: {list(known)}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class HandleMismatch(EngineBridgeError, ValueError):
    """Two handles cannot be combined (other model, other adapter, not an ancestor…)."""


class RemoteError(EngineBridgeError):
    """A remote model's endpoint failed for good: retries (if any) were spent, or it refused.

    ``remote`` is the served name of the remote (an agent's ``model``), ``status``
    the last HTTP status (``None`` for a timeout or a dropped connection) and
    ``attempts`` how many requests were made. The message never holds the key.
    """

    def __init__(
        self, remote: str, reason: str, *, status: int | None = None, attempts: int = 1
    ) -> None:
        self.remote = remote
        self.reason = reason
        self.status = status
        self.attempts = attempts
        where = f" (HTTP {status})" if status is not None else ""
        super().__init__(
            f"remote model {remote!r} failed after {attempts} attempt(s){where}: {reason}"
        )
