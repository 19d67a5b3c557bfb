"""Typed errors of the actor runtime; each carries the context needed to act on it."""

from __future__ import annotations

from ..mailbox import Undeliverable


class ActorError(Exception):
    """Base class of every error raised by the actor runtime."""


class AskTimeout(ActorError, TimeoutError):
    """No answer to an ask within its timeout (a later answer goes to dead letters).

    Attributes:
        actor: path of the asked actor.
        timeout: the timeout in seconds.
        message_type: the name of the request's class.
    """

    def __init__(self, actor: str, timeout: float, message_type: str) -> None:
        self.actor = actor
        self.timeout = timeout
        self.message_type = message_type
        super().__init__(f"{actor} did not answer {message_type} within {timeout:g} s")


class ActorFailed(ActorError):
    """The asked actor raised while handling the request; ``cause`` is what it raised.

    The exception also reached the actor's supervisor: it was not swallowed.
    """

    def __init__(self, actor: str, cause: BaseException) -> None:
        self.actor = actor
        self.cause = cause
        super().__init__(f"{actor} failed handling the request: {cause!r}")


class ActorStopped(ActorError, Undeliverable):
    """The asked actor stopped (or had stopped) before answering.

    Attributes:
        actor: path of the asked actor.
        reason: why it stopped, or the dead-letter reason of the request.
    """

    def __init__(self, actor: str, reason: object) -> None:
        self.actor = actor
        self.stop_reason = reason
        Undeliverable.__init__(self, actor, str(reason))
        self.args = (f"{actor} stopped before answering: {reason}",)

    def __str__(self) -> str:
        return str(self.args[0])


class UnhandledMessage(ActorError):
    """An actor received a message it has no handler for (a failure, like in Erlang)."""

    def __init__(self, actor: str, message: object) -> None:
        self.actor = actor
        self.message = message
        super().__init__(f"{actor} has no handler for {type(message).__name__}: {message!r}")


class EscalationError(ActorError):
    """A supervisor gave up: a child failed more often than its restart intensity allows.

    Raised inside the supervisor (which then fails in turn, so its own parent
    decides); at a scope or the runtime root it is raised to the code that
    owns that scope.

    Attributes:
        supervisor: path of the supervisor that gave up.
        child: path of the child whose failure exceeded the intensity.
        cause: the child's exception.
        restarts: restarts counted within the window.
    """

    def __init__(self, supervisor: str, child: str, cause: BaseException, restarts: int) -> None:
        self.supervisor = supervisor
        self.child = child
        self.cause = cause
        self.restarts = restarts
        super().__init__(
            f"{supervisor} gave up after {restarts} restart(s): {child} failed with {cause!r}"
        )


class ActorNameTaken(ActorError, ValueError):
    """A live sibling already has this name."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"an actor named {path} is already running")


class RuntimeNotRunning(ActorError, RuntimeError):
    """The runtime or scope is not running (not entered, or already closed)."""
