"""Which actor is running now: the ContextVar every actor task sets (a leaf module, no cycle)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._cell import _Cell

#: The cell of the actor whose task is running (set by each actor task for its life).
current: ContextVar[_Cell | None] = ContextVar("microagent_current_actor", default=None)


def current_cell() -> _Cell | None:
    """The actor whose task is running now (``None`` outside actors)."""
    return current.get()
