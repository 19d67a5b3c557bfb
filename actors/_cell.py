"""The machinery behind an ActorRef: one task per actor, its mailbox loop and supervision.

``_Node`` is a supervisor (an actor cell, a scope, or the runtime root): it
owns children, a restart window, and decides what happens when a child's
incarnation ends. ``_Cell`` runs one actor: incarnation after incarnation
(restarts happen in the same task; the mailbox survives them), handling one
envelope at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, final

import anyio
import attrs
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint

from ..mailbox import (
    DeadLetterReason,
    Envelope,
    Mailbox,
    MailboxClosed,
    OverflowPolicy,
    ReplySlot,
)
from ._actor import Actor, Reply
from ._current import current as _current
from ._current import current_cell
from ._errors import ActorFailed, ActorNameTaken, ActorStopped, EscalationError, RuntimeNotRunning
from ._messages import CANCELLED, NORMAL, RESTART, SHUTDOWN, StopReason, Terminated, is_abnormal
from ._ref import ActorRef
from ._supervision import (
    Directive,
    OneForAll,
    RestartKind,
    RestartWindow,
    SupervisionEvent,
    SupervisionStrategy,
)

if TYPE_CHECKING:
    from ._runtime import Runtime, _Guardian

_BATCH = 64  # messages handled back to back before yielding to other tasks

EndKind = Literal["crash", "self", "external", "restart"]
_PRIORITY = {"restart": 0, "self": 1, "crash": 2, "external": 3}


@attrs.frozen
class _Ended:
    """How an incarnation ended: a failure, a self-stop, an outside stop, or a sibling restart."""

    reason: StopReason
    kind: EndKind


class _Node:
    """A supervisor of children: an actor cell, a scope guardian or the runtime root."""

    path: str
    runtime: Runtime
    guardian: _Guardian

    def __init__(self, strategy: SupervisionStrategy) -> None:
        self.strategy = strategy
        self.children: dict[str, _Cell] = {}
        self._window = RestartWindow(strategy)
        self._closing = False
        self._tg: TaskGroup | None = None
        self._names = itertools.count()

    def _child_path(self, name: str) -> str:
        return f"/{name}" if self.path == "/" else f"{self.path}/{name}"

    def _check_name(self, name: str) -> None:
        if name in self.children:
            raise ActorNameTaken(self._child_path(name))

    def spawn_child(
        self,
        behaviour: type[Actor] | Callable[[], Actor],
        *,
        name: str | None,
        supervision: SupervisionStrategy | None,
        capacity: int | None,
        overflow: OverflowPolicy | None,
        restart: RestartKind,
    ) -> ActorRef:
        """Create a child cell and start its task in this node's task group."""
        tg = self._tg
        if tg is None or self._closing:
            raise RuntimeNotRunning(f"{self.path} is not accepting new actors")
        if name is None:
            named = getattr(behaviour, "func", behaviour)  # functools.partial(Cls, ...)
            base = getattr(named, "__name__", type(named).__name__).lower()
            while True:
                name = f"{base}-{next(self._names)}"
                if name not in self.children:
                    break
        elif not name or "/" in name:
            raise ValueError(f"an actor name is non-empty and has no '/': {name!r}")
        self._check_name(name)
        rt = self.runtime
        cell = _Cell(
            parent=self,
            name=name,
            factory=behaviour,
            strategy=supervision if supervision is not None else rt.supervision,
            capacity=capacity if capacity is not None else rt.mailbox_capacity,
            overflow=overflow if overflow is not None else rt.overflow,
            restart=restart,
        )
        self.children[name] = cell
        rt._register(cell)
        tg.start_soon(cell.main, name=f"actor {cell.path}")
        return cell.ref

    # -- supervision -----------------------------------------------------------------
    def decide(self, child: _Cell, end: _Ended) -> Directive:
        """What to do with ``child`` whose incarnation ended (runs in the child's task)."""
        if end.kind == "external" or child.stopping or self._closing:
            return Directive.STOP
        if end.kind == "restart":
            return (
                Directive.STOP if child.restart_kind is RestartKind.TEMPORARY else Directive.RESTART
            )
        kind = child.restart_kind
        wants = kind is RestartKind.PERMANENT or (
            kind is RestartKind.TRANSIENT and (end.kind == "crash" or is_abnormal(end.reason))
        )
        now = anyio.current_time()
        if not wants:
            directive = Directive.STOP
        elif self._window.allow(now):
            directive = Directive.RESTART
        else:
            directive = Directive.ESCALATE
        self.runtime._log(SupervisionEvent(self.path, child.path, end.reason, directive, now))
        if directive is Directive.RESTART and isinstance(self.strategy, OneForAll):
            for sibling in list(self.children.values()):
                if sibling is not child:
                    sibling.request_restart()
        elif directive is Directive.ESCALATE:
            cause = end.reason
            if not isinstance(cause, BaseException):
                cause = RuntimeError(f"{child.path} stopped: {cause}")
            self.escalate(EscalationError(self.path, child.path, cause, len(self._window.times)))
        return directive

    def escalate(self, error: EscalationError) -> None:
        """This supervisor gives up (overridden by cells and guardians)."""
        raise NotImplementedError

    def child_terminated(self, child: _Cell) -> None:
        if self.children.get(child.name) is child:
            del self.children[child.name]

    async def stop_children(self, reason: StopReason, *, drain: bool = False) -> None:
        """Stop every child (latest first) and wait until they have terminated."""
        children = list(self.children.values())
        if not children:
            return
        closing, self._closing = self._closing, True
        try:
            for child in reversed(children):
                child.request_stop(reason, drain=drain)
            for child in reversed(children):
                await child.done.wait()
        finally:
            self._closing = closing


