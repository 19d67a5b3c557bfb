"""Mailbox: FIFO, bounds, overflow policies, closing into dead letters, statistics."""

from __future__ import annotations

from collections import deque

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.mailbox import (
    DeadLetter,
    DeadLetterReason,
    DeadLetters,
    Envelope,
    Mailbox,
    MailboxClosed,
    MailboxFull,
    OverflowPolicy,
    ReplySlot,
    Undeliverable,
)

pytestmark = pytest.mark.anyio


def env(message: object, reply: ReplySlot | None = None) -> Envelope:
    return Envelope(message, None, reply)


async def test_fifo_and_stats() -> None:
    box = Mailbox(4, owner="/a")
    for i in range(3):
        assert await box.put(env(i))
    assert [(await box.get()).message for _ in range(3)] == [0, 1, 2]
    stats = box.stats()
    assert (stats.depth, stats.high_water, stats.enqueued, stats.delivered) == (0, 3, 3, 3)
    assert stats.capacity == 4 and not stats.closed and stats.dead_lettered == 0


async def test_block_policy_waits_for_room_in_arrival_order() -> None:
    box = Mailbox(1, OverflowPolicy.BLOCK, owner="/a")
    await box.put(env("first"))
    order: list[str] = []

    async def sender(name: str, started: anyio.Event) -> None:
        started.set()
        await box.put(env(name))
        order.append(name)

    async with anyio.create_task_group() as tg:
        for name in ("b", "c"):
            started = anyio.Event()
            tg.start_soon(sender, name, started)
            await started.wait()
            await anyio.lowlevel.checkpoint()
        assert box.stats().blocked_senders == 2
        assert box.stats().depth == 1
        got = [(await box.get()).message for _ in range(3)]
    assert got == ["first", "b", "c"]
    assert sorted(order) == ["b", "c"]  # both returned (wake-up order is the scheduler's)
    assert box.stats().high_water == 1


async def test_fail_policy_raises_and_dead_letters() -> None:
    sink = DeadLetters()
    box = Mailbox(1, OverflowPolicy.FAIL, owner="/a", dead_letters=sink)
    await box.put(env(1))
    with pytest.raises(MailboxFull) as info:
        await box.put(env(2))
    assert (info.value.actor, info.value.capacity) == ("/a", 1)
    assert [(d.message, d.reason, d.recipient) for d in sink] == [
        (2, DeadLetterReason.REJECTED, "/a")
    ]
    assert box.stats().dead_lettered == 1


async def test_dead_letter_policy_routes_overflow() -> None:
    sink = DeadLetters()
    box = Mailbox(2, OverflowPolicy.DEAD_LETTER, owner="/a", dead_letters=sink)
    results = [await box.put(env(i)) for i in range(4)]
    assert results == [True, True, False, False]
    assert [d.message for d in sink] == [2, 3]
    assert sink.counts() == {DeadLetterReason.OVERFLOW: 2}
    assert box.stats().depth == 2


