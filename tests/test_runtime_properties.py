"""Stateful property tests of the actor runtime (issue 3, acceptance 1).

Hypothesis generates a whole *program* of operations (spawn, tell, ask, crash,
stop, generate on the ScriptedEngine, open/close/cancel a scope, advance time,
a burst of concurrent sender tasks) as data; the program then runs inside ONE
``trio.run`` with ``MockClock(autojump_threshold=0)`` (deterministic, no wall
time), and again on asyncio with the same virtual time
(``tests/_virtual_asyncio.py``: the loop jumps to its next timer when idle), so
timeouts, restart windows and deadlines are exact on both. Invariants are
checked after every operation and at the end. A second property sends from
several concurrent tasks into one actor and accounts for every message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import Counter, defaultdict
from typing import Any

import anyio
import attrs
import pytest
import trio
import trio.testing
from _virtual_asyncio import VIRTUAL_BACKENDS, VirtualClockLoop, run_on_virtual_clock
from hypothesis import HealthCheck, event, given, settings
from microagent.actors import (
    Actor,
    ActorFailed,
    ActorRef,
    ActorScope,
    ActorStopped,
    AskTimeout,
    Directive,
    EscalationError,
    OneForAll,
    OneForOne,
    RestartKind,
    Runtime,
    RuntimeNotRunning,
    SupervisionStrategy,
    handles,
)
from microagent.engine_bridge import Sampling
from microagent.mailbox import (
    DeadLetter,
    DeadLetterReason,
    MailboxFull,
    OverflowPolicy,
    Undeliverable,
)
from microagent.testing import ScriptedEngine
from strategies import actor_programs, concurrent_sends, take_pause

ROOT_STRATEGY = OneForOne(max_restarts=10_000, within=1.0)
CHILD_MAX_RESTARTS = 2
CHILD_WITHIN = 1.0


@attrs.frozen
class Work:
    id: int
    sender: int
    seq: int
    seconds: float


@attrs.frozen
class Crash:
    id: int


@attrs.frozen
class Generate:
    id: int
    tokens: int


@attrs.frozen
class SpawnChild:
    id: int
    restart: RestartKind
    capacity: int
    policy: OverflowPolicy
    strategy: SupervisionStrategy


class Boom(Exception):
    pass


@attrs.define
class _Actor:
    ref: ActorRef
    capacity: int
    scope: int | None  # index of the scope it belongs to (children inherit)


@attrs.define
class _Ask:
    id: int
    start: float
    timeout: float
    end: float | None = None
    outcome: str | None = None


class World:
    """What the program did and observed; the invariants are checked against it."""

    def __init__(self, scale: float, slack: float) -> None:
        self.scale = scale
        self.slack = slack
        self.ids = itertools.count()
        self.tells: set[int] = set()
        self.asks: dict[int, _Ask] = {}
        self.handled: Counter[int] = Counter()
        self.dead: Counter[int] = Counter()
        self.order: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.actors: list[_Actor] = []
        self.scopes: list[ActorScope] = []
        self.scope_open: list[bool] = []
        self.scope_close: list[anyio.Event] = []
        self.scope_done: list[anyio.Event] = []
        self.scope_failures: list[EscalationError] = []
        self.requests: dict[int | None, set[str]] = defaultdict(set)
        self.strategies: dict[str, SupervisionStrategy] = {"/": ROOT_STRATEGY}
        self.bad_letters: list[DeadLetter] = []
        self.rt_log: list[Any] = []

    def on_letter(self, letter: DeadLetter) -> None:
        if not isinstance(letter.reason, DeadLetterReason) or not letter.recipient:
            self.bad_letters.append(letter)
        if letter.reason is DeadLetterReason.LATE_REPLY:
            return
        message = letter.envelope.message
        if isinstance(message, Work | Crash | Generate | SpawnChild):
            self.dead[message.id] += 1

    def actor_in_scope(self, path: str) -> int | None:
        for a in self.actors:
            if a.ref.path == path:
                return a.scope
        return None


class Worker(Actor):
    """The behaviour every actor of a program runs; it reports to the World."""

    def __init__(self, world: World, scope: int | None) -> None:
        self.world = world
        self.scope = scope

    def _seen(self, message_id: int) -> None:
        self.world.handled[message_id] += 1

    @handles(Work)
    async def work(self, m: Work) -> int:
        self._seen(m.id)
        if m.sender >= 0:  # asks come from concurrent tasks: no order to check
            self.world.order[(self.path, m.sender)].append(m.seq)
        if m.seconds:
            await anyio.sleep(m.seconds * self.world.scale)
        return m.id

    @handles(Crash)
    async def crash(self, m: Crash) -> None:
        self._seen(m.id)
        raise Boom(m.id)

    @handles(Generate)
    async def generate(self, m: Generate) -> None:
        self._seen(m.id)
        engine = self.require_engine()
        prompt = engine.handle(engine.tokenize("the plan is"))
        async with engine.stream(prompt, Sampling(max_tokens=m.tokens, temperature=0.5)) as gen:
            self.world.requests[self.scope].add(gen.request_id)
            async for _ in gen:
                pass

    @handles(SpawnChild)
    async def spawn_child(self, m: SpawnChild) -> ActorRef:
        self._seen(m.id)
        ref = self.spawn(
            functools.partial(Worker, self.world, self.scope),
            restart=m.restart,
            capacity=m.capacity,
            overflow=m.policy,
            supervision=m.strategy,
        )
        self.world.strategies[ref.path] = m.strategy
        self.world.actors.append(_Actor(ref, m.capacity, self.scope))
        return ref


def _strategy(name: str) -> SupervisionStrategy:
    cls = OneForOne if name == "one_for_one" else OneForAll
    return cls(max_restarts=CHILD_MAX_RESTARTS, within=CHILD_WITHIN)


def check(world: World, rt: Runtime, engine: ScriptedEngine, now: float) -> None:
    """The invariants that hold after every step."""
    # every message is handled at most once, never both handled and dead-lettered
    for message_id in set(world.handled) | set(world.dead):
        assert world.handled[message_id] + world.dead[message_id] <= 1, message_id
    assert not world.bad_letters
    # per-sender FIFO
    for key, seqs in world.order.items():
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (key, seqs)
    # no ask outlives its timeout (finished or still pending)
    for ask in world.asks.values():
        end = ask.end if ask.end is not None else now
        assert end - ask.start <= ask.timeout + world.slack, ask
    # mailbox depth never above capacity
    for a in world.actors:
        stats = a.ref.mailbox_stats()
        assert stats.depth <= a.capacity and stats.high_water <= a.capacity, (a.ref, stats)
    # a closed or cancelled scope leaves no actor and no engine request behind
    live_requests = engine.live_requests()
    for index, scope in enumerate(world.scopes):
        if world.scope_done[index].is_set():
            assert scope.live_actors() == []
            assert all(not a.ref.is_alive for a in world.actors if a.scope == index)
            assert not (world.requests[index] & live_requests)
    # restart intensity is respected by every supervisor
    restarts: dict[str, list[float]] = defaultdict(list)
    for decision in rt.supervision_log:
        if decision.directive is Directive.RESTART:
            restarts[decision.supervisor].append(decision.at)
    for supervisor, times in restarts.items():
        strategy = world.strategies.get(supervisor)
        if strategy is None:  # a scope guardian
            strategy = OneForOne(CHILD_MAX_RESTARTS, CHILD_WITHIN)
        within = strategy.within * world.scale
        for t in times:
            window = [u for u in times if t - within <= u <= t]
            assert len(window) <= strategy.max_restarts, (supervisor, times)


async def run_program(program: list[dict[str, Any]], *, scale: float, slack: float) -> World:
    world = World(scale, slack)
    seqs = Counter[int]()
    engine = ScriptedEngine(decode_time_per_token=0.05 * scale, seed=1)
    async with engine:
        rt = Runtime(
            engine=engine,
            supervision=attrs.evolve(ROOT_STRATEGY, within=ROOT_STRATEGY.within * scale),
            ask_timeout=10 * scale,
            stop_timeout=5 * scale,
        )
        rt.dead_letters.on_letter(world.on_letter)
        async with rt, anyio.create_task_group() as tg:

            async def host_scope(index: int, ready: anyio.Event) -> None:
                sup = OneForOne(CHILD_MAX_RESTARTS, CHILD_WITHIN * scale)
                try:
                    async with rt.scope(supervision=sup) as scope:
                        world.scopes.append(scope)
                        ready.set()
                        await world.scope_close[index].wait()
                except EscalationError as exc:
                    world.scope_failures.append(exc)
                finally:
                    world.scope_open[index] = False
                    world.scope_done[index].set()

            async def do_ask(ref: ActorRef, message: Work, timeout: float) -> None:
                ask = world.asks[message.id] = _Ask(message.id, anyio.current_time(), timeout)
                try:
                    answer = await ref.ask(message, timeout=timeout)
                    assert answer == message.id
                    ask.outcome = "ok"
                    assert world.handled[message.id] == 1
                except AskTimeout:
                    ask.outcome = "timeout"
                except ActorStopped:
                    ask.outcome = "stopped"
                except (MailboxFull, Undeliverable):
                    ask.outcome = "refused"
                    assert world.dead[message.id] == 1
                finally:
                    ask.end = anyio.current_time()

            burst_senders = itertools.count(1000)  # sender ids apart from the program's own

            async def do_burst(ref: ActorRef, sender: int, sends: list[Any]) -> None:
                for seq, (pause, work) in enumerate(sends, 1):
                    await take_pause(pause)
                    message = Work(next(world.ids), sender, seq, work)
                    world.tells.add(message.id)
                    try:
                        await ref.tell(message)
                    except MailboxFull:
                        assert world.dead[message.id] == 1

            def pick(index: int) -> _Actor | None:
                return world.actors[index % len(world.actors)] if world.actors else None

            def open_scopes() -> list[int]:
                return [i for i, is_open in enumerate(world.scope_open) if is_open]

            for op in program:
                kind = op["op"]
                with anyio.fail_after(1000 * scale):
                    if kind == "spawn":
                        restart = RestartKind(op["restart"])
                        policy = OverflowPolicy(op["policy"])
                        strategy = _strategy(op["strategy"])
                        parent = pick(op["index"]) if op["place"] == "child" else None
                        scopes = open_scopes()
                        if parent is not None and parent.ref.is_alive:
                            message = SpawnChild(
                                next(world.ids), restart, op["capacity"], policy, strategy
                            )
                            world.tells.add(message.id)  # asked, but counted like a tell
                            try:
                                await parent.ref.ask(message, timeout=10 * scale)
                            except (ActorStopped, AskTimeout, MailboxFull, Undeliverable):
                                pass
                            except ActorFailed as exc:  # only when the parent is shutting down
                                assert isinstance(exc.cause, RuntimeNotRunning), exc
                        else:
                            where = (
                                world.scopes[scopes[op["index"] % len(scopes)]]
                                if op["place"] == "scope" and scopes
                                else None
                            )
                            scope_index = None if where is None else world.scopes.index(where)
                            factory = functools.partial(Worker, world, scope_index)
                            spawner = rt if where is None else where
                            try:
                                ref = spawner.spawn(
                                    factory,
                                    restart=restart,
                                    capacity=op["capacity"],
                                    overflow=policy,
                                    supervision=strategy,
                                )
                            except RuntimeNotRunning:  # the scope is failing (escalation)
                                assert where is not None and where.failure is not None
                                continue
                            world.strategies[ref.path] = strategy
                            world.actors.append(_Actor(ref, op["capacity"], scope_index))
                    elif kind == "tell" and (target := pick(op["target"])) is not None:
                        seqs[op["sender"]] += 1
                        message = Work(
                            next(world.ids), op["sender"], seqs[op["sender"]], op["work"]
                        )
                        world.tells.add(message.id)
                        try:
                            await target.ref.tell(message)
                        except MailboxFull:
                            assert world.dead[message.id] == 1
                    elif kind == "burst" and (target := pick(op["target"])) is not None:
                        for sends in op["senders"]:  # concurrent senders, each one in order
                            tg.start_soon(do_burst, target.ref, next(burst_senders), sends)
                        await anyio.lowlevel.checkpoint()
                    elif kind == "ask" and (target := pick(op["target"])) is not None:
                        message = Work(next(world.ids), -1, 0, op["work"])
                        tg.start_soon(do_ask, target.ref, message, op["timeout"] * scale)
                        await anyio.lowlevel.checkpoint()
                    elif kind == "crash" and (target := pick(op["target"])) is not None:
                        for _ in range(op["times"]):
                            crash = Crash(next(world.ids))
                            world.tells.add(crash.id)
                            with contextlib.suppress(MailboxFull):  # dead-lettered too
                                await target.ref.tell(crash)
                    elif kind == "generate" and (target := pick(op["target"])) is not None:
                        gen = Generate(next(world.ids), op["tokens"])
                        world.tells.add(gen.id)
                        with contextlib.suppress(MailboxFull):  # dead-lettered too
                            await target.ref.tell(gen)
                    elif kind == "stop" and (target := pick(op["target"])) is not None:
                        await target.ref.stop(drain=op["drain"])
                        assert not target.ref.is_alive
                    elif kind == "open_scope":
                        index = len(world.scope_open)
                        world.scope_open.append(True)
                        world.scope_close.append(anyio.Event())
                        world.scope_done.append(anyio.Event())
                        ready = anyio.Event()
                        tg.start_soon(host_scope, index, ready)
                        with anyio.fail_after(scale):
                            await ready.wait()
                    elif kind in ("cancel_scope", "close_scope") and (scopes := open_scopes()):
                        index = scopes[op["index"] % len(scopes)]
                        if kind == "cancel_scope":
                            world.scopes[index].cancel()
                        else:
                            world.scope_close[index].set()
                        await world.scope_done[index].wait()
                    elif kind == "advance":
                        await anyio.sleep(op["seconds"] * scale)
                check(world, rt, engine, anyio.current_time())

            for index in open_scopes():
                world.scope_close[index].set()
        # the runtime has shut down (draining mailboxes); every ask task has ended
        world.rt_log = list(rt.supervision_log)
        check(world, rt, engine, anyio.current_time())
        assert rt.actors() == []
        assert all(not a.ref.is_alive for a in world.actors)
        assert engine.live_requests() == frozenset()
        for ask in world.asks.values():
            assert ask.end is not None, ask
        # every tell was handled exactly once or dead-lettered with a reason
        for message_id in world.tells:
            assert world.handled[message_id] + world.dead[message_id] == 1, message_id
        for ask in world.asks.values():
            if ask.outcome == "ok":
                assert world.handled[ask.id] == 1
            assert world.handled[ask.id] + world.dead[ask.id] <= 1
    return world


PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROPERTY_SETTINGS
@given(program=actor_programs)
def test_programs_hold_invariants_on_trio_with_mock_clock(program: list[dict[str, Any]]) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    world = trio.run(functools.partial(run_program, program, scale=1.0, slack=1e-9), clock=clock)
    assert world.handled.total() + world.dead.total() >= 0


@PROPERTY_SETTINGS
@given(program=actor_programs)
def test_programs_hold_invariants_on_asyncio(program: list[dict[str, Any]]) -> None:
    # virtual time on asyncio too: the loop jumps to its next timer when idle

    async def on_virtual_clock() -> World:
        assert isinstance(asyncio.get_running_loop(), VirtualClockLoop)
        return await run_program(program, scale=1.0, slack=1e-9)

    world = anyio.run(
        on_virtual_clock, backend="asyncio", backend_options={"loop_factory": VirtualClockLoop}
    )
    assert world.scale == 1.0


# -- several concurrent senders into one actor ------------------------------------------------


@attrs.frozen
class Sent:
    sender: int
    seq: int
    crash: bool


class Recorder(Actor):
    """Logs each message as its handling starts, works a drawn while, maybe crashes."""

    def __init__(self, log: list[tuple[int, int]], pauses: list[Any], depths: list[int]) -> None:
        self.log = log
        self.pauses = pauses
        self.depths = depths

    @handles(Sent)
    async def sent(self, m: Sent) -> None:
        self.log.append((m.sender, m.seq))
        await take_pause(self.pauses[len(self.log) % len(self.pauses)])
        if m.crash:
            raise Boom(m.seq)


async def run_concurrent_senders(plan: dict[str, Any]) -> None:
    """Sender tasks tell one actor concurrently; then every message's fate is checked."""
    capacity, policy, close = plan["capacity"], OverflowPolicy(plan["policy"]), plan["close"]
    senders = plan["senders"]
    crash = {(i % len(senders), q % len(senders[i % len(senders)])) for i, q in plan["crash"]}
    log: list[tuple[int, int]] = []
    depths: list[int] = []
    arrival: dict[tuple[int, int], int] = {}
    refused: set[tuple[int, int]] = set()  # MailboxFull raised to its sender
    stopped_at: list[int] = []
    dead: dict[tuple[int, int], DeadLetterReason] = {}

    def on_letter(letter: DeadLetter) -> None:
        m = letter.envelope.message
        assert isinstance(m, Sent) and (m.sender, m.seq) not in dead, letter
        dead[(m.sender, m.seq)] = letter.reason

    # the shutdown drain never times out, so only a stop without drain closes on messages
    rt = Runtime(supervision=OneForOne(max_restarts=10, within=1.0), stop_timeout=1e6)
    rt.dead_letters.on_letter(on_letter)
    with anyio.fail_after(1e5):  # virtual: a deadlock fails at once instead of hanging
        async with rt:
            ref = rt.spawn(
                functools.partial(Recorder, log, plan["consumer"], depths),
                capacity=capacity,
                overflow=policy,
            )

            async def sender(i: int, pauses: list[Any]) -> None:
                for seq, pause in enumerate(pauses):
                    await take_pause(pause)
                    arrival[(i, seq)] = len(arrival)
                    try:
                        await ref.tell(Sent(i, seq, (i, seq) in crash))
                    except MailboxFull:
                        refused.add((i, seq))
                    depths.append(ref.mailbox_stats().depth)

            async def stopper(at: float, drain: bool) -> None:
                await anyio.sleep(at)
                stopped_at.append(len(arrival))
                await ref.stop(drain=drain)

            async with anyio.create_task_group() as tg:
                for i, pauses in enumerate(senders):
                    tg.start_soon(sender, i, pauses)
                if close is not None:
                    tg.start_soon(stopper, *close)
    stats = ref.mailbox_stats()
    sent = set(arrival)
    # nothing lost, nothing duplicated: each handled once or dead-lettered once
    assert len(log) == len(set(log)) and set(log) | set(dead) == sent
    assert not set(log) & set(dead)
    # FIFO per sender (and across senders in the order their tells were called),
    # across crashes and restarts
    for i in range(len(senders)):
        seqs = [q for s, q in log if s == i]
        assert seqs == sorted(seqs), (i, log)
    assert [arrival[m] for m in log] == sorted(arrival[m] for m in log)
    # every dead letter has the reason that fits what happened
    r = DeadLetterReason
    # a crash while stopping (a drain, the runtime's shutdown) is not restarted: the actor
    # ends with it, and what is still buffered goes to dead letters as after a stop without drain
    crashed_while_stopping = isinstance(ref.stop_reason, Boom)
    for m, reason in dead.items():
        if reason is r.REJECTED:
            assert policy is OverflowPolicy.FAIL and m in refused
        elif reason is r.OVERFLOW:
            assert policy is OverflowPolicy.DEAD_LETTER
        elif reason is r.RECIPIENT_STOPPED:
            assert stopped_at and arrival[m] >= stopped_at[0]
        else:
            assert reason is r.MAILBOX_CLOSED, (m, reason)
            assert (close is not None and not close[1]) or crashed_while_stopping, m
    assert refused == {m for m, reason in dead.items() if reason is r.REJECTED}
    if policy is OverflowPolicy.BLOCK and close is None and not crashed_while_stopping:
        assert not dead  # back-pressure only
    # bounded
    assert max(depths, default=0) <= stats.high_water <= capacity
    assert stats.blocked_senders == 0 and not ref.is_alive
    restarts = sum(e.directive is Directive.RESTART for e in rt.supervision_log)
    event(f"restarts: {min(restarts, 2)}; dead letters: {sorted({x.value for x in dead.values()})}")


@pytest.mark.parametrize("backend", VIRTUAL_BACKENDS)
@settings(max_examples=60, deadline=None)
@given(plan=concurrent_sends)
def test_concurrent_senders_into_one_actor(backend: str, plan: dict[str, Any]) -> None:
    run_on_virtual_clock(functools.partial(run_concurrent_senders, plan), backend)
