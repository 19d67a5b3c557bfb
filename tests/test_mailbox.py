"""Mailbox: FIFO, bounds, overflow policies, closing into dead letters, statistics."""

from __future__ import annotations

import functools
import itertools
from collections import deque
from typing import Any

import anyio
import pytest
from _virtual_asyncio import VIRTUAL_BACKENDS, run_on_virtual_clock
from hypothesis import event, given, settings
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
from strategies import concurrent_sends, take_pause

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


# -- several concurrent senders, generated interleavings on virtual time ------------------


async def _concurrent_sends(plan: dict[str, Any]) -> None:
    """Senders and one consumer run concurrently; then every envelope's fate is checked."""
    capacity, policy = plan["capacity"], OverflowPolicy(plan["policy"])
    close = plan["close"]
    sink = DeadLetters(keep=None)
    box = Mailbox(capacity, policy, owner="/box", dead_letters=sink)
    arrival: dict[tuple[int, int], int] = {}  # message -> order in which its put was called
    outcome: dict[tuple[int, int], str] = {}  # what its sender saw
    closed_at: list[int] = []  # len(arrival) when the mailbox closed
    delivered: list[tuple[int, int]] = []
    depths: list[int] = []
    blocked: list[int] = []
    senders_done = anyio.Event()
    running = len(plan["senders"])

    async def sender(i: int, pauses: list[tuple[int, float]]) -> None:
        nonlocal running
        for seq, pause in enumerate(pauses):
            await take_pause(pause)
            message = (i, seq)
            arrival[message] = len(arrival)
            try:
                outcome[message] = "enqueued" if await box.put(env(message)) else "dropped"
            except MailboxFull:
                outcome[message] = "full"
            if outcome[message] != "enqueued" and not box.closed:
                # refused only when there was no room (the put did not wait)
                assert box.stats().depth == capacity, (message, box.stats())
            depths.append(box.stats().depth)
        running -= 1
        if not running:
            senders_done.set()

    async def consumer() -> None:
        for n in itertools.count():
            try:
                envelope = await box.get()
            except MailboxClosed:
                return
            delivered.append(envelope.message)  # type: ignore[arg-type]
            depths.append(box.stats().depth)
            blocked.append(box.stats().blocked_senders)
            await take_pause(plan["consumer"][n % len(plan["consumer"])])

    async def closer() -> None:
        if close is not None:
            await anyio.sleep(close[0])
            closed_at.append(len(arrival))
            box.close(drain=close[1])
        await senders_done.wait()
        if not box.closed:
            closed_at.append(len(arrival))
            box.close(drain=True)  # let the consumer take the rest, then end

    with anyio.fail_after(3600):  # virtual: a deadlock fails at once instead of hanging
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            for i, pauses in enumerate(plan["senders"]):
                tg.start_soon(sender, i, pauses)
            tg.start_soon(closer)

    sent = set(arrival)
    assert sent == {(i, s) for i, p in enumerate(plan["senders"]) for s in range(len(p))}
    dead = {letter.message: letter.reason for letter in sink}
    # nothing lost, nothing duplicated: each message delivered once or dead-lettered once
    assert len(delivered) == len(set(delivered)) and len(dead) == len(sink) == sink.total
    assert set(delivered) | set(dead) == sent and not set(delivered) & set(dead)
    # FIFO per sender, and across senders in the order their puts were called
    assert [arrival[m] for m in delivered] == sorted(arrival[m] for m in delivered)
    # the reason a message was dead-lettered fits what its sender saw and when
    r = DeadLetterReason
    for message, reason in dead.items():
        seen = outcome[message]
        if reason is r.REJECTED:
            assert policy is OverflowPolicy.FAIL and seen == "full"
        elif reason is r.OVERFLOW:
            assert policy is OverflowPolicy.DEAD_LETTER and seen == "dropped"
        elif reason is r.RECIPIENT_STOPPED:  # sent after the close
            assert seen == "dropped" and arrival[message] >= closed_at[0]
        else:  # buffered, or its sender blocked, when the mailbox closed without draining
            assert reason is r.MAILBOX_CLOSED and close is not None and not close[1]
            assert seen in ("enqueued", "dropped") and arrival[message] < closed_at[0]
    for message, seen in outcome.items():
        assert (message in dead) == (seen != "enqueued" or dead.get(message) is r.MAILBOX_CLOSED)
    if policy is OverflowPolicy.BLOCK and close is None:
        assert not dead  # back-pressure only: every sender waited its turn
    # bounded: depth never above capacity; every counter agrees
    stats = box.stats()
    assert max(depths, default=0) <= stats.high_water <= capacity
    assert stats.depth == 0 and stats.blocked_senders == 0 and stats.closed
    assert stats.delivered == len(delivered) and stats.dead_lettered == len(dead)
    accepted = sum(seen == "enqueued" for seen in outcome.values())
    assert stats.enqueued == accepted
    event(f"most senders blocked at once: {max(blocked, default=0)}")
    event(f"dead-letter reasons: {sorted({reason.value for reason in dead.values()})}")


@pytest.mark.parametrize("backend", VIRTUAL_BACKENDS)
@settings(max_examples=80, deadline=None)
@given(plan=concurrent_sends)
def test_concurrent_senders_keep_fifo_and_lose_nothing(backend: str, plan: dict[str, Any]) -> None:
    """Several sender tasks, one consumer, generated pauses, every policy, maybe a close."""
    run_on_virtual_clock(functools.partial(_concurrent_sends, plan), backend)
