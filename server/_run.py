"""Running: a planned, admitted request on its engines, until it ends or its client leaves.

``until_disconnect`` cancels the work when the client goes (structured: every
engine request, actor and tool it started stops); ``generate_n`` runs a plain
completion's ``n`` samples; ``run_collaboration`` runs one collaboration and
counts how it ended. Engine failures come out as ``ApiError``s (``EngineLost``:
503 with ``Retry-After``, which ``run_retrying`` may run again). ``turn_done``
and ``collaboration_turn_done`` keep a session's turn for its next request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from starlette.requests import Request

from ..collab import (
    CollaborationFailed,
    EventCallback,
    InvalidCollaboration,
    NoAnswer,
    Outcome,
    TokenBudgetExceeded,
    collaborate,
)
from ..collab.trace import OtelExporter
from ..engine_bridge import (
    EngineBridge,
    EngineDied,
    EngineUnavailable,
    GenerationResult,
    KVHandle,
    RequestRefused,
    Retain,
    Sampling,
    TokenDelta,
    UnknownAdapter,
)
from ._errors import ApiError, bad_request, invalid_collaboration
from ._messages import compose
from ._remote import remote_failure
from ._retry import EngineLost, death_counts, died_since, engine_cause, retry_after
from ._sessions import SessionPlan
from ._state import ServerState
from ._tools import history_calls
from ._tracing import genai_request

if TYPE_CHECKING:  # the plans import this module (engine_error)
    from ._plan import CollaborationPlan

T = TypeVar("T")


def engine_error(exc: BaseException, retry: int = 5) -> ApiError:
    """The API error for ``exc``; an engine failure is ``EngineLost`` (503, ``Retry-After``)."""
    if isinstance(exc, ApiError):
        return exc
    remote = remote_failure(exc)
    if remote is not None:
        return remote
    if isinstance(exc, UnknownAdapter):
        return bad_request(str(exc), "adapter", "adapter_not_found")
    if isinstance(exc, RequestRefused):
        return bad_request(str(exc), exc.field)
    if isinstance(exc, EngineDied | EngineUnavailable):
        return EngineLost(exc, retry)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


class ClientGone(Exception):
    """The client disconnected before its request finished (answered 499)."""


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work``; cancel it if the client disconnects first (raises ``ClientGone``)."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    tg.cancel_scope.cancel()
                    return

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:
                failure.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if failure:
        raise failure[0]
    if not outcome:
        raise ClientGone
    return outcome[0]


async def generate_n(
    bridge: EngineBridge,
    prompt: KVHandle,
    sampling: Sampling,
    n: int,
    priority: int = 0,
    retain: Retain | None = None,
    used: Callable[[int], None] | None = None,
) -> list[GenerationResult]:
    """``n`` samples of ``prompt``; the first failure cancels the rest (only the first is
    retained for a session: ``n`` forks of one prompt are not its next turn). ``used`` is
    told the tokens as they are spent (each prompt when submitted, then each delta's), so a
    request cut short is charged what it used."""
    results: list[GenerationResult | None] = [None] * n
    failures: list[BaseException] = []

    def spent(delta: TokenDelta) -> None:
        if used is not None:
            used(len(delta.token_ids))

    async def one(i: int) -> None:
        try:
            if used is not None:
                used(len(prompt))  # submitted: the engine computes (or hits) the prompt
            results[i] = await bridge.generate(
                prompt,
                sampling,
                priority=priority,
                retain=retain if i == 0 else None,
                on_delta=spent,
            )
        except Exception as exc:
            failures.append(exc)
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    if failures:
        raise failures[0]
    return [r for r in results if r is not None]


def first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (``exc`` itself when it is none)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def run_collaboration(
    state: ServerState, plan: CollaborationPlan, on_event: EventCallback | None
) -> Outcome:
    """Run one planned collaboration and count it; errors come out as ``ApiError``.

    An engine death comes out as ``EngineLost``, not counted yet: the caller may
    run the collaboration again, and counts how it finally ended.
    """
    bridge, engines, prepared = plan.bridge, plan.engines, plan.prepared
    involved = list({id(b): b for b in (bridge, *engines.values())}.values())
    deaths = death_counts(involved)
    exporter: OtelExporter | None = None
    if state.tracing is not None:  # one trace per collaboration, continuing the caller's
        exporter = OtelExporter(
            state.tracing.tracer,
            prepared.op.name,
            bridge.model,
            parent=_trace_parent(plan.trace_headers),
            forward=on_event,
            request=genai_request(plan),
            metrics=state.tracing.metrics,
        )
        on_event = exporter
    try:
        outcome = await _collaborate(state, plan, on_event, involved, deaths)
    except BaseException as exc:
        if exporter is not None:
            exporter.finish(None, exc)
        raise
    if exporter is not None:
        exporter.finish(outcome)
    return outcome


def _trace_parent(headers: Mapping[str, str]) -> object | None:
    """The caller's span context from its W3C headers (None without them)."""
    if not headers:
        return None
    from opentelemetry.propagate import extract

    return extract(dict(headers))


async def _collaborate(
    state: ServerState,
    plan: CollaborationPlan,
    on_event: EventCallback | None,
    involved: list[EngineBridge],
    deaths: Mapping[int, tuple[int, int]],
) -> Outcome:
    """``collaborate`` on the plan, its failures as ``ApiError``s, its ending counted."""
    bridge, engines, prepared = plan.bridge, plan.engines, plan.prepared
    metrics = state.metrics
    mode = prepared.op.name
    try:
        outcome = await collaborate(
            bridge,
            prepared,
            plan.context,
            engines=engines,
            question=plan.question,
            on_event=on_event,
            tools=plan.tools,
            tool_choice=plan.tool_choice,
            token_budget=plan.token_budget,
        )
    except TimeoutError:  # collaboration.timeout (the server's request_timeout by default)
        metrics.inc("microagent:collaborations_total", mode=mode, status="timeout")
        raise ApiError(
            504,
            f"collaboration.timeout: the collaboration did not finish within "
            f"{prepared.config.timeout or 0:g} seconds; everything it started was cancelled",
            param="collaboration.timeout",
            code="collaboration_timeout",
            type="timeout_error",
        ) from None
    except InvalidCollaboration as exc:
        metrics.inc("microagent:collaborations_total", mode=mode, status="invalid")
        raise invalid_collaboration(exc.field, exc.reason) from None
    except TokenBudgetExceeded as exc:  # a mode with no bound, stopped before crossing it
        metrics.inc("microagent:collaborations_total", mode=mode, status="invalid")
        raise bad_request(exc.reason, "max_tokens", "token_budget_exceeded") from None
    except NoAnswer as exc:  # the request's own graph left no answer: not a server error
        metrics.inc("microagent:collaborations_total", mode=mode, status="no_answer")
        raise ApiError(
            422, f"{exc.field}: {exc.reason}", param=exc.field, code="no_answer"
        ) from None
    except CollaborationFailed as exc:
        remote = remote_failure(exc)
        if remote is not None:
            metrics.inc("microagent:collaborations_total", mode=mode, status="failed")
            raise remote from None
        lost = _engine_loss(exc, involved, deaths, state.limits.retry_after)
        if lost is not None:
            raise lost from None
        metrics.inc("microagent:collaborations_total", mode=mode, status="failed")
        raise ApiError(
            500, f"collaboration failed: {exc.reason}", code="collaboration_failed"
        ) from None
    except anyio.get_cancelled_exc_class():
        metrics.inc("microagent:collaborations_total", mode=mode, status="cancelled")
        raise
    except Exception as exc:
        lost = _engine_loss(exc, involved, deaths, state.limits.retry_after)
        if lost is not None:
            raise lost from None
        metrics.inc("microagent:collaborations_total", mode=mode, status="error")
        raise engine_error(exc) from None
    metrics.inc("microagent:collaborations_total", mode=mode, status="ok")
    if outcome.early_stopped:
        metrics.inc("microagent:early_stops_total", mode=mode)
    pruned = sum(1 for a in outcome.agents if a.finish_reason == "pruned")
    if pruned:
        metrics.inc("microagent:pruned_agents_total", pruned, mode=mode)
    u = outcome.usage
    metrics.add_usage(
        u.prompt_tokens,
        u.cached_tokens,
        u.completion_tokens,
        u.saved_completion_tokens,
        model=bridge.model,
    )
    metrics.observe_collaboration(outcome, bridge.model)
    return outcome


def _engine_loss(
    exc: BaseException,
    bridges: Sequence[EngineBridge],
    deaths: Mapping[int, tuple[int, int]],
    default_retry: int,
) -> EngineLost | None:
    """``EngineLost`` when an engine failure caused ``exc``, or an engine died meanwhile.

    A mode may fail with "no voter produced an answer" without naming why.
    """
    cause = engine_cause(exc)
    if cause is None:
        dead = died_since(bridges, deaths)
        if dead is None:
            return None
        cause = EngineDied(str(exc), dead[1])
    return EngineLost(cause, retry_after(bridges, default_retry))


async def turn_done(
    state: ServerState,
    bridge: EngineBridge,
    tenant: str,
    session: SessionPlan,
    result: GenerationResult,
    message: Mapping[str, Any],
) -> None:
    """A turn finished: remember its ids under the text the client will send back, and keep
    (or release) its retention for the session's next turn."""
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    text = history_calls(content, calls, "message") if calls else content
    if result.finish_reason in ("stop", "length"):
        state.sessions.remember_generated(tenant, bridge.model, text, result.output_ids)
    await state.sessions.finished(
        tenant,
        bridge,
        session,
        result.handle,
        tool_calls=bool(calls),
        ok=result.finish_reason in ("stop", "length"),
    )


async def collaboration_turn_done(state: ServerState, plan: CollaborationPlan, answer: str) -> None:
    """A collaboration answered a session's turn: keep the conversation and the answer, composed
    as the client's next turn will send them back, for that turn to extend.

    The agents' own threads are released when the collaboration ends; what the next
    turn re-sends is the conversation plus this answer. Composing it costs a prefill of
    the answer (the conversation is still cached) and one decoded token; a failure
    here never fails the reply, the session just recomputes.
    """
    bridge, session = plan.bridge, plan.session
    if session is None or session.retain is None:
        return
    try:
        turn = [*plan.conversation, {"role": "assistant", "content": answer}]
        kept = await compose(bridge, turn)
        result = await bridge.generate(
            kept, Sampling(max_tokens=1), retain=session.retain, priority=session.priority
        )
    except Exception:
        with contextlib.suppress(Exception):  # a dead engine took the retention with it
            await bridge.release(session.retain.key)
        return
    ok = result.finish_reason in ("stop", "length")
    await state.sessions.finished(plan.tenant, bridge, session, kept, tool_calls=False, ok=ok)
