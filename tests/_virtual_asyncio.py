"""Virtual time for asyncio: trio's ``MockClock(autojump_threshold=0)``, for tests.

``VirtualClockLoop`` is a selector event loop whose ``time()`` is a virtual
clock. When the loop would wait (nothing ready, a timer pending) and no file
descriptor is ready either, the selector jumps the clock to the next timer
instead of sleeping, so ``anyio.sleep(3600)`` returns at once with
``anyio.current_time()`` exactly 3600 s later. With no timer pending it waits
on the real selector (a thread's ``call_soon_threadsafe`` still wakes it).

As with trio's autojump, the clock does not wait for work outside the loop: a
thread that runs in real time sees virtual timeouts expire at once.

Use it with anyio::

    anyio.run(main, backend="asyncio", backend_options={"loop_factory": VirtualClockLoop})

or ``run_on_virtual_clock(main, backend)`` for either backend on virtual time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import trio
import trio.testing

T = TypeVar("T")

#: the backends ``run_on_virtual_clock`` runs on
VIRTUAL_BACKENDS = ("trio", "asyncio")


class _AutojumpSelector(selectors.BaseSelector):
    """A selector that, instead of waiting ``timeout`` seconds, advances the loop's clock."""

    def __init__(self, loop: VirtualClockLoop, inner: selectors.BaseSelector) -> None:
        self._loop = loop
        self._inner = inner

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._inner.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only a file descriptor can wake the loop
            return self._inner.select(None)
        self._loop.advance(timeout)
        return []

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on a virtual clock that jumps to the next timer when idle.

    Args:
        start: the clock's first reading (trio's ``MockClock`` starts at 0 too).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = start
        self.jumps = 0
        super().__init__(_AutojumpSelector(self, selectors.DefaultSelector()))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (never back)."""
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._virtual_now += seconds
        self.jumps += 1


def run_on_virtual_clock(fn: Callable[[], Awaitable[T]], backend: str) -> T:
    """Run ``fn`` on ``backend`` with virtual time that jumps when idle (trio: ``MockClock``)."""
    if backend == "trio":
        return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))
    return anyio.run(fn, backend="asyncio", backend_options={"loop_factory": VirtualClockLoop})
