"""Supervision: one-for-one, one-for-all, restart intensity and escalation, restart kinds."""

from __future__ import annotations

import functools

import anyio
import attrs
import pytest
from microagent.actors import (
    NORMAL,
    RESTART,
    SHUTDOWN,
    Actor,
    ActorFailed,
    ActorRef,
    Directive,
    EscalationError,
    OneForAll,
    OneForOne,
    RestartKind,
    Runtime,
    handles,
)

pytestmark = pytest.mark.anyio


@attrs.frozen
class Crash:
    pass


@attrs.frozen
class Quit:
    reason: str = NORMAL


@attrs.frozen
class Ping:
    pass


class Child(Actor):
    """Counts its starts in a shared log; crashes or stops itself on request."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def on_start(self) -> None:
        self.log.append(f"start {self.name}")

    async def on_stop(self, reason: object) -> None:
        shown = type(reason).__name__ if isinstance(reason, BaseException) else reason
        self.log.append(f"stop {self.name} {shown}")

    @handles(Crash)
    async def crash(self, m: Crash) -> None:
        raise ValueError(self.name)

    @handles(Quit)
    async def quit(self, m: Quit) -> None:
        self.stop(m.reason)

    @handles(Ping)
    async def ping(self, m: Ping) -> str:
        return self.name


class Parent(Actor):
    """Spawns children a, b, c on start (with the given restart kind); hands out refs."""

    def __init__(self, log: list[str], kind: RestartKind = RestartKind.PERMANENT) -> None:
        self.log = log
        self.kind = kind

    async def on_start(self) -> None:
        self.log.append("start parent")
        for name in ("a", "b", "c"):
            self.spawn(functools.partial(Child, self.log), name=name, restart=self.kind)

    async def on_stop(self, reason: object) -> None:
        self.log.append(f"stop parent {type(reason).__name__}")

    async def receive(self, message: object) -> dict[str, ActorRef]:
        return {ref.name: ref for ref in self.children}


async def crash(ref: ActorRef) -> None:
    with pytest.raises(ActorFailed):
        await ref.ask(Crash())


async def test_one_for_one_restarts_only_the_failed_child() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        parent = rt.spawn(functools.partial(Parent, log), supervision=OneForOne())
        kids = await parent.ask("kids")
        for kid in kids.values():  # every child has started
            await kid.ask(Ping())
        log.clear()
        await crash(kids["b"])
        assert await kids["b"].ask(Ping()) == "b"  # same ref, new incarnation
        assert log == ["stop b ValueError", "start b"]
        assert [kids[n].restarts for n in "abc"] == [0, 1, 0]
        (event,) = rt.supervision_log
        assert (event.supervisor, event.child, event.directive) == (
            parent.path,
            kids["b"].path,
            Directive.RESTART,
        )


async def test_one_for_all_restarts_every_sibling() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        parent = rt.spawn(functools.partial(Parent, log), supervision=OneForAll())
        kids = await parent.ask("kids")
        for kid in kids.values():  # every child has started
            await kid.ask(Ping())
        log.clear()
        await crash(kids["b"])
        for name in "abc":
            assert await kids[name].ask(Ping()) == name
        assert [kids[n].restarts for n in "abc"] == [1, 1, 1]
        assert sorted(log) == sorted(
            [
                "stop b ValueError",
                "start b",
                f"stop a {RESTART}",
                "start a",
                f"stop c {RESTART}",
                "start c",
            ]
        )
        assert [e.directive for e in rt.supervision_log] == [
            Directive.RESTART
        ]  # one restart counted


async def test_intensity_exceeded_escalates_to_the_parent() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        parent = rt.spawn(
            functools.partial(Parent, log), supervision=OneForOne(max_restarts=2, within=60)
        )
        kids = await parent.ask("kids")
        for _ in range(2):
            await crash(kids["a"])
        assert kids["a"].is_alive
        await crash(kids["a"])  # the third failure within the window
        await kids["a"].join()
        assert isinstance(kids["a"].stop_reason, ValueError)
        # the parent failed with EscalationError; its supervisor (the root) restarted it
        while parent.restarts == 0:
            await anyio.lowlevel.checkpoint()
        directives = [(e.supervisor, e.directive) for e in rt.supervision_log]
        assert directives == [
            (parent.path, Directive.RESTART),
            (parent.path, Directive.RESTART),
            (parent.path, Directive.ESCALATE),
            ("/", Directive.RESTART),
        ]
        escalation = rt.supervision_log[-1].reason
        assert isinstance(escalation, EscalationError)
        assert escalation.child == kids["a"].path and isinstance(escalation.cause, ValueError)
        assert escalation.restarts == 2
        assert "stop parent EscalationError" in log
        # the old children were stopped; the new incarnation made new ones
        assert not kids["b"].is_alive and kids["b"].stop_reason == SHUTDOWN
        fresh = await parent.ask("kids")
        assert fresh["a"] is not kids["a"] and await fresh["a"].ask(Ping()) == "a"


async def test_restarts_outside_the_window_do_not_accumulate() -> None:
    async with Runtime() as rt:
        parent = rt.spawn(
            functools.partial(Parent, []), supervision=OneForOne(max_restarts=1, within=0.05)
        )
        kids = await parent.ask("kids")
        await crash(kids["a"])
        await anyio.sleep(0.1)  # let the window slide past the first restart
        await crash(kids["a"])
        assert kids["a"].is_alive and kids["a"].restarts == 2
        assert parent.restarts == 0


async def test_escalation_at_a_scope_raises_to_its_owner() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        with pytest.raises(EscalationError) as info:
            async with rt.scope(supervision=OneForOne(max_restarts=0, within=1)) as scope:
                ref = scope.spawn(functools.partial(Child, log), name="x")
                other = scope.spawn(functools.partial(Child, log), name="y")
                await ref.tell(Crash())
                await anyio.sleep_forever()  # cancelled by the escalation
        assert info.value.supervisor == scope.path and info.value.child == ref.path
        assert scope.failure is info.value
        assert not other.is_alive and scope.live_actors() == []


async def test_escalation_at_the_root_fails_the_runtime() -> None:
    with pytest.raises(EscalationError) as info:
        async with Runtime(supervision=OneForOne(max_restarts=1, within=60)) as rt:
            ref = rt.spawn(functools.partial(Child, []))
            await crash(ref)
            await ref.tell(Crash())
            await anyio.sleep_forever()
    assert info.value.supervisor == "/"
    assert rt.failure is info.value


@pytest.mark.parametrize(
    ("kind", "crash_restarts", "normal_restarts", "abnormal_restarts"),
    [
        (RestartKind.PERMANENT, True, True, True),
        (RestartKind.TRANSIENT, True, False, True),
        (RestartKind.TEMPORARY, False, False, False),
    ],
)
async def test_restart_kinds(
    kind: RestartKind, crash_restarts: bool, normal_restarts: bool, abnormal_restarts: bool
) -> None:
    async def restarted(message: object) -> bool:
        async with Runtime(supervision=OneForOne(max_restarts=10, within=60)) as rt:
            ref = rt.spawn(functools.partial(Child, []), restart=kind)
            await ref.tell(message)
            while ref.is_alive and ref.restarts == 0:
                await anyio.lowlevel.checkpoint()
            return ref.is_alive

    assert await restarted(Crash()) is crash_restarts
    assert await restarted(Quit(NORMAL)) is normal_restarts
    assert await restarted(Quit("broken")) is abnormal_restarts


async def test_temporary_failure_is_reported_not_swallowed() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(functools.partial(Child, []), restart=RestartKind.TEMPORARY)
        await crash(ref)
        assert isinstance(await ref.join(), ValueError)
        (event,) = rt.supervision_log
        assert event.directive is Directive.STOP and isinstance(event.reason, ValueError)


async def test_explicit_stop_never_restarts_a_permanent_child() -> None:
    async with Runtime() as rt:
        ref = rt.spawn(functools.partial(Child, []), restart=RestartKind.PERMANENT)
        assert await ref.stop() == NORMAL
        assert not ref.is_alive and ref.restarts == 0 and rt.supervision_log == []


async def test_failing_factory_and_on_start_are_supervised() -> None:
    attempts: list[int] = []

    class Flaky(Actor):
        async def on_start(self) -> None:
            attempts.append(1)
            if len(attempts) < 3:
                raise OSError("not yet")

        async def receive(self, message: object) -> str:
            return "up"

    def broken() -> Actor:
        raise LookupError("no behaviour")

    async with Runtime(supervision=OneForOne(max_restarts=5, within=60)) as rt:
        assert await rt.spawn(Flaky).ask("?") == "up"
        assert len(attempts) == 3
        with pytest.raises(EscalationError):
            async with rt.scope(supervision=OneForOne(max_restarts=2, within=60)) as scope:
                scope.spawn(broken)
                await anyio.sleep_forever()
