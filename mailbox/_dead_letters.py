"""Dead letters: the observable sink of every message that could not be delivered."""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Self, final

import anyio
import attrs
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from ._envelope import Envelope
from ._errors import Undeliverable


class DeadLetterReason(enum.StrEnum):
    """Why a message ended in dead letters."""

    RECIPIENT_STOPPED = "recipient_stopped"
    """Sent to an actor that had already stopped (or was stopping)."""
    MAILBOX_CLOSED = "mailbox_closed"
    """Still buffered (or its sender still blocked) when the mailbox closed."""
    OVERFLOW = "overflow"
    """The mailbox was full and its policy is ``DEAD_LETTER``."""
    REJECTED = "rejected"
    """The mailbox was full and its policy is ``FAIL`` (the sender got ``MailboxFull``)."""
    EXPIRED = "expired"
    """Its asker had given up (timeout, cancellation) before it was handled."""
    LATE_REPLY = "late_reply"
    """An answer produced after its asker had given up."""


@attrs.frozen
class DeadLetter:
    """One undelivered message, with where it was going and why it did not arrive."""

    envelope: Envelope
    recipient: str
    reason: DeadLetterReason
    at: float

    @property
    def message(self) -> object:
        return self.envelope.message


def _now() -> float:
    try:
        return anyio.current_time()
    except Exception:  # no event loop running (a sync teardown path)
        return float("nan")


@final
class DeadLetterSubscription:
    """A stream of dead letters published after subscribing (``async for`` it).

    A slow reader does not slow publishers: when its buffer is full the letter
    is counted in ``missed`` (it is still in the sink's history).
    """

    def __init__(self, owner: DeadLetters, max_buffer: int) -> None:
        send: ObjectSendStream[DeadLetter]
        receive: ObjectReceiveStream[DeadLetter]
        send, receive = anyio.create_memory_object_stream[DeadLetter](max_buffer)
        self._owner = owner
        self._send = send
        self._receive = receive
        self.missed = 0

    def _offer(self, letter: DeadLetter) -> None:
        try:
            self._send.send_nowait(letter)
        except anyio.WouldBlock:
            self.missed += 1

    def close(self) -> None:
        """Stop receiving; iteration ends once the buffer is read."""
        self._owner._subscriptions.discard(self)
        self._send.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
        self._receive.close()

    def __aiter__(self) -> AsyncIterator[DeadLetter]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[DeadLetter]:
        async for letter in self._receive:
            yield letter


@final
class DeadLetters:
    """The sink: keeps recent dead letters, counts all, and notifies subscribers.

    Args:
        keep: how many recent letters to keep in ``records`` (``None``: all).
    """

    def __init__(self, *, keep: int | None = 10_000) -> None:
        self._records: deque[DeadLetter] = deque(maxlen=keep)
        self._counts: Counter[DeadLetterReason] = Counter()
        self._callbacks: list[Callable[[DeadLetter], None]] = []
        self._subscriptions: set[DeadLetterSubscription] = set()
        self.total = 0

    def publish(self, envelope: Envelope, recipient: str, reason: DeadLetterReason) -> DeadLetter:
        """Record an undelivered envelope; an ask's slot fails with ``Undeliverable``."""
        letter = DeadLetter(envelope, recipient, reason, _now())
        self._records.append(letter)
        self._counts[reason] += 1
        self.total += 1
        if envelope.reply is not None and reason is not DeadLetterReason.LATE_REPLY:
            envelope.reply.fail(Undeliverable(recipient, reason.value))
        for callback in list(self._callbacks):
            callback(letter)
        for sub in list(self._subscriptions):
            sub._offer(letter)
        return letter

    @property
    def records(self) -> tuple[DeadLetter, ...]:
        """The kept letters, oldest first."""
        return tuple(self._records)

    def counts(self) -> dict[DeadLetterReason, int]:
        """How many letters were published per reason (over all time)."""
        return dict(self._counts)

    def on_letter(self, callback: Callable[[DeadLetter], None]) -> Callable[[], None]:
        """Call ``callback`` for every future letter; returns the function that unsubscribes."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def subscribe(self, *, max_buffer: int = 1024) -> DeadLetterSubscription:
        """A subscription to iterate: ``async with sink.subscribe() as letters: ...``."""
        sub = DeadLetterSubscription(self, max_buffer)
        self._subscriptions.add(sub)
        return sub

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(tuple(self._records))
