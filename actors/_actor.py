"""Actor: the base class of user behaviours, and the ``@handles`` dispatch decorator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, final

from ..mailbox import ReplySlot
from ._errors import UnhandledMessage
from ._messages import StopReason
from ._spawner import Spawner

if TYPE_CHECKING:
    from ..engine_bridge import EngineBridge
    from ._cell import _Cell
    from ._ref import ActorRef
    from ._runtime import Runtime

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
A = TypeVar("A", bound="Actor")

_Handler = Callable[["Actor", Any], Awaitable[Any]]


def handles(*message_types: type) -> Callable[[F], F]:
    """Mark an ``async def`` method as the handler of ``message_types`` (and subclasses).

    ``Actor.receive`` dispatches on the message's class, most specific first
    (the class's MRO). What the handler returns answers an ask.
    """
    if not message_types:
        raise TypeError("@handles needs at least one message type")

    def mark(fn: F) -> F:
        existing: tuple[type, ...] = getattr(fn, "__handles__", ())
        fn.__handles__ = existing + message_types  # type: ignore[attr-defined]
        return fn

    return mark


@final
class Reply:
    """A deferred answer to the ask being handled (see ``Actor.defer``).

    Keep it, answer later (from another message, a task…). An answer that comes
    after the asker gave up goes to dead letters as a late reply; if the actor
    stops first, the asker gets ``ActorStopped``.
    """

    __slots__ = ("_cell", "_correlation_id", "_slot")

    def __init__(self, cell: _Cell, slot: ReplySlot, correlation_id: int) -> None:
        self._cell = cell
        self._slot = slot
        self._correlation_id = correlation_id

    @property
    def pending(self) -> bool:
        """Whether the asker still waits for this answer."""
        return self._slot.open

    def send(self, value: object) -> bool:
        """Answer with ``value``; returns whether the asker got it."""
        self._cell._deferred.discard(self)
        return self._cell._resolve(self._slot, value, self._correlation_id)

    def fail(self, error: BaseException) -> bool:
        """Answer with an error raised in the asker; returns whether it got it."""
        self._cell._deferred.discard(self)
        return self._slot.fail(error)


class Actor(Spawner):
    """Base class of actor behaviours: subclass it, add ``@handles`` methods.

    The runtime makes a fresh instance (through the factory given to
    ``spawn``) for the first start and after each restart, so instance state
    is per incarnation. Messages are handled one at a time, in mailbox order,
    by one task per actor.

    Lifecycle: ``on_start()`` runs before the first message; ``on_stop(reason)``
    runs once per incarnation when it ends (on restart too, with the failure as
    ``reason``), after the actor's children have stopped, even on cancellation
    (shielded, bounded by the runtime's ``stop_timeout``).

    Inside hooks and handlers: ``self.ref``, ``self.name``, ``self.path``,
    ``self.sender``, ``self.runtime``, ``self.engine``, ``self.spawn(...)``,
    ``self.watch(ref)``, ``self.reply(...)``, ``self.defer()``, ``self.stop()``.
    """

    __handlers__: ClassVar[dict[type, str]] = {}
    __dispatch_cache__: ClassVar[dict[type, str | None]]
    _cell: _Cell | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                for message_type in getattr(value, "__handles__", ()):
                    table[message_type] = attr
        cls.__handlers__ = table
        cls.__dispatch_cache__ = {}

    # -- hooks ---------------------------------------------------------------------
    async def on_start(self) -> None:
        """Called in the actor's task before the first message of each incarnation."""

    async def on_stop(self, reason: StopReason) -> None:
        """Called when an incarnation ends (stop, failure, restart, cancellation)."""

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value answers an ask.

        The default dispatches to the ``@handles`` method for the message's
        class and calls ``unhandled`` when there is none. Override it for
        ``match``-style dispatch.
        """
        cls = type(self)
        cache = cls.__dispatch_cache__
        kind = type(message)
        try:
            attr = cache[kind]
        except KeyError:
            attr = None
            for klass in kind.__mro__:
                if klass in cls.__handlers__:
                    attr = cls.__handlers__[klass]
                    break
            cache[kind] = attr
        if attr is None:
            return await self.unhandled(message)
        return await getattr(self, attr)(message)

    async def unhandled(self, message: Any) -> Any:
        """No handler for ``message``: by default a failure (``UnhandledMessage``)."""
        raise UnhandledMessage(self.path, message)

    # -- context -------------------------------------------------------------------
    def _spawn_parent(self) -> _Cell:
        return self._ctx()

    def _ctx(self) -> _Cell:
        cell = self._cell
        if cell is None:
            raise RuntimeError(
                "this actor is not running yet: use the context in on_start/receive, not __init__"
            )
        return cell

    @property
    def ref(self) -> ActorRef:
        """This actor's reference (valid across restarts)."""
        return self._ctx().ref

    @property
    def name(self) -> str:
        return self._ctx().name

    @property
    def path(self) -> str:
        """Where this actor sits in the tree, e.g. ``/collab-1/voter-0``."""
        return self._ctx().path

    @property
    def runtime(self) -> Runtime:
        return self._ctx().runtime

    @property
    def engine(self) -> EngineBridge | None:
        """The engine bridge the runtime was given (``None`` without one)."""
        return self._ctx().runtime.engine

    def require_engine(self) -> EngineBridge:
        """The engine bridge, or ``RuntimeError`` when the runtime has none."""
        engine = self.engine
        if engine is None:
            raise RuntimeError(
                f"{self.path} needs an engine: Runtime(engine=...) was not given one"
            )
        return engine

    @property
    def parent(self) -> ActorRef | None:
        """The parent actor, or ``None`` for an actor spawned by a runtime or scope."""
        return self._ctx().parent_ref()

    @property
    def children(self) -> list[ActorRef]:
        """This actor's live children, in spawn order."""
        return [child.ref for child in self._ctx().children.values()]

    @property
    def sender(self) -> ActorRef | None:
        """Who sent the message being handled (``None`` from outside any actor)."""
        return self._ctx().current_sender()

    def watch(self, ref: ActorRef) -> None:
        """Receive ``Terminated(ref, reason)`` when ``ref`` stops (at once if it is dead)."""
        self._ctx().watch(ref._cell)

    def unwatch(self, ref: ActorRef) -> None:
        """Stop watching ``ref`` (a notice already queued is still delivered)."""
        self._ctx().unwatch(ref._cell)

    def stop(self, reason: StopReason = "normal") -> None:
        """Stop after the current message (a self-stop: permanent children restart)."""
        self._ctx().self_stop(reason)

    def reply(self, value: object) -> bool:
        """Answer the ask being handled now; the handler's return value is then ignored.

        Returns whether the asker got it (a late answer goes to dead letters).

        Raises:
            RuntimeError: the current message is not an ask.
        """
        return self._ctx().reply_current(value)

    def defer(self) -> Reply:
        """Answer the current ask later: returns the ``Reply`` to keep.

        Raises:
            RuntimeError: the current message is not an ask.
        """
        return self._ctx().defer_current()
