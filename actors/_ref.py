"""ActorRef: the address of an actor, the only way to talk to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import anyio

from ..mailbox import (
    DeadLetterReason,
    Envelope,
    MailboxStats,
    ReplySlot,
    Undeliverable,
    next_correlation_id,
)
from ._current import current_cell
from ._errors import ActorStopped, AskTimeout
from ._messages import NORMAL, StopReason

if TYPE_CHECKING:
    from ._cell import _Cell

_STOPPED_REASONS = frozenset(
    {DeadLetterReason.RECIPIENT_STOPPED.value, DeadLetterReason.MAILBOX_CLOSED.value}
)


@final
class ActorRef:
    """Address of one actor; stays valid across its restarts.

    ``tell`` and ``ask`` respect the mailbox's overflow policy. After the
    actor stopped, messages go to dead letters and asks raise ``ActorStopped``.
    Refs compare by identity: a new actor that reuses a name has a new ref.
    """

    __slots__ = ("__weakref__", "_cell")

    def __init__(self, cell: _Cell) -> None:
        self._cell = cell

    @property
    def name(self) -> str:
        return self._cell.name

    @property
    def path(self) -> str:
        return self._cell.path

    @property
    def is_alive(self) -> bool:
        """Whether the actor has not terminated yet."""
        return self._cell.alive

    @property
    def restarts(self) -> int:
        """How many times the actor was restarted."""
        return self._cell.restarts

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the actor terminated (``None`` while alive)."""
        return self._cell.final_reason

    def mailbox_stats(self) -> MailboxStats:
        return self._cell.mailbox.stats()

    def _sender(self) -> ActorRef | None:
        cell = current_cell()
        return None if cell is None else cell.ref

    async def tell(self, message: object, *, deadline: float | None = None) -> None:
        """Send ``message`` without waiting for it to be handled.

        Args:
            message: what to send (an attrs frozen class is the idiom).
            deadline: ``anyio.current_time()`` after which it is not worth handling
                (it then goes to dead letters as expired).

        Raises:
            MailboxFull: the mailbox is full and its policy is ``FAIL``.
        """
        envelope = Envelope(message, self._sender(), None, next_correlation_id(), deadline)
        await self._cell.mailbox.put(envelope)

    def tell_nowait(self, message: object) -> None:
        """``tell`` from synchronous code.

        Raises:
            MailboxFull: full, with policy ``FAIL``.
            anyio.WouldBlock: full, with policy ``BLOCK``.
        """
        envelope = Envelope(message, self._sender(), None, next_correlation_id(), None)
        self._cell.mailbox.put_nowait(envelope)

    async def ask(self, message: object, *, timeout: float | None = None) -> Any:
        """Send ``message`` and wait for the answer.

        Args:
            message: the request.
            timeout: seconds to wait (queueing included); default ``Runtime.ask_timeout``.

        Returns:
            What the handler returned (or passed to ``reply``).

        Raises:
            AskTimeout: no answer in time; a later answer goes to dead letters.
            ActorFailed: the handler raised; ``.cause`` is its exception.
            ActorStopped: the actor stopped (or was dead) before answering.
            MailboxFull: the mailbox is full and its policy is ``FAIL``.
            Undeliverable: the request was dead-lettered (policy ``DEAD_LETTER``).
        """
        cell = self._cell
        if timeout is None:
            timeout = cell.runtime.ask_timeout
        sender = self._sender()
        if sender is self:
            raise RuntimeError(f"{self.path} cannot ask itself: it would wait for itself")
        slot = ReplySlot()
        envelope = Envelope(
            message, sender, slot, next_correlation_id(), anyio.current_time() + timeout
        )
        with anyio.move_on_after(timeout):
            try:
                await cell.mailbox.put(envelope)
                return await slot.wait()
            except ActorStopped:
                raise
            except Undeliverable as exc:
                if exc.reason in _STOPPED_REASONS:
                    raise ActorStopped(self.path, cell.final_reason or exc.reason) from None
                raise
            finally:
                if not slot.done:
                    slot.abandon()
        raise AskTimeout(self.path, timeout, type(message).__name__)

    async def stop(self, reason: StopReason = NORMAL, *, drain: bool = False) -> StopReason | None:
        """Stop the actor (and its children) and wait until it has terminated.

        An explicit stop is never followed by a restart.

        Args:
            reason: the stop reason watchers and ``on_stop`` see.
            drain: handle what is already in the mailbox first (new messages go
                to dead letters); otherwise the current handler is cancelled and
                buffered messages go to dead letters.

        Returns:
            The reason it terminated with. Called by the actor on itself, it
            returns at once and the actor stops after the current message.
        """
        cell = self._cell
        cell.request_stop(reason, drain=drain)
        if current_cell() is cell:
            return reason
        await cell.done.wait()
        return cell.final_reason

    async def join(self) -> StopReason | None:
        """Wait until the actor has terminated; returns its stop reason."""
        await self._cell.done.wait()
        return self._cell.final_reason

    def __repr__(self) -> str:
        state = "alive" if self._cell.alive else f"dead: {self._cell.final_reason!r}"
        return f"<ActorRef {self.path} ({state})>"
