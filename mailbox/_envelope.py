"""Envelope: a message in transit, with what the runtime needs to route its answer."""

from __future__ import annotations

import itertools
from typing import Protocol, runtime_checkable

import attrs

from ._reply import ReplySlot

_correlation = itertools.count(1)


def next_correlation_id() -> int:
    """A process-unique, increasing id for an envelope."""
    return next(_correlation)


@runtime_checkable
class Addressable(Protocol):
    """Anything with an actor path: what a sender is (the mailbox knows no actors)."""

    @property
    def path(self) -> str: ...


@attrs.frozen(slots=True)
class Envelope:
    """One message in a mailbox.

    Attributes:
        message: the user's message (any object; attrs frozen classes recommended).
        sender: who sent it (an actor reference), or ``None`` from outside any actor.
        reply: the ask's reply slot; ``None`` for a tell.
        correlation_id: process-unique id (matches a late reply to its ask).
        deadline: ``anyio.current_time()`` after which nobody waits for it any more.
    """

    message: object
    sender: Addressable | None = None
    reply: ReplySlot | None = None
    correlation_id: int = attrs.field(factory=next_correlation_id)
    deadline: float | None = None
