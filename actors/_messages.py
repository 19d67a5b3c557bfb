"""Messages and values the runtime itself delivers to actors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from ._ref import ActorRef

StopReason = str | BaseException
"""Why an actor stopped: ``"normal"``, ``"shutdown"``, ``"cancelled"``, a string
of your own, or the exception that killed it."""

NORMAL: Final = "normal"
"""An actor stopped on request (``ref.stop()`` or ``self.stop()``)."""
SHUTDOWN: Final = "shutdown"
"""An actor was stopped by its parent, scope or runtime closing."""
CANCELLED: Final = "cancelled"
"""An actor's task was cancelled from outside (a cancelled scope, a timeout)."""
RESTART: Final = "restart"
"""``on_stop`` reason of an actor restarted because a sibling failed (one-for-all)."""


def is_abnormal(reason: StopReason) -> bool:
    """Whether ``reason`` is a failure (an exception or a reason of your own)."""
    return reason not in (NORMAL, SHUTDOWN, CANCELLED, RESTART)


@attrs.frozen
class Terminated:
    """Death-watch notice: the watched ``ref`` stopped, for ``reason``.

    Delivered to every watcher, also to one that starts watching an actor that
    is already dead. Handle it like any message (``@handles(Terminated)``).
    """

    ref: ActorRef
    reason: StopReason
