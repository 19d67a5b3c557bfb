"""Mailbox: a bounded FIFO of envelopes with an explicit overflow policy.

One consumer (the actor's task) takes envelopes one at a time; any number of
senders put. Unlike an anyio memory stream, closing never strands anything:
buffered envelopes and blocked senders' envelopes go to dead letters with a
reason, and asks among them fail at once.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from typing import final

import anyio
import attrs
from anyio.lowlevel import checkpoint_if_cancelled

from ._dead_letters import DeadLetterReason, DeadLetters
from ._envelope import Envelope
from ._errors import MailboxClosed, MailboxFull


class OverflowPolicy(enum.Enum):
    """What ``put`` does when the mailbox is full."""

    BLOCK = "block"
    """Wait for room (back-pressure on the sender). The default."""
    FAIL = "fail"
    """Raise ``MailboxFull`` at once (the envelope is also dead-lettered)."""
    DEAD_LETTER = "dead_letter"
    """Route the envelope to dead letters and return."""


@attrs.frozen
class MailboxStats:
    """A snapshot of one mailbox.

    Attributes:
        capacity: the bound on buffered user messages.
        depth: user messages buffered now (never above ``capacity``).
        high_water: the largest ``depth`` seen.
        enqueued: envelopes accepted (user and system).
        delivered: envelopes taken by the consumer.
        dead_lettered: envelopes routed to dead letters from this mailbox.
        blocked_senders: senders waiting for room now.
        closed: whether the mailbox accepts no more input.
    """

    capacity: int
    depth: int
    high_water: int
    enqueued: int
    delivered: int
    dead_lettered: int
    blocked_senders: int
    closed: bool


@final
class _Putter:
    __slots__ = ("done", "envelope", "event")

    def __init__(self, envelope: Envelope) -> None:
        self.envelope = envelope
        self.event = anyio.Event()
        self.done = False


@final
class Mailbox:
    """A bounded FIFO mailbox owned by one actor.

    Args:
        capacity: how many user messages may be buffered (system messages such
            as ``Terminated`` bypass the bound but keep FIFO order).
        policy: what a ``put`` on a full mailbox does.
        owner: the owning actor's path (for errors and dead letters).
        dead_letters: where undeliverable envelopes go.
    """

    def __init__(
        self,
        capacity: int = 1024,
        policy: OverflowPolicy = OverflowPolicy.BLOCK,
        *,
        owner: str = "<mailbox>",
        dead_letters: DeadLetters | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.capacity = capacity
        self.policy = policy
        self.owner = owner
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._buffer: deque[tuple[Envelope, bool]] = deque()
        self._depth = 0
        self._putters: deque[_Putter] = deque()
        self._getter: anyio.Event | None = None
        self._closed = False
        self._high_water = 0
        self._enqueued = 0
        self._delivered = 0
        self._dead = 0

    # -- state -----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether the mailbox refuses new input."""
        return self._closed

    def __len__(self) -> int:
        return len(self._buffer)

    def stats(self) -> MailboxStats:
        return MailboxStats(
            capacity=self.capacity,
            depth=self._depth,
            high_water=self._high_water,
            enqueued=self._enqueued,
            delivered=self._delivered,
            dead_lettered=self._dead,
            blocked_senders=len(self._putters),
            closed=self._closed,
        )

    def dead_letter(self, envelope: Envelope, reason: DeadLetterReason) -> None:
        """Route ``envelope`` (addressed to this mailbox's owner) to dead letters."""
        self._dead += 1
        self.dead_letters.publish(envelope, self.owner, reason)

    # -- input -----------------------------------------------------------------------
    def _append(self, envelope: Envelope, user: bool) -> None:
        self._buffer.append((envelope, user))
        self._enqueued += 1
        if user:
            self._depth += 1
            if self._depth > self._high_water:
                self._high_water = self._depth
        getter = self._getter
        if getter is not None:
            self._getter = None
            getter.set()

    def put_nowait(self, envelope: Envelope) -> bool:
        """Put without waiting; returns whether the envelope was enqueued.

        Raises:
            MailboxFull: full, with policy ``FAIL``.
            anyio.WouldBlock: full, with policy ``BLOCK``.
        """
        if self._closed:
            self.dead_letter(envelope, DeadLetterReason.RECIPIENT_STOPPED)
            return False
        if self._depth < self.capacity and not self._putters:
            self._append(envelope, True)
            return True
        if self.policy is OverflowPolicy.DEAD_LETTER:
            self.dead_letter(envelope, DeadLetterReason.OVERFLOW)
            return False
        if self.policy is OverflowPolicy.FAIL:
            self.dead_letter(envelope, DeadLetterReason.REJECTED)
            raise MailboxFull(self.owner, self.capacity)
        raise anyio.WouldBlock

    async def put(self, envelope: Envelope) -> bool:
        """Put ``envelope``, applying the overflow policy; returns whether it was enqueued.

        A closed mailbox dead-letters the envelope (``RECIPIENT_STOPPED``).
        With ``BLOCK``, waiting senders are served in arrival order; a sender
        cancelled while waiting has not sent anything.

        Raises:
            MailboxFull: full, with policy ``FAIL``.
        """
        await checkpoint_if_cancelled()
        try:
            return self.put_nowait(envelope)
        except anyio.WouldBlock:
            pass
        putter = _Putter(envelope)
        self._putters.append(putter)
        try:
            await putter.event.wait()
        finally:
            if not putter.done:
                with contextlib.suppress(ValueError):  # close() may have removed it
                    self._putters.remove(putter)
        if self._closed and not putter.done:
            self.dead_letter(envelope, DeadLetterReason.MAILBOX_CLOSED)
            return False
        return True

    def put_system(self, envelope: Envelope) -> bool:
        """Enqueue a runtime message (e.g. ``Terminated``) past the bound, in FIFO order."""
        if self._closed:
            self.dead_letter(envelope, DeadLetterReason.RECIPIENT_STOPPED)
            return False
        self._append(envelope, False)
        return True

    # -- output ----------------------------------------------------------------------
    def _refill(self) -> None:
        while self._putters and self._depth < self.capacity:
            putter = self._putters.popleft()
            putter.done = True
            self._append(putter.envelope, True)
            putter.event.set()

    def get_nowait(self) -> Envelope:
        """Take the oldest envelope.

        Raises:
            anyio.WouldBlock: nothing buffered yet.
            MailboxClosed: closed and nothing left.
        """
        if self._buffer:
            envelope, user = self._buffer.popleft()
            self._delivered += 1
            if user:
                self._depth -= 1
                if self._putters:
                    self._refill()
            return envelope
        if self._closed and not self._putters:
            raise MailboxClosed(self.owner)
        raise anyio.WouldBlock

    async def get(self) -> Envelope:
        """Wait for and take the oldest envelope (one consumer only).

        Raises:
            MailboxClosed: closed and nothing left.
        """
        while True:
            await checkpoint_if_cancelled()
            try:
                return self.get_nowait()
            except anyio.WouldBlock:
                pass
            if self._getter is not None:
                raise RuntimeError(f"mailbox of {self.owner} has a consumer already")
            event = self._getter = anyio.Event()
            try:
                await event.wait()
            finally:
                if self._getter is event:
                    self._getter = None

    # -- closing ---------------------------------------------------------------------
    def close(self, *, drain: bool = False) -> int:
        """Refuse new input; unless ``drain``, dead-letter everything still buffered.

        With ``drain`` the consumer may still take what is buffered (and what
        already-blocked senders hand over); call ``close()`` again to discard
        the rest. Returns how many envelopes were dead-lettered now.
        """
        self._closed = True
        dropped = 0
        if not drain:
            while self._buffer:
                envelope, user = self._buffer.popleft()
                if user:
                    self._depth -= 1
                self.dead_letter(envelope, DeadLetterReason.MAILBOX_CLOSED)
                dropped += 1
            while self._putters:
                putter = self._putters.popleft()
                putter.event.set()  # the sender dead-letters its own envelope
                dropped += 1
        getter = self._getter
        if getter is not None:
            self._getter = None
            getter.set()
        return dropped