async def test_close_drains_buffered_and_blocked_into_dead_letters() -> None:
    sink = DeadLetters()
    box = Mailbox(1, owner="/a", dead_letters=sink)
    slot = ReplySlot()
    await box.put(env("buffered", slot))
    blocked_result: list[bool] = []

    async def blocked() -> None:
        blocked_result.append(await box.put(env("blocked")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(blocked)
        while box.stats().blocked_senders == 0:
            await anyio.lowlevel.checkpoint()
        box.close()
    assert blocked_result == [False]
    assert [(d.message, d.reason) for d in sink] == [
        ("buffered", DeadLetterReason.MAILBOX_CLOSED),
        ("blocked", DeadLetterReason.MAILBOX_CLOSED),
    ]
    # the ask inside the buffered envelope fails at once instead of timing out
    with pytest.raises(Undeliverable) as info:
        await slot.wait()
    assert info.value.reason == "mailbox_closed"
    with pytest.raises(MailboxClosed):
        await box.get()
    assert not await box.put(env("late"))
    assert sink.records[-1].reason is DeadLetterReason.RECIPIENT_STOPPED
    assert box.stats().dead_lettered == 3


async def test_drain_close_lets_the_consumer_finish() -> None:
    box = Mailbox(4, owner="/a")
    for i in range(2):
        await box.put(env(i))
    box.close(drain=True)
    assert not await box.put(env("refused"))
    assert [(await box.get()).message for _ in range(2)] == [0, 1]
    with pytest.raises(MailboxClosed):
        box.get_nowait()


async def test_close_wakes_a_waiting_consumer() -> None:
    box = Mailbox(1, owner="/a")
    async with anyio.create_task_group() as tg:

        async def consume() -> None:
            with pytest.raises(MailboxClosed):
                await box.get()

        tg.start_soon(consume)
        await anyio.lowlevel.checkpoint()
        box.close()


async def test_system_messages_bypass_the_bound_in_fifo_order() -> None:
    box = Mailbox(1, OverflowPolicy.FAIL, owner="/a")
    await box.put(env("user"))
    assert box.put_system(env("system"))
    assert box.stats().depth == 1
    assert [box.get_nowait().message for _ in range(2)] == ["user", "system"]


async def test_cancelled_blocked_sender_sent_nothing() -> None:
    box = Mailbox(1, owner="/a")
    await box.put(env(0))
    with anyio.move_on_after(0.01):
        await box.put(env(1))
    assert box.stats().blocked_senders == 0
    assert box.get_nowait().message == 0
    with pytest.raises(anyio.WouldBlock):
        box.get_nowait()


async def test_dead_letter_subscriptions_and_callbacks() -> None:
    sink = DeadLetters(keep=2)
    seen: list[DeadLetter] = []
    unsubscribe = sink.on_letter(seen.append)
    async with sink.subscribe(max_buffer=1) as letters:
        for i in range(3):
            sink.publish(env(i), "/x", DeadLetterReason.OVERFLOW)
        unsubscribe()
        sink.publish(env(3), "/x", DeadLetterReason.OVERFLOW)
        letters.close()
        streamed = [letter.message async for letter in letters]
    assert streamed == [0]
    assert letters.missed == 3  # the buffer held one letter
    assert [d.message for d in seen] == [0, 1, 2]
    assert [d.message for d in sink.records] == [2, 3]  # keeps the 2 latest
    assert sink.total == 4 and len(sink) == 2


async def test_reply_slot_once_and_abandon() -> None:
    slot = ReplySlot()
    assert slot.open
    assert slot.resolve(1)
    assert not slot.resolve(2) and not slot.fail(ValueError())
    assert await slot.wait() == 1
    assert slot.outcome() == (True, 1)
    late = ReplySlot()
    late.abandon()
    assert not late.open and not late.resolve(3) and not late.done
    with pytest.raises(ValueError):
        late.outcome()


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Mailbox(0)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 4),
    policy=st.sampled_from([OverflowPolicy.FAIL, OverflowPolicy.DEAD_LETTER]),
    ops=st.lists(st.sampled_from(["put", "put", "get", "system"]), max_size=40),
)
def test_model_of_non_blocking_operations(
    capacity: int, policy: OverflowPolicy, ops: list[str]
) -> None:
    """Against a deque model: FIFO, depth <= capacity, every put accounted for."""

    async def run() -> None:
        sink = DeadLetters()
        box = Mailbox(capacity, policy, owner="/m", dead_letters=sink)
        model: deque[int] = deque()
        user = 0
        for n, op in enumerate(ops):
            if op == "put":
                full = user >= capacity
                if full and policy is OverflowPolicy.FAIL:
                    with pytest.raises(MailboxFull):
                        box.put_nowait(env(n))
                else:
                    assert box.put_nowait(env(n)) is not full
                if not full:
                    model.append(n)
                    user += 1
            elif op == "system":
                box.put_system(env(-n - 1))
                model.append(-n - 1)
            elif model:
                got = box.get_nowait().message
                assert got == model.popleft()
                user -= isinstance(got, int) and got >= 0
            else:
                with pytest.raises(anyio.WouldBlock):
                    box.get_nowait()
            stats = box.stats()
            assert stats.depth == user <= capacity
            assert len(box) == len(model)
        puts = ops.count("put")
        assert box.stats().enqueued == puts - sink.total + ops.count("system")

    anyio.run(run)
