"""Work lost to an engine death: run it once more on the restarted engine, or say 503.

A dead EngineCore fails every request in flight (``EngineDied``); the bridge
restarts it (~25 s on a 2-core CPU). A non-streaming request is answered once,
at the end, so nothing was sent yet and running it again is invisible to the
client, provided it had no effect outside the engine: a collaboration that
executed a tool (``tool_call`` event) is never run again. The rerun waits out
the restart and must finish by the request's deadline; otherwise, and for a
stream that already sent data, the client gets ``EngineLost``: a 503 with
``Retry-After``. Both runs share one resume journal (``engine_bridge``'s
``resume_journal``): the rerun's engine requests that equal the first run's are
answered from what they generated, or continue from it, instead of decoding it again.

Metrics (``ServerMetrics``): ``microagent:engine_retries_total{kind,outcome}``
counts reruns and how they ended; ``microagent:engine_lost_total{kind,reason}``
counts requests answered 503 (or a stream's error event) because of a death;
``microagent:engine_resumed_tokens_total{kind}`` the generated tokens reruns kept.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Literal, TypeVar

import anyio
import attrs

from ..collab import CollaborationEvent, EventCallback
from ..engine_bridge import (
    EngineBridge,
    EngineDied,
    EngineUnavailable,
    ResumeJournal,
    VLLMBridge,
    find_cause,
    resume_journal,
)
from ._errors import ApiError
from ._metrics import ServerMetrics

T = TypeVar("T")

Kind = Literal["collaboration", "completion"]

#: Why a request lost to an engine death was not run again.
LostReason = Literal["tool_ran", "stream", "deadline", "retry_failed", "unavailable"]


class EngineLost(ApiError):
    """503 with ``Retry-After``: the engine died under the request, or could not restart.

    Args:
        cause: the bridge's error (``EngineDied`` or ``EngineUnavailable``).
        retry_after: seconds the client should wait (about one engine start).
        detail: why it was not run again, when it was not.
    """

    def __init__(
        self,
        cause: EngineDied | EngineUnavailable,
        retry_after: int,
        detail: str | None = None,
    ) -> None:
        message = f"engine unavailable: {cause}"
        if detail:
            message += f" ({detail})"
        super().__init__(
            503,
            message,
            code="engine_unavailable",
            headers={"retry-after": str(max(1, retry_after))},
        )
        self.cause = cause

    @property
    def restartable(self) -> bool:
        """The engine died and is being restarted (an ``EngineUnavailable`` is final)."""
        return isinstance(self.cause, EngineDied)


def engine_cause(exc: BaseException | None) -> EngineDied | EngineUnavailable | None:
    """The engine failure behind ``exc``: itself, its ``cause``, its chain or a group member."""
    found = find_cause(exc, (EngineDied, EngineUnavailable))
    return found if isinstance(found, EngineDied | EngineUnavailable) else None


def death_counts(bridges: Iterable[EngineBridge]) -> dict[int, tuple[int, int]]:
    """Each bridge's death count and epoch now: compare after a failure (``died_since``)."""
    return {id(b): (b.deaths, b.epoch) for b in bridges}


def died_since(
    bridges: Iterable[EngineBridge], before: Mapping[int, tuple[int, int]]
) -> tuple[EngineBridge, int] | None:
    """A bridge whose engine died since ``before`` was taken, and its epoch then (None: none).

    A mode may fail "every agent failed" without naming why; an engine that
    died meanwhile is why.
    """
    for b in bridges:
        deaths, epoch = before.get(id(b), (b.deaths, b.epoch))
        if b.deaths != deaths:
            return b, epoch
    return None


def retry_after(bridges: Iterable[EngineBridge], default: int) -> int:
    """Seconds to suggest in ``Retry-After``: the last engine start of these bridges."""
    starts = [
        b.engine_start_seconds[-1]
        for b in bridges
        if isinstance(b, VLLMBridge) and b.engine_start_seconds
    ]
    return max([default, *(math.ceil(s) for s in starts)])


@attrs.define
class ToolWatch:
    """Notes whether a collaboration executed a tool (then it must not run again)."""

    forward: EventCallback | None = None
    ran_tool: bool = False

    def __call__(self, event: CollaborationEvent) -> Awaitable[None] | None:
        if event.type == "tool_call":  # sent before the tool runs: count it as run
            self.ran_tool = True
        return None if self.forward is None else self.forward(event)


def count_lost(metrics: ServerMetrics, kind: Kind, reason: LostReason) -> None:
    """Count one request answered with an engine error, and why it was not run again."""
    metrics.inc("microagent:engine_lost_total", kind=kind, reason=reason)


async def run_retrying(
    run: Callable[[], Awaitable[T]],
    *,
    kind: Kind,
    metrics: ServerMetrics,
    deadline: float,
    may_retry: Callable[[], bool] = lambda: True,
    on_lost: Callable[[], None] = lambda: None,
) -> T:
    """``await run()``; after an engine death, once more, finishing by ``deadline``.

    Args:
        run: one attempt; an engine failure comes out as ``EngineLost``.
        kind: what is run (the metrics' label).
        metrics: where reruns and losses are counted.
        deadline: ``anyio.current_time()`` by which a rerun must have finished.
        may_retry: whether running again is still safe (False once a tool ran).
        on_lost: called once when the request is finally lost (the caller counts it).

    Raises:
        EngineLost: not run again (why: ``detail``), or the rerun failed or ran late.
    """
    with resume_journal() as journal:
        return await _run_retrying(run, journal, kind, metrics, deadline, may_retry, on_lost)


async def _run_retrying(
    run: Callable[[], Awaitable[T]],
    journal: ResumeJournal,
    kind: Kind,
    metrics: ServerMetrics,
    deadline: float,
    may_retry: Callable[[], bool],
    on_lost: Callable[[], None],
) -> T:
    try:
        return await run()
    except EngineLost as lost:
        reason: LostReason | None = None
        if not lost.restartable:
            reason = "unavailable"
        elif not may_retry():
            reason = "tool_ran"
        elif anyio.current_time() >= deadline:
            reason = "deadline"
        if reason is not None:
            count_lost(metrics, kind, reason)
            on_lost()
            lost.message += f" (not run again: {reason.replace('_', ' ')})"
            raise
        first = lost
    outcome = "failed"
    journal.new_run()  # what the first run generated is replayed or continued, not redone
    try:
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            try:
                result = await run()
            except EngineLost:
                count_lost(metrics, kind, "retry_failed")
                on_lost()
                raise
            outcome = "ok"
            return result
    finally:
        metrics.inc("microagent:engine_retries_total", kind=kind, outcome=outcome)
        metrics.inc("microagent:engine_resumed_tokens_total", journal.tokens_kept, kind=kind)
    # the rerun was cancelled at the deadline (a collaboration counts itself as cancelled)
    count_lost(metrics, kind, "deadline")
    raise EngineLost(
        first.cause, _seconds(first), "run again after the restart, it missed its deadline"
    )


def _seconds(lost: EngineLost) -> int:
    return int(lost.headers.get("retry-after", "1"))
