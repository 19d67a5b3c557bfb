"""ReplySlot: the one-shot answer channel of an ask."""

from __future__ import annotations

from typing import final

import anyio

_PENDING, _RESOLVED, _FAILED = 0, 1, 2


@final
class ReplySlot:
    """Where the answer to one ask is put: a value, or an error, exactly once.

    The asker waits on it; the actor resolves it. When the asker gives up
    (timeout, cancellation) it *abandons* the slot: a later answer is refused
    (``resolve`` returns ``False``) so the runtime can route it to dead letters.
    """

    __slots__ = ("_abandoned", "_error", "_event", "_state", "_value")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._state = _PENDING
        self._value: object = None
        self._error: BaseException | None = None
        self._abandoned = False

    @property
    def done(self) -> bool:
        """Whether a value or an error was set."""
        return self._state != _PENDING

    @property
    def abandoned(self) -> bool:
        """Whether the asker stopped waiting."""
        return self._abandoned

    @property
    def open(self) -> bool:
        """Whether an answer would still reach the asker."""
        return self._state == _PENDING and not self._abandoned

    def resolve(self, value: object) -> bool:
        """Answer with ``value``; returns whether the asker will see it."""
        if not self.open:
            return False
        self._value = value
        self._state = _RESOLVED
        self._event.set()
        return True

    def fail(self, error: BaseException) -> bool:
        """Answer with ``error`` (raised in the asker); returns whether it will see it."""
        if not self.open:
            return False
        self._error = error
        self._state = _FAILED
        self._event.set()
        return True

    def abandon(self) -> None:
        """The asker gives up: later answers are refused."""
        self._abandoned = True

    async def wait(self) -> object:
        """Wait for the answer: return the value or raise the error."""
        if self._state == _PENDING:
            await self._event.wait()
        if self._state == _FAILED:
            assert self._error is not None
            raise self._error
        return self._value

    def outcome(self) -> tuple[bool, object]:
        """``(ok, value_or_error)`` once done; ``ValueError`` while pending."""
        if self._state == _PENDING:
            raise ValueError("the reply slot holds no answer yet")
        if self._state == _FAILED:
            return False, self._error
        return True, self._value
