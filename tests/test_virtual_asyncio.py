"""The virtual-clock asyncio loop of the tests (``tests/_virtual_asyncio.py``)."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
from _virtual_asyncio import VirtualClockLoop

# a loop that waited instead of jumping would take an hour of wall time here
pytestmark = pytest.mark.timeout(20)


def run(fn, *args):  # type: ignore[no-untyped-def]
    return anyio.run(
        fn, *args, backend="asyncio", backend_options={"loop_factory": VirtualClockLoop}
    )


def test_anyio_runs_on_the_loop_and_an_hour_of_sleep_takes_no_wall_time() -> None:
    async def main() -> tuple[bool, float, float]:
        start = anyio.current_time()
        await anyio.sleep(3600)
        return isinstance(asyncio.get_running_loop(), VirtualClockLoop), start, anyio.current_time()

    wall = time.monotonic()
    on_loop, start, end = run(main)
    assert on_loop and start == 0.0
    assert end == pytest.approx(3600.0, abs=1e-9)
    assert time.monotonic() - wall < 5.0


def test_timers_fire_in_order_at_their_virtual_times() -> None:
    async def main() -> list[tuple[str, float]]:
        woke: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await anyio.sleep(seconds)
            woke.append((name, anyio.current_time()))

        async with anyio.create_task_group() as tg:
            for name, seconds in (("c", 3.0), ("a", 0.001), ("b", 2.5), ("d", 1e6)):
                tg.start_soon(sleeper, name, seconds)
        return woke

    woke = run(main)
    assert [name for name, _ in woke] == ["a", "b", "c", "d"]
    for (_, at), expected in zip(woke, (0.001, 2.5, 3.0, 1e6), strict=True):
        assert at == pytest.approx(expected, abs=1e-9)


def test_timeouts_expire_exactly_at_the_deadline() -> None:
    async def main() -> tuple[bool, float, float]:
        with anyio.move_on_after(5.0) as scope:
            await anyio.Event().wait()  # nothing else will ever set it
        moved_on = anyio.current_time()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.25):
                await anyio.sleep(10)
        return scope.cancelled_caught, moved_on, anyio.current_time()

    caught, moved_on, failed = run(main)
    assert caught
    assert moved_on == pytest.approx(5.0, abs=1e-9)
    assert failed == pytest.approx(5.25, abs=1e-9)


def test_with_no_timer_the_loop_waits_for_a_thread_and_the_clock_stands_still() -> None:
    async def main() -> tuple[str, float]:
        # real work in a thread: the loop must block on its selector until woken
        answer = await anyio.to_thread.run_sync(lambda: time.sleep(0.05) or "done")
        return answer, anyio.current_time()

    assert run(main) == ("done", 0.0)


def test_the_clock_never_goes_back() -> None:
    loop = VirtualClockLoop(start=10.0)
    try:
        assert loop.time() == 10.0
        loop.advance(0.5)
        assert loop.time() == 10.5
        with pytest.raises(ValueError):
            loop.advance(-1.0)
    finally:
        loop.close()
