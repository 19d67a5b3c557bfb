"""Running: the one engine loop, a planned and admitted request on its engines.

Every plan runs here, whichever dialect asked (chat completions, Responses,
text completions) and whether it is streamed or not. A plain completion's ``n``
choices (``run_choices``) and a collaboration (``run_collaboration``) report
what happens as typed events (``EngineEvent``: a choice started, a text delta,
its tool calls, a finished choice, the usage, a collaboration's progress and
outcome, a failure); the dialects only render them (``_chat_render``,
``_responses_render``). The loop meters the key's tokens as they are spent,
observes the time to the first token, counts usage and lost requests, keeps a
session's turn (``turn_done``, ``collaboration_turn_done``) and gives the
request's place back when a stream ends. ``stream_choices`` and
``stream_collaboration`` run a stream (a failure is its last event);
``complete`` and ``collaborate_once`` run a JSON reply (again after an engine
loss, within the deadline; cancelled when its client leaves, ``until_disconnect``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import attrs
from starlette.requests import Request

from ..collab import (
    CollaborationEvent,
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
    GenerationResult,
    Sampling,
    TokenLogprob,
    ToolCallStream,
)
from ._admit import Admitted, Meter
from ._engine_errors import engine_error, first_error
from ._errors import ApiError, bad_request, invalid_collaboration
from ._messages import compose
from ._plan import CollaborationPlan, CompletionPlan
from ._remote import remote_failure
from ._render import finish_reason
from ._retry import (
    EngineLost,
    ToolWatch,
    count_lost,
    death_counts,
    died_since,
    engine_cause,
    retry_after,
    run_retrying,
)
from ._sessions import SessionPlan
from ._state import ServerState
from ._tools import history_calls
from ._tracing import genai_request

T = TypeVar("T")


@attrs.frozen
class ChoiceStarted:
    """Choice ``index`` of a plain completion is about to be submitted."""

    index: int


@attrs.frozen
class TextDelta:
    """Text choice ``index`` wrote, tool calls left out.

    Attributes:
        logprobs: its tokens' logprobs when the request asked for them (None: not asked).
        held: text held back while it might have begun a tool call, sent once the reply
            ended (it merges with no other delta).
    """

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    held: bool = False


@attrs.frozen
class ToolCalls:
    """The calls choice ``index`` made, complete (OpenAI's ``tool_calls`` entries)."""

    index: int
    calls: tuple[Mapping[str, Any], ...]


@attrs.frozen
class ChoiceFinished:
    """Choice ``index`` ended: its result and OpenAI's ``finish_reason`` for it."""

    index: int
    result: GenerationResult
    finish_reason: str


@attrs.frozen
class Usage:
    """A finished completion's tokens, its choices together (already counted)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def counts(self) -> tuple[int, int, int]:
        """Prompt, cached and completion tokens."""
        return (self.prompt_tokens, self.cached_tokens, self.completion_tokens)


@attrs.frozen
class Progress:
    """A collaboration's event, as it happened (its usage already metered)."""

    event: CollaborationEvent


@attrs.frozen
class Answered:
    """A collaboration finished (counted, its session's turn kept)."""

    outcome: Outcome


@attrs.frozen
class Failed:
    """The run failed after its stream began: the error its stream ends with (counted)."""

    error: ApiError


EngineEvent = (
    ChoiceStarted | TextDelta | ToolCalls | ChoiceFinished | Usage | Progress | Answered | Failed
)
"""What the engine loop reports; a dialect renders each as JSON or server-sent events."""

Emit = Callable[[EngineEvent], None]
"""Where the loop reports its events (never waits: a stream's buffer takes them)."""


@attrs.frozen
class Completed:
    """A plain completion that finished: its choices in order and their usage."""

    choices: tuple[ChoiceFinished, ...]
    usage: Usage


async def run_choices(
    state: ServerState, plan: CompletionPlan, meter: Meter, emit: Emit, *, streamed: bool
) -> Completed:
    """Run a plain completion's ``n`` choices at once, reporting each as it goes.

    The key's ``meter`` is told the tokens as they are spent (each prompt when
    submitted, then each delta's), so a request cut short is charged what it used;
    only the first choice is retained for a session (``n`` forks of one prompt are
    not its next turn). ``streamed``: the time to the first token is observed (what
    a stream's client waits) and the first choice's turn is kept as it ends (a JSON
    reply keeps it once its last attempt is over: ``complete``).

    Raises:
        Exception: the first choice's failure, as the bridge raised it (the others
            are cancelled).
    """
    bridge, prompt, sampling, session = plan.bridge, plan.prompt, plan.sampling, plan.session
    finished: list[ChoiceFinished | None] = [None] * plan.body.n
    failures: list[BaseException] = []

    async def one(index: int) -> None:
        emit(ChoiceStarted(index))
        calls = ToolCallStream(plan.tools) if plan.tools is not None else None
        async with bridge.stream(
            prompt,
            sampling,
            priority=session.priority,
            retain=session.retain if index == 0 else None,
        ) as gen:
            meter.add(len(prompt))  # submitted: the engine computes (or hits) the prompt
            submitted, first = time.monotonic(), True
            async for delta in gen:
                meter.add(len(delta.token_ids))
                if streamed and first and delta.token_ids:
                    first = False
                    state.metrics.observe(
                        "microagent:time_to_first_token_seconds",
                        time.monotonic() - submitted,
                        model_name=bridge.model,
                    )
                text = bridge.chat.content(delta.text)
                if calls is not None:
                    text = calls.feed(text)
                logprobs = delta.logprobs if sampling.logprobs is not None else None
                if text or logprobs is not None:
                    emit(TextDelta(index, text, logprobs))
            result = gen.result
        assert result is not None
        reason = finish_reason(result.finish_reason)
        if calls is not None:
            unsent, made = (
                calls.finish(complete=result.finish_reason == "stop")
                if result.finish_reason in ("stop", "length")
                else ("", [])
            )
            if unsent:
                emit(TextDelta(index, unsent, held=True))
            if made:
                reason = "tool_calls"
                emit(ToolCalls(index, tuple(made)))
        if streamed and index == 0:  # a JSON reply keeps it once every attempt is over
            await turn_done(state, bridge, plan.tenant, session, result, _message(plan, result))
        finished[index] = done = ChoiceFinished(index, result, reason)
        emit(done)

    async def guarded(index: int) -> None:
        try:
            await one(index)
        except Exception as exc:
            failures.append(exc)
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i in range(plan.body.n):
            tg.start_soon(guarded, i)
    if failures:
        raise failures[0]
    choices = tuple(c for c in finished if c is not None)
    results = [c.result for c in choices]
    return Completed(
        choices,
        Usage(
            sum(r.prompt_tokens for r in results),
            sum(r.cached_tokens for r in results),
            sum(r.completion_tokens for r in results),
        ),
    )


def _message(plan: CompletionPlan, result: GenerationResult) -> dict[str, Any]:
    """The reply's message as the client gets it: its text and the calls parsed out."""
    content: str | None = result.content
    calls: list[dict[str, Any]] = []
    if plan.tools is not None and result.finish_reason in ("stop", "length"):
        content, calls = plan.tools.parse(result.content, complete=result.finish_reason == "stop")
    return {"role": "assistant", "content": content, "tool_calls": calls}


async def stream_choices(
    state: ServerState, plan: CompletionPlan, admitted: Admitted, emit: Emit
) -> None:
    """A streamed plain completion: its events, then its ``Usage`` (counted), or ``Failed``
    (an engine lost is counted as lost mid-stream). Its place is given back as it ends."""
    meter = admitted.meter
    assert meter is not None  # a stream is admitted with one
    try:
        done = await run_choices(state, plan, meter, emit, streamed=True)
    except Exception as exc:
        hint = retry_after([plan.bridge], state.limits.retry_after)
        error = engine_error(engine_cause(exc) or first_error(exc), hint)
        if isinstance(error, EngineLost):
            count_lost(state.metrics, "completion", "stream")
        emit(Failed(error))
        return
    finally:
        admitted.release()
    state.metrics.add_usage(*done.usage.counts, model=plan.bridge.model)
    emit(done.usage)


async def complete(
    state: ServerState,
    plan: CompletionPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> Completed | None:
    """Run a plain completion for a JSON reply (again after an engine loss, by
    ``deadline``): its choices and usage, or None when the client left.

    The key is charged what it used, not its worst case, the session keeps its turn,
    the usage is counted.
    """
    bridge = plan.bridge
    hint = retry_after([bridge], state.limits.retry_after)
    meter = _metered(admitted)

    async def attempt() -> Completed:
        try:
            return await run_choices(state, plan, meter, _unrendered, streamed=False)
        except Exception as exc:
            raise engine_error(exc, hint) from None

    try:
        done = await until_disconnect(
            request,
            lambda: run_retrying(
                attempt, kind="completion", metrics=state.metrics, deadline=deadline
            ),
        )
    except ClientGone:
        return None
    except Exception as exc:
        raise engine_error(exc, hint) from None
    prompt_tokens, cached, completion = done.usage.counts
    admitted.settle(prompt_tokens + completion)  # what it used, not its worst case
    first = done.choices[0].result
    await turn_done(state, bridge, plan.tenant, plan.session, first, _message(plan, first))
    state.metrics.add_usage(prompt_tokens, cached, completion, model=bridge.model)
    return done


def _unrendered(_event: EngineEvent) -> None:
    """A JSON reply renders what ``complete`` returns, not the events on the way."""


def _metered(admitted: Admitted) -> Meter:
    """The meter of a JSON reply (a stream's is made when it is admitted): what the key is
    charged if the request ends before its usage is known (its client left)."""
    if admitted.meter is None:
        admitted.meter = Meter()
    return admitted.meter


def _metering(
    meter: Meter, forward: Callable[[CollaborationEvent], None] | None = None
) -> Callable[[CollaborationEvent], None]:
    """A collaboration's event callback that charges ``meter`` each engine request's
    tokens as it ends, then hands the event on."""

    def on_event(event: CollaborationEvent) -> None:
        if event.type == "agent_finished":  # each engine request's usage, as it ends
            used = [event.data.get("prompt_tokens"), event.data.get("completion_tokens")]
            meter.add(sum(n for n in used if isinstance(n, int)))
        if forward is not None:
            forward(event)

    return on_event


async def stream_collaboration(
    state: ServerState, plan: CollaborationPlan, admitted: Admitted, emit: Emit
) -> None:
    """A streamed collaboration: its ``Progress`` as it runs, then ``Answered`` (its
    session's turn kept), or ``Failed`` (an engine lost is counted as lost mid-stream).
    Its place is given back as it ends."""
    meter = admitted.meter
    assert meter is not None  # a stream is admitted with one
    on_event = _metering(meter, lambda event: emit(Progress(event)))
    try:
        outcome = await run_collaboration(state, plan, on_event)
    except ApiError as exc:
        if isinstance(exc, EngineLost):  # data went out already: the stream says so, ends
            mode = plan.prepared.op.name
            state.metrics.inc("microagent:collaborations_total", mode=mode, status="failed")
            count_lost(state.metrics, "collaboration", "stream")
        emit(Failed(exc))
        return
    finally:
        admitted.release()
    await collaboration_turn_done(state, plan, outcome.answer)
    emit(Answered(outcome))


async def collaborate_once(
    state: ServerState,
    plan: CollaborationPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> Outcome | None:
    """Run a collaboration for a JSON reply (again after an engine loss, unless it ran a
    tool: its effect happened); its outcome, or None when the client left."""
    meter = _metered(admitted)
    watch = ToolWatch(forward=_metering(meter))
    mode = plan.prepared.op.name

    def lost() -> None:
        state.metrics.inc("microagent:collaborations_total", mode=mode, status="failed")

    try:
        outcome = await until_disconnect(
            request,
            lambda: run_retrying(
                lambda: run_collaboration(state, plan, watch),
                kind="collaboration",
                metrics=state.metrics,
                deadline=deadline,
                may_retry=lambda: not watch.ran_tool,
                on_lost=lost,
            ),
        )
    except ClientGone:  # counted as cancelled by run_collaboration
        return None
    admitted.settle(outcome.usage.prompt_tokens + outcome.usage.completion_tokens)
    await collaboration_turn_done(state, plan, outcome.answer)
    return outcome


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
