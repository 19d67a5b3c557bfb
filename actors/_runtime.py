"""Runtime and ActorScope: where actors live, and the structured lifetime of groups of them."""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar, final

import anyio
from anyio.abc import TaskGroup

from ..mailbox import DeadLetters, OverflowPolicy
from ._actor import Actor
from ._cell import _Cell, _Node
from ._errors import ActorNameTaken, EscalationError, RuntimeNotRunning
from ._messages import SHUTDOWN
from ._ref import ActorRef
from ._spawner import Spawner
from ._supervision import (
    CleanupFailure,
    OneForOne,
    SupervisionEvent,
    SupervisionStrategy,
)

if TYPE_CHECKING:
    from ..engine_bridge import EngineBridge

A = TypeVar("A", bound=Actor)


@final
class _Guardian(_Node):
    """The supervisor at the top of a runtime or of a scope (not an actor itself)."""

    def __init__(
        self, runtime: Runtime, path: str, strategy: SupervisionStrategy, tg: TaskGroup
    ) -> None:
        super().__init__(strategy)
        self.runtime = runtime
        self.path = path
        self.guardian = self
        self._tg = tg
        self.failure: EscalationError | None = None

    def _check_name(self, name: str) -> None:
        super()._check_name(name)
        if self.path == "/" and name in self.runtime._scopes:
            raise ActorNameTaken(self._child_path(name))

    def escalate(self, error: EscalationError) -> None:
        """Intensity exceeded at the top: stop everything here and raise ``error`` to the owner."""
        if self.failure is None:
            self.failure = error
        self._closing = True
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    def live_cells(self) -> list[_Cell]:
        return [cell for cell in self.runtime._cells.values() if cell.guardian is self]