@final
class _Cell(_Node):
    """One actor: its mailbox, its task, its incarnations."""

    def __init__(
        self,
        *,
        parent: _Node,
        name: str,
        factory: type[Actor] | Callable[[], Actor],
        strategy: SupervisionStrategy,
        capacity: int,
        overflow: OverflowPolicy,
        restart: RestartKind,
    ) -> None:
        super().__init__(strategy)
        self.parent = parent
        self.name = name
        self.path = parent._child_path(name)
        self.runtime = parent.runtime
        self.guardian = parent.guardian
        self.factory = factory
        self.restart_kind = restart
        self.mailbox = Mailbox(
            capacity, overflow, owner=self.path, dead_letters=self.runtime.dead_letters
        )
        self.ref = ActorRef(self)
        self.done = anyio.Event()
        self.alive = True
        self.restarts = 0
        self.final_reason: StopReason | None = None
        self.stopping = False
        self._stop_reason: StopReason = NORMAL
        self._drain = False
        self._scope: anyio.CancelScope | None = None
        self._interrupt: _Ended | None = None
        self._self_stop: StopReason | None = None
        self._current: Envelope | None = None
        self._answered = False
        self._deferred: set[Reply] = set()
        self._watchers: dict[_Cell, None] = {}
        self._watching: dict[_Cell, None] = {}

    # -- requests from other tasks ----------------------------------------------------
    def _interrupt_with(self, end: _Ended) -> None:
        if self._interrupt is None or _PRIORITY[end.kind] >= _PRIORITY[self._interrupt.kind]:
            self._interrupt = end
        if self._scope is not None and current_cell() is not self:
            self._scope.cancel()

    def request_stop(self, reason: StopReason, *, drain: bool = False) -> None:
        """Stop this actor for good: after draining its mailbox, or now."""
        if not self.alive:
            return
        if self.stopping and (drain or not self._drain):
            return
        self.stopping = True
        self._stop_reason = reason
        self._drain = drain
        if drain:
            self.mailbox.close(drain=True)
        else:
            self.mailbox.close()
            self._interrupt_with(_Ended(reason, "external"))

    def request_restart(self) -> None:
        """A sibling failed under one-for-all: restart (temporary children stop)."""
        if self.alive and not self.stopping:
            self._interrupt_with(_Ended(RESTART, "restart"))

    def escalate(self, error: EscalationError) -> None:
        """A child exceeded the restart intensity: this actor fails with ``error``."""
        if self.alive and not self.stopping:
            self._interrupt_with(_Ended(error, "crash"))

    # -- the task ---------------------------------------------------------------------
    async def main(self) -> None:
        _current.set(self)
        reason: StopReason = CANCELLED
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                reason = await self._lifecycle()
                with anyio.CancelScope(shield=True):
                    await self.stop_children(SHUTDOWN, drain=self._drain)
        finally:
            self._tg = None
            self._terminate(reason)

    async def _lifecycle(self) -> StopReason:
        while True:
            try:
                behaviour = self.factory()
                if not isinstance(behaviour, Actor):
                    raise TypeError(
                        f"the factory of {self.path} returned {behaviour!r}, not an Actor"
                    )
                behaviour._cell = self
            except Exception as exc:
                end = _Ended(exc, "crash")
            else:
                end = await self._incarnation(behaviour)
            if self.stopping and end.kind != "external":
                end = _Ended(end.reason if end.kind == "crash" else self._stop_reason, "external")
            directive = self.parent.decide(self, end)
            if directive is Directive.RESTART:
                self.restarts += 1
                self._interrupt = None
                self._self_stop = None
                await checkpoint()
                continue
            return end.reason

    async def _incarnation(self, behaviour: Actor) -> _Ended:
        end: _Ended | None = None
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._interrupt is not None:
                    scope.cancel()
                try:
                    await behaviour.on_start()
                    if self._self_stop is not None:
                        end = _Ended(self._self_stop, "self")
                    else:
                        end = await self._loop(behaviour)
                except Exception as exc:
                    end = _Ended(exc, "crash")
            self._scope = None
            pending = self._interrupt
            if pending is not None and (
                end is None
                or pending.kind == "external"
                or (end.kind != "crash" and _PRIORITY[pending.kind] > _PRIORITY[end.kind])
            ):
                end = pending
            assert end is not None
            return end
        except BaseException:
            end = _Ended(CANCELLED, "external")
            raise
        finally:
            self._scope = None
            assert end is not None
            await self._end_incarnation(behaviour, end)

    async def _loop(self, behaviour: Actor) -> _Ended:
        mailbox = self.mailbox
        receive = behaviour.receive
        batch = 0
        while True:
            try:
                envelope = mailbox.get_nowait()
                batch += 1
                if batch >= _BATCH:
                    batch = 0
                    await checkpoint()
            except anyio.WouldBlock:
                batch = 0
                try:
                    envelope = await mailbox.get()
                except MailboxClosed:
                    return _Ended(self._stop_reason, "external")
            except MailboxClosed:
                return _Ended(self._stop_reason, "external")
            slot = envelope.reply
            if slot is not None and not slot.open:
                mailbox.dead_letter(envelope, DeadLetterReason.EXPIRED)
                continue
            if (
                envelope.deadline is not None
                and slot is None
                and anyio.current_time() > envelope.deadline
            ):
                mailbox.dead_letter(envelope, DeadLetterReason.EXPIRED)
                continue
            self._current = envelope
            self._answered = False
            try:
                result = await receive(envelope.message)
            except Exception as exc:
                if slot is not None and not self._answered:
                    failure = ActorFailed(self.path, exc)
                    failure.__cause__ = exc
                    slot.fail(failure)
                    self._answered = True
                raise
            if slot is not None and not self._answered:
                self._answered = True
                self._resolve(slot, result, envelope.correlation_id)
            self._current = None
            if self._self_stop is not None:
                return _Ended(self._self_stop, "self")
            if self.stopping and not self._drain:
                return _Ended(self._stop_reason, "external")

    async def _end_incarnation(self, behaviour: Actor, end: _Ended) -> None:
        """Fail what waits on this incarnation, stop its children, run ``on_stop``."""
        reason = end.reason
        current, self._current = self._current, None
        if current is not None and current.reply is not None and not self._answered:
            current.reply.fail(ActorStopped(self.path, reason))
        for reply in list(self._deferred):
            reply.fail(ActorStopped(self.path, reason))
        self._deferred.clear()
        with anyio.CancelScope(shield=True):
            await self.stop_children(
                CANCELLED if reason == CANCELLED else SHUTDOWN, drain=self._drain
            )
            with anyio.move_on_after(self.runtime.stop_timeout) as bound:
                try:
                    await behaviour.on_stop(reason)
                except Exception as exc:
                    self.runtime._cleanup_failed(self.path, exc)
            if bound.cancelled_caught:
                self.runtime._cleanup_failed(
                    self.path, TimeoutError(f"on_stop took over {self.runtime.stop_timeout:g} s")
                )

    def _terminate(self, reason: StopReason) -> None:
        self.alive = False
        self.final_reason = reason
        self.mailbox.close()
        self.parent.child_terminated(self)
        self.runtime._unregister(self)
        for target in self._watching:
            target._watchers.pop(self, None)
        self._watching.clear()
        notice_sender = self.ref
        for watcher in list(self._watchers):
            watcher._watching.pop(self, None)
            watcher.mailbox.put_system(Envelope(Terminated(self.ref, reason), notice_sender))
        self._watchers.clear()
        self.done.set()

    # -- used by the Actor API (in this actor's task) ---------------------------------
    def parent_ref(self) -> ActorRef | None:
        parent = self.parent
        return parent.ref if isinstance(parent, _Cell) else None

    def current_sender(self) -> ActorRef | None:
        current = self._current
        if current is None or current.sender is None:
            return None
        sender = current.sender
        return sender if isinstance(sender, ActorRef) else None

    def self_stop(self, reason: StopReason) -> None:
        self._self_stop = reason

    def watch(self, target: _Cell) -> None:
        if target is self:
            raise ValueError("an actor cannot watch itself")
        if not target.alive:
            reason = target.final_reason if target.final_reason is not None else NORMAL
            self.mailbox.put_system(Envelope(Terminated(target.ref, reason), target.ref))
            return
        target._watchers[self] = None
        self._watching[target] = None

    def unwatch(self, target: _Cell) -> None:
        target._watchers.pop(self, None)
        self._watching.pop(target, None)

    def _current_slot(self) -> tuple[ReplySlot, int]:
        current = self._current
        if current is None or current.reply is None:
            raise RuntimeError(f"{self.path}: the current message is not an ask")
        if self._answered:
            raise RuntimeError(f"{self.path}: the current ask was already answered")
        self._answered = True
        return current.reply, current.correlation_id

    def reply_current(self, value: object) -> bool:
        slot, correlation_id = self._current_slot()
        return self._resolve(slot, value, correlation_id)

    def defer_current(self) -> Reply:
        slot, correlation_id = self._current_slot()
        reply = Reply(self, slot, correlation_id)
        self._deferred.add(reply)
        return reply

    def _resolve(self, slot: ReplySlot, value: object, correlation_id: int) -> bool:
        if slot.resolve(value):
            return True
        if not slot.done:  # the asker gave up: the answer is a late reply
            self.runtime.dead_letters.publish(
                Envelope(value, self.ref, None, correlation_id, None),
                self.path,
                DeadLetterReason.LATE_REPLY,
            )
        return False
