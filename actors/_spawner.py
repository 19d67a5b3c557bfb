"""``Spawner``: the one ``spawn`` that the runtime, its scopes and actors share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..mailbox import OverflowPolicy
from ._supervision import RestartKind, SupervisionStrategy

if TYPE_CHECKING:
    from ._actor import Actor
    from ._cell import _Node
    from ._ref import ActorRef

A = TypeVar("A", bound="Actor")


class Spawner:
    """Something actors start under: the runtime's root, a scope, or an actor (its children)."""

    __slots__ = ()

    def _spawn_parent(self) -> _Node:
        """The supervisor node new actors are children of (raises when it does not run)."""
        raise NotImplementedError

    def spawn(
        self,
        behaviour: type[A] | Callable[[], A],
        *,
        name: str | None = None,
        supervision: SupervisionStrategy | None = None,
        capacity: int | None = None,
        overflow: OverflowPolicy | None = None,
        restart: RestartKind = RestartKind.PERMANENT,
    ) -> ActorRef:
        """Start an actor supervised here: a top-level actor of a ``Runtime``, one whose
        life is bounded by an ``ActorScope``, or a child of an ``Actor``.

        Args:
            behaviour: an ``Actor`` subclass, or a factory returning a fresh
                ``Actor`` (called again on every restart).
            name: unique among its siblings (default: class name + counter).
            supervision: the strategy the new actor applies to *its* children.
            capacity: mailbox bound (default ``Runtime.mailbox_capacity``).
            overflow: mailbox overflow policy (default ``Runtime.overflow``).
            restart: when its supervisor restarts it.

        Returns:
            The new actor's reference; messages sent before it started wait in its mailbox.
        """
        return self._spawn_parent().spawn_child(
            behaviour,
            name=name,
            supervision=supervision,
            capacity=capacity,
            overflow=overflow,
            restart=restart,
        )