class _Host(Spawner):
    """Shared enter/exit of a task group with a guardian on top (runtime, scope)."""

    _guardian: _Guardian | None
    _tg: TaskGroup | None

    def _spawn_parent(self) -> _Guardian:
        return self._running_guardian()

    def _running_guardian(self) -> _Guardian:
        guardian = self._guardian
        if guardian is None or guardian._tg is None:
            raise RuntimeNotRunning("use it inside its `async with` block")
        return guardian

    def _exit_policy(self) -> tuple[bool, float]:
        """(drain mailboxes on exit, the bound of each stop phase in seconds)."""
        raise NotImplementedError

    def _closed(self) -> None:
        """Called once the group has exited."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return await self._exit_group(exc_type, exc, tb)
        finally:
            self._closed()

    async def _exit_group(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        drain, timeout = self._exit_policy()
        guardian = self._guardian
        tg = self._tg
        assert guardian is not None and tg is not None
        if exc is None and guardian.failure is None:
            try:
                await _graceful_stop(guardian, drain=drain, timeout=timeout)
            except BaseException as caught:  # cancelled (from outside, or an escalation)
                exc_type, exc, tb = type(caught), caught, caught.__traceback__
        guardian._closing = True
        tg.cancel_scope.cancel()
        try:
            if exc is None or isinstance(exc, anyio.get_cancelled_exc_class()):
                suppress = bool(await tg.__aexit__(exc_type, exc, tb))
            else:  # the body's own exception: let it through unchanged, not in a group
                await tg.__aexit__(None, None, None)
                suppress = False
        finally:
            guardian._tg = None
            self._tg = None
        if guardian.failure is not None:
            raise guardian.failure
        return suppress


async def _graceful_stop(guardian: _Guardian, *, drain: bool, timeout: float) -> None:
    """Stop every actor of ``guardian`` (draining mailboxes if asked), bounded by ``timeout``."""
    guardian._closing = True
    with anyio.move_on_after(timeout):
        await guardian.stop_children(SHUTDOWN, drain=drain)
    if guardian.children:  # draining took too long: stop the rest now
        with anyio.move_on_after(timeout):
            await guardian.stop_children(SHUTDOWN, drain=False)


@final
class ActorScope(_Host):
    """A structured group of actors: leaving or cancelling it stops all of them.

    Made by ``Runtime.scope()``; use as ``async with runtime.scope() as scope``.
    Leaving the block stops every actor spawned in it (cancelling handlers,
    aborting their engine requests, failing asks to them with
    ``ActorStopped``, running ``on_stop``) before the block returns.
    ``cancel()``, a cancelled enclosing scope or a timeout do the same, with
    reason ``"cancelled"``. If a child's failures exceed the scope's restart
    intensity, the scope stops everything and the block raises
    ``EscalationError``.
    """

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        supervision: SupervisionStrategy,
        *,
        drain: bool,
    ) -> None:
        self.runtime = runtime
        self.name = name
        self.path = f"/{name}"
        self.supervision = supervision
        self.drain = drain
        self._guardian: _Guardian | None = None
        self._tg: TaskGroup | None = None
        self._cancel_scope: anyio.CancelScope | None = None

    async def __aenter__(self) -> Self:
        rt = self.runtime
        if not rt.running:
            raise RuntimeNotRunning("the runtime is not running")
        if self.name in rt._scopes or (rt._root is not None and self.name in rt._root.children):
            raise ActorNameTaken(self.path)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._cancel_scope = tg.cancel_scope
        self._guardian = _Guardian(rt, self.path, self.supervision, tg)
        rt._scopes[self.name] = self
        return self

    def _exit_policy(self) -> tuple[bool, float]:
        return self.drain, self.runtime.stop_timeout

    def _closed(self) -> None:
        self.runtime._scopes.pop(self.name, None)

    def cancel(self) -> None:
        """Cancel the scope: its actors and the body of its ``async with`` block."""
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    @property
    def cancelled_caught(self) -> bool:
        """Whether the block ended because the scope was cancelled."""
        return self._cancel_scope is not None and self._cancel_scope.cancelled_caught

    @property
    def failure(self) -> EscalationError | None:
        """The escalation that ended the scope, if any."""
        return None if self._guardian is None else self._guardian.failure

    def live_actors(self) -> list[ActorRef]:
        """Every actor of this scope (children of its actors included) still alive."""
        if self._guardian is None:
            return []
        return [cell.ref for cell in self._guardian.live_cells()]


@final
class Runtime(_Host):
    """The actor system: owns an anyio task group with every top-level actor.

    Use as ``async with Runtime(engine=bridge) as rt``. Leaving the block shuts
    down gracefully (``drain_on_exit``: actors handle what is in their
    mailboxes first), bounded by ``stop_timeout``, then cancels what is left.
    If the root's restart intensity is exceeded, the block is cancelled and
    raises ``EscalationError``.

    Args:
        engine: the engine bridge actors generate on (``Actor.engine``).
        supervision: the root's strategy for top-level actors.
        ask_timeout: default ``ActorRef.ask`` timeout, seconds.
        mailbox_capacity: default mailbox bound.
        overflow: default overflow policy.
        stop_timeout: bound on each ``on_stop`` and on each shutdown phase, seconds.
        drain_on_exit: drain mailboxes when leaving the block normally.
        dead_letters: the sink to use (a new one by default).
    """

    def __init__(
        self,
        *,
        engine: EngineBridge | None = None,
        supervision: SupervisionStrategy | None = None,
        ask_timeout: float = 30.0,
        mailbox_capacity: int = 1024,
        overflow: OverflowPolicy = OverflowPolicy.BLOCK,
        stop_timeout: float = 5.0,
        drain_on_exit: bool = True,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        if ask_timeout <= 0 or stop_timeout <= 0:
            raise ValueError("ask_timeout and stop_timeout must be > 0")
        self.engine = engine
        self.supervision: SupervisionStrategy = supervision or OneForOne()
        self.ask_timeout = ask_timeout
        self.mailbox_capacity = mailbox_capacity
        self.overflow = overflow
        self.stop_timeout = stop_timeout
        self.drain_on_exit = drain_on_exit
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.supervision_log: list[SupervisionEvent] = []
        self.cleanup_failures: list[CleanupFailure] = []
        self._cells: dict[str, _Cell] = {}
        self._scopes: dict[str, ActorScope] = {}
        self._scope_names = itertools.count()
        self._root: _Guardian | None = None
        self._guardian: _Guardian | None = None
        self._tg: TaskGroup | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._root is not None:
            raise RuntimeError("a Runtime can be entered once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._root = self._guardian = _Guardian(self, "/", self.supervision, tg)
        return self

    def _exit_policy(self) -> tuple[bool, float]:
        return self.drain_on_exit, self.stop_timeout

    @property
    def running(self) -> bool:
        """Whether actors can be spawned (inside the block, before shutdown)."""
        root = self._root
        return root is not None and root._tg is not None and not root._closing

    @property
    def failure(self) -> EscalationError | None:
        """The escalation that stopped the runtime, if any."""
        return None if self._root is None else self._root.failure

    async def shutdown(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop every top-level actor (their children first) and refuse new ones.

        Args:
            drain: let each actor handle what is already in its mailbox first.
            timeout: bound per phase (default ``stop_timeout``); after it,
                handlers are cancelled.
        """
        await _graceful_stop(
            self._running_guardian(), drain=drain, timeout=timeout or self.stop_timeout
        )

    # -- actors ------------------------------------------------------------------------

    def scope(
        self,
        name: str | None = None,
        *,
        supervision: SupervisionStrategy | None = None,
        drain: bool = False,
    ) -> ActorScope:
        """A structured group of actors (a collaboration): ``async with rt.scope() as s``.

        Args:
            name: unique among scopes and top-level actors (default ``scope-N``).
            supervision: the scope's strategy for its top-level actors.
            drain: on leaving the block, let actors handle their mailboxes first.
        """
        if name is None:
            name = f"scope-{next(self._scope_names)}"
        return ActorScope(self, name, supervision or self.supervision, drain=drain)

    def actors(self) -> list[ActorRef]:
        """Every live actor (scopes included)."""
        return [cell.ref for cell in self._cells.values()]

    def lookup(self, path: str) -> ActorRef | None:
        """The live actor at ``path``, if any."""
        cell = self._cells.get(path)
        return None if cell is None else cell.ref

    # -- bookkeeping (used by cells) -------------------------------------------------
    def _register(self, cell: _Cell) -> None:
        self._cells[cell.path] = cell

    def _unregister(self, cell: _Cell) -> None:
        if self._cells.get(cell.path) is cell:
            del self._cells[cell.path]

    def _log(self, event: SupervisionEvent) -> None:
        self.supervision_log.append(event)

    def _cleanup_failed(self, actor: str, cause: BaseException) -> None:
        self.cleanup_failures.append(CleanupFailure(actor, cause, anyio.current_time()))
