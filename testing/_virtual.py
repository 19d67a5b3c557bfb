"""Run async code in virtual time: the ScriptedEngine's latencies cost no wall time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def run_virtual(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """Run ``await fn(*args)`` under trio with an autojumping mock clock and return its result.

    Every ``anyio.sleep`` (the ScriptedEngine's prefill and decode time, your
    actors' timeouts) jumps the clock instead of waiting, so a test of a
    ten-second collaboration runs in milliseconds and always the same way.

    Raises:
        RuntimeError: trio is not installed (``pip install trio``).
    """
    try:
        import trio
        import trio.testing
    except ImportError as exc:  # trio is a test dependency, not a runtime one
        raise RuntimeError("run_virtual needs trio: pip install trio") from exc
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(fn, *args, clock=clock)
