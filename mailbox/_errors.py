"""Typed errors of the mailbox layer; each carries the context needed to act on it."""

from __future__ import annotations


class MailboxError(Exception):
    """Base class of every error raised by a mailbox."""


class MailboxFull(MailboxError):
    """A ``FAIL``-policy mailbox was full: the message was refused (and dead-lettered).

    Attributes:
        actor: path of the actor that owns the mailbox.
        capacity: the mailbox's bound.
    """

    def __init__(self, actor: str, capacity: int) -> None:
        self.actor = actor
        self.capacity = capacity
        super().__init__(f"mailbox of {actor} is full (capacity {capacity})")


class MailboxClosed(MailboxError):
    """The mailbox is closed and holds nothing more to receive."""

    def __init__(self, actor: str) -> None:
        self.actor = actor
        super().__init__(f"mailbox of {actor} is closed")


class Undeliverable(MailboxError):
    """An ask's request went to dead letters instead of being handled.

    The mailbox fails the ask's reply slot with this error so the caller learns
    at once (instead of waiting for its timeout). ``reason`` is the
    ``DeadLetterReason`` value.
    """

    def __init__(self, recipient: str, reason: str) -> None:
        self.recipient = recipient
        self.reason = reason
        super().__init__(f"message to {recipient} was not delivered: {reason}")
