"""Actors: dispatch, tell/ask, replies, ask timeouts, death watch, stop, scopes and the engine."""

from __future__ import annotations

import functools

import anyio
import attrs
import pytest
from microagent.actors import (
    CANCELLED,
    NORMAL,
    SHUTDOWN,
    Actor,
    ActorFailed,
    ActorNameTaken,
    ActorRef,
    ActorStopped,
    AskTimeout,
    Reply,
    Runtime,
    RuntimeNotRunning,
    Terminated,
    UnhandledMessage,
    handles,
)
from microagent.engine_bridge import Sampling
from microagent.mailbox import DeadLetterReason, MailboxFull, OverflowPolicy, Undeliverable
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


@attrs.frozen
class Add:
    n: int


@attrs.frozen
class Get:
    pass


@attrs.frozen
class Hang:
    release: anyio.Event | None = None


@attrs.frozen
class Fail:
    pass


class Counter(Actor):
    """Adds numbers; answers Get; hangs on Hang until released."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.total = 0
        self.log = log if log is not None else []

    async def on_start(self) -> None:
        self.log.append(f"start {self.name}")

    async def on_stop(self, reason: object) -> None:
        self.log.append(f"stop {self.name} {reason}")

    @handles(Add)
    async def add(self, m: Add) -> int:
        self.total += m.n
        return self.total

    @handles(Get)
    async def get(self, m: Get) -> int:
        return self.total

    @handles(Hang)
    async def hang(self, m: Hang) -> str:
        if m.release is None:
            await anyio.sleep_forever()
        else:
            await m.release.wait()
        return "released"

    @handles(Fail)
    async def fail(self, m: Fail) -> None:
        raise KeyError("bad")


async def test_tell_then_ask_in_order() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter, name="c")
        for i in range(10):
            await ref.tell(Add(i))
        assert await ref.ask(Get()) == 45
        assert ref.name == "c" and ref.path == "/c" and ref.is_alive
        assert rt.lookup("/c") is ref
        assert ref.mailbox_stats().delivered == 11


async def test_dispatch_by_class_mro_and_match_style_receive() -> None:
    class Base:
        pass

    class Child(Base):
        pass

    class Typed(Actor):
        @handles(Base)
        async def base(self, m: Base) -> str:
            return type(m).__name__

        @handles(int, str)
        async def scalar(self, m: object) -> str:
            return f"scalar {m}"

    class Matching(Actor):
        async def receive(self, message: object) -> object:
            match message:
                case int(n):
                    return n * 2
                case _:
                    return await self.unhandled(message)

    async with Runtime() as rt:
        typed = rt.spawn(Typed)
        assert await typed.ask(Child()) == "Child"
        assert await typed.ask(3) == "scalar 3"
        assert await typed.ask("x") == "scalar x"
        matching = rt.spawn(Matching)
        assert await matching.ask(21) == 42
        with pytest.raises(ActorFailed) as info:
            await matching.ask("?")
        assert isinstance(info.value.cause, UnhandledMessage)


async def test_ask_failure_carries_the_cause_and_reaches_the_supervisor() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter)
        await ref.tell(Add(5))
        with pytest.raises(ActorFailed) as info:
            await ref.ask(Fail())
        assert isinstance(info.value.cause, KeyError)
        assert info.value.__cause__ is info.value.cause
        assert info.value.actor == ref.path
        # the failure was not swallowed: the supervisor restarted the actor (fresh state)
        assert await ref.ask(Get()) == 0
        assert ref.restarts == 1
        (event,) = rt.supervision_log
        assert isinstance(event.reason, KeyError) and event.child == ref.path


async def test_ask_timeout_and_late_reply_goes_to_dead_letters() -> None:
    release = anyio.Event()
    async with Runtime() as rt:
        ref = rt.spawn(Counter)
        with pytest.raises(AskTimeout) as info:
            await ref.ask(Hang(release), timeout=0.05)
        assert info.value.timeout == 0.05 and info.value.message_type == "Hang"
        release.set()
        assert await ref.ask(Get()) == 0  # the late answer was produced by now
        (late,) = rt.dead_letters.records
        assert late.reason is DeadLetterReason.LATE_REPLY
        assert late.message == "released"


async def test_default_ask_timeout_and_expired_requests_are_skipped() -> None:
    async with Runtime(ask_timeout=0.05) as rt:
        ref = rt.spawn(Counter, capacity=4)
        release = anyio.Event()
        await ref.tell(Hang(release))
        with pytest.raises(AskTimeout):
            await ref.ask(Add(1))  # queued behind Hang; the asker gives up
        release.set()
        assert await ref.ask(Get(), timeout=5) == 0  # Add(1) was never handled
        (expired,) = rt.dead_letters.records
        assert expired.reason is DeadLetterReason.EXPIRED and expired.message == Add(1)


async def test_ask_stopped_actor_raises_actor_stopped() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter)
        assert await ref.stop() == NORMAL
        with pytest.raises(ActorStopped):
            await ref.ask(Get())
        await ref.tell(Add(1))
        assert [d.reason for d in rt.dead_letters] == [DeadLetterReason.RECIPIENT_STOPPED] * 2


async def test_stop_cancels_the_handler_and_fails_its_ask() -> None:
    log: list[str] = []
    async with Runtime() as rt, anyio.create_task_group() as tg:
        ref = rt.spawn(functools.partial(Counter, log), name="c")
        outcome: list[BaseException] = []

        async def asker() -> None:
            try:
                await ref.ask(Hang())
            except ActorStopped as exc:
                outcome.append(exc)

        tg.start_soon(asker)
        while ref.mailbox_stats().delivered == 0:
            await anyio.lowlevel.checkpoint()
        await ref.tell(Add(1))  # buffered: dead-lettered by the stop
        assert await ref.stop("done") == "done"
    assert isinstance(outcome[0], ActorStopped) and outcome[0].stop_reason == "done"
    assert log == ["start c", "stop c done"]
    assert [d.reason for d in rt.dead_letters] == [DeadLetterReason.MAILBOX_CLOSED]


async def test_stop_with_drain_handles_what_is_queued() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter, capacity=10)
        release = anyio.Event()
        await ref.tell(Hang(release))
        for _ in range(3):
            await ref.tell(Add(1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(ref.stop, drain=True))
            while not ref.mailbox_stats().closed:
                await anyio.lowlevel.checkpoint()
            await ref.tell(Add(100))  # refused: the mailbox no longer takes input
            release.set()
        assert ref.mailbox_stats().delivered == 4
        assert [d.message for d in rt.dead_letters] == [Add(100)]


async def test_reply_and_defer() -> None:
    @attrs.frozen
    class Later:
        pass

    @attrs.frozen
    class Now:
        pass

    class Replier(Actor):
        def __init__(self) -> None:
            self.pending: list[Reply] = []

        @handles(Later)
        async def later(self, m: Later) -> None:
            self.pending.append(self.defer())

        @handles(Now)
        async def now(self, m: Now) -> str:
            assert self.reply("early")
            for reply in self.pending:
                assert reply.pending
                reply.send("deferred")
            return "ignored"

        @handles(Add)
        async def wrong(self, m: Add) -> None:
            self.reply(1)

    async with Runtime() as rt, anyio.create_task_group() as tg:
        ref = rt.spawn(Replier)
        got: list[str] = []

        async def ask_later() -> None:
            got.append(await ref.ask(Later()))

        tg.start_soon(ask_later)
        while ref.mailbox_stats().delivered == 0:
            await anyio.lowlevel.checkpoint()
        assert await ref.ask(Now()) == "early"
    assert got == ["deferred"]
    async with Runtime() as rt:
        ref = rt.spawn(Replier)
        await ref.tell(Add(1))  # reply() outside an ask is a failure of the actor
        await ref.ask(Now())
        assert isinstance(rt.supervision_log[0].reason, RuntimeError)


async def test_deferred_reply_fails_when_the_actor_stops() -> None:
    class Keeper(Actor):
        async def receive(self, message: object) -> None:
            self.defer()

    async with Runtime() as rt, anyio.create_task_group() as tg:
        ref = rt.spawn(Keeper)
        errors: list[BaseException] = []

        async def ask() -> None:
            try:
                await ref.ask("x")
            except ActorStopped as exc:
                errors.append(exc)

        tg.start_soon(ask)
        while ref.mailbox_stats().delivered == 0:
            await anyio.lowlevel.checkpoint()
        await ref.stop()
    assert len(errors) == 1


async def test_an_actor_cannot_ask_itself() -> None:
    class Selfish(Actor):
        async def receive(self, message: object) -> object:
            return await self.ref.ask("again")

    async with Runtime() as rt:
        with pytest.raises(ActorFailed) as info:
            await rt.spawn(Selfish).ask("go")
        assert isinstance(info.value.cause, RuntimeError)


async def test_overflow_policies_through_refs() -> None:
    async with Runtime() as rt:
        release = anyio.Event()
        failing = rt.spawn(Counter, capacity=1, overflow=OverflowPolicy.FAIL)
        dropping = rt.spawn(Counter, capacity=1, overflow=OverflowPolicy.DEAD_LETTER)
        for ref in (failing, dropping):
            await ref.tell(Hang(release))
            while ref.mailbox_stats().delivered == 0:
                await anyio.lowlevel.checkpoint()
            await ref.tell(Add(1))  # fills the mailbox
        with pytest.raises(MailboxFull) as info:
            await failing.tell(Add(2))
        assert info.value.capacity == 1 and info.value.actor == failing.path
        with pytest.raises(MailboxFull):
            await failing.ask(Get())
        await dropping.tell(Add(2))
        with pytest.raises(Undeliverable) as dropped:
            await dropping.ask(Get())
        assert dropped.value.reason == "overflow"
        blocker = rt.spawn(Counter, capacity=1)
        blocker.tell_nowait(Hang(release))
        while blocker.mailbox_stats().delivered == 0:
            await anyio.lowlevel.checkpoint()
        blocker.tell_nowait(Add(1))
        with pytest.raises(anyio.WouldBlock):  # BLOCK policy, from synchronous code
            blocker.tell_nowait(Add(2))
        release.set()
        while failing.mailbox_stats().depth:
            await anyio.lowlevel.checkpoint()
        assert await failing.ask(Get()) == 1
        reasons = [d.reason for d in rt.dead_letters]
        assert reasons.count(DeadLetterReason.REJECTED) == 2
        assert reasons.count(DeadLetterReason.OVERFLOW) == 2


async def test_block_policy_applies_back_pressure() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter, capacity=2)
        release = anyio.Event()
        await ref.tell(Hang(release))
        while ref.mailbox_stats().delivered == 0:
            await anyio.lowlevel.checkpoint()
        await ref.tell(Add(1))
        await ref.tell(Add(2))
        with anyio.move_on_after(0.05) as blocked:
            await ref.tell(Add(3))
        assert blocked.cancelled_caught
        release.set()
        await ref.tell(Add(4))
        assert await ref.ask(Get()) == 7
        assert ref.mailbox_stats().high_water == 2


async def test_death_watch_live_and_already_dead() -> None:
    @attrs.frozen
    class Watch:
        ref: ActorRef

    class Watcher(Actor):
        def __init__(self, seen: list[tuple[str, object]]) -> None:
            self.seen = seen

        @handles(Watch)
        async def watch_it(self, m: Watch) -> None:
            self.watch(m.ref)

        @handles(Terminated)
        async def terminated(self, m: Terminated) -> None:
            self.seen.append((m.ref.name, m.reason))

    seen: list[tuple[str, object]] = []
    async with Runtime() as rt:
        watcher = rt.spawn(functools.partial(Watcher, seen))
        alive = rt.spawn(Counter, name="alive")
        dead = rt.spawn(Counter, name="dead")
        await dead.stop("gone")
        await watcher.ask(Watch(alive))
        await watcher.ask(Watch(dead))  # already dead: notified at once
        await alive.stop()
        while len(seen) < 2:
            await anyio.lowlevel.checkpoint()
    assert seen == [("dead", "gone"), ("alive", NORMAL)]


async def test_unhandled_terminated_is_a_failure_like_a_death_pact() -> None:
    class Careless(Actor):
        @handles(ActorRef)
        async def watch_it(self, message: ActorRef) -> None:
            self.watch(message)

    async with Runtime() as rt:
        watcher = rt.spawn(Careless)
        target = rt.spawn(Counter)
        await watcher.tell(target)
        await target.stop()
        while watcher.restarts == 0:
            await anyio.lowlevel.checkpoint()
        assert isinstance(rt.supervision_log[-1].reason, UnhandledMessage)


async def test_children_tree_and_names() -> None:
    class Parent(Actor):
        async def on_start(self) -> None:
            self.spawn(Counter, name="kid")

        async def receive(self, message: object) -> list[str]:
            return [c.path for c in self.children]

    async with Runtime() as rt:
        parent = rt.spawn(Parent, name="p")
        assert await parent.ask("children") == ["/p/kid"]
        kid = rt.lookup("/p/kid")
        assert kid is not None and await kid.ask(Add(2)) == 2
        with pytest.raises(ActorNameTaken):
            rt.spawn(Counter, name="p")
        with pytest.raises(ValueError):
            rt.spawn(Counter, name="a/b")
        await parent.stop()
        assert not kid.is_alive and kid.stop_reason == SHUTDOWN
    with pytest.raises(RuntimeNotRunning):
        rt.spawn(Counter)


async def test_runtime_exit_drains_mailboxes() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(Counter, capacity=100)
        for _ in range(50):
            await ref.tell(Add(1))
    assert ref.mailbox_stats().delivered == 50
    assert not ref.is_alive and rt.dead_letters.total == 0


async def test_scope_exit_stops_its_actors_and_fails_asks() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        outside = rt.spawn(Counter)
        errors: list[BaseException] = []
        # the asker lives outside the scope
        async with anyio.create_task_group() as tg, rt.scope("collab") as scope:
            ref = scope.spawn(functools.partial(Counter, log), name="voter")
            assert ref.path == "/collab/voter"

            async def ask() -> None:
                try:
                    await ref.ask(Hang())
                except ActorStopped as exc:
                    errors.append(exc)

            tg.start_soon(ask)
            while ref.mailbox_stats().delivered == 0:
                await anyio.lowlevel.checkpoint()
            scope.cancel()
        assert scope.cancelled_caught
        assert scope.live_actors() == [] and not ref.is_alive
        assert ref.stop_reason == CANCELLED
        assert log == ["start voter", f"stop voter {CANCELLED}"]
        assert len(errors) == 1
        assert outside.is_alive  # other actors are untouched
        with pytest.raises(RuntimeNotRunning):
            scope.spawn(Counter)


async def test_scope_propagates_the_body_exception_unchanged() -> None:
    async with Runtime() as rt:
        with pytest.raises(ZeroDivisionError):
            async with rt.scope() as scope:
                ref = scope.spawn(Counter)
                _ = 1 / 0
        assert not ref.is_alive


async def test_on_stop_failures_are_reported() -> None:
    class Messy(Actor):
        async def on_stop(self, reason: object) -> None:
            raise OSError("cleanup failed")

    async with Runtime() as rt:
        await rt.spawn(Messy).stop()
        (failure,) = rt.cleanup_failures
        assert isinstance(failure.cause, OSError)


class Generator(Actor):
    """Streams a long generation from the engine when told to."""

    def __init__(
        self, started: list[str], all_started: anyio.Event | None = None, n: int = 1
    ) -> None:
        self.started = started
        self.all_started = all_started
        self.n = n

    async def receive(self, message: object) -> None:
        engine = self.require_engine()
        prompt = engine.handle(engine.tokenize("the plan is"))
        async with engine.stream(prompt, Sampling(max_tokens=10_000)) as gen:
            self.started.append(gen.request_id)
            if self.all_started is not None and len(self.started) == self.n:
                self.all_started.set()
            async for _ in gen:
                pass


async def test_cancelling_a_scope_aborts_engine_requests() -> None:
    engine = ScriptedEngine(decode_time_per_token=0.01)
    started: list[str] = []
    async with engine, Runtime(engine=engine) as rt:
        with anyio.move_on_after(10):  # a request-level timeout around a collaboration
            async with rt.scope() as scope:
                all_started = anyio.Event()
                factory = functools.partial(Generator, started, all_started, 3)
                refs = [scope.spawn(factory) for _ in range(3)]
                for ref in refs:
                    await ref.tell("go")
                await all_started.wait()
                assert len(engine.live_requests()) == 3
                scope.cancel()
        assert len(started) == 3
        assert engine.live_requests() == frozenset()
        assert engine.stats().requests_aborted == 3
        assert all(not ref.is_alive for ref in refs)


async def test_outer_timeout_cancels_scope_actors_and_engine_requests() -> None:
    engine = ScriptedEngine(decode_time_per_token=0.01)
    started: list[str] = []
    async with engine, Runtime(engine=engine) as rt:
        with anyio.move_on_after(0.2) as timeout:
            async with rt.scope() as scope:
                ref = scope.spawn(functools.partial(Generator, started))
                await ref.tell("go")
                await anyio.sleep_forever()
        assert timeout.cancelled_caught
        assert started and engine.live_requests() == frozenset()
        assert ref.stop_reason == CANCELLED


async def test_actor_engine_is_none_without_one() -> None:
    class Probe(Actor):
        async def receive(self, message: object) -> object:
            assert self.engine is None
            return self.require_engine()

    async with Runtime() as rt:
        with pytest.raises(ActorFailed) as info:
            await rt.spawn(Probe).ask("?")
        assert isinstance(info.value.cause, RuntimeError)


def test_context_is_unavailable_before_start() -> None:
    with pytest.raises(RuntimeError):
        _ = Counter().ref
