"""The collaboration layer's errors: one base, each carrying what went wrong and where."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._outcome import AgentRecord


class CollaborationError(Exception):
    """Base of every error the collaboration layer raises."""


class InvalidCollaboration(CollaborationError, ValueError):
    """A collaboration request is invalid; ``field`` names the offending input."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class InvalidGraph(InvalidCollaboration):
    """A graph is invalid; ``node`` names the node at fault (None when no node is)."""

    def __init__(self, node: str | None, reason: str, field: str = "collaboration.graph") -> None:
        self.node = node
        where = f"node {node!r}: " if node is not None else ""
        super().__init__(field, where + reason)


class InvalidRole(CollaborationError, ValueError):
    """A role file is invalid; ``path`` and ``field`` say where."""

    def __init__(self, path: str, field: str | None, reason: str) -> None:
        self.path = path
        self.field = field
        self.reason = reason
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + reason)


class CollaborationFailed(CollaborationError, RuntimeError):
    """A collaboration could not produce an answer (every role failed, engine died…).

    ``records`` holds what each agent did before the failure.
    """

    def __init__(
        self,
        reason: str,
        records: tuple[AgentRecord, ...] = (),
        cause: BaseException | None = None,
    ) -> None:
        self.reason = reason
        self.records = records
        self.cause = cause
        super().__init__(reason)


class NoAnswer(CollaborationFailed):
    """The collaboration ended without an answer because of how its request set it up: a
    graph whose conditions pruned its output node. ``field`` names that input (the server
    answers 422 naming it, not a server error)."""

    def __init__(self, field: str, reason: str, records: tuple[AgentRecord, ...] = ()) -> None:
        self.field = field
        super().__init__(reason, records)
