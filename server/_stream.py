"""Streaming: a planned, admitted request rendered as server-sent events as it runs.

Both streams go through an ``EventBuffer`` (bounded: a slow client gets merged
deltas and, for agents' progress, dropped ones, counted on the last chunk) and
an ``SSEResponse`` that cancels the work when the client leaves. The key's
quota is settled with what the stream used, whole or cut (``Admitted.release``).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from starlette.responses import Response

from ..collab import CollaborationEvent
from ..engine_bridge import ToolCallStream
from ._admit import Admitted
from ._errors import ApiError
from ._logprobs import logprobs_content
from ._plan import CollaborationPlan, CompletionPlan
from ._render import choice, collaboration_usage, finish_reason, fixed, usage
from ._retry import EngineLost, count_lost, engine_cause, retry_after
from ._run import (
    collaboration_turn_done,
    engine_error,
    first_error,
    run_collaboration,
    turn_done,
)
from ._sse import DONE, EventBuffer, StreamItem
from ._state import ServerState


def stream_completion(state: ServerState, plan: CompletionPlan, admitted: Admitted) -> Response:
    """A plain completion as ``chat.completion.chunk`` events: deltas per choice, each
    call as one ``tool_calls`` delta, usage last when asked; an engine lost mid-stream
    ends it with the error event."""
    body, bridge, prompt, sampling, stamp = (
        plan.body,
        plan.bridge,
        plan.prompt,
        plan.sampling,
        plan.stamp,
    )
    tools, session = plan.tools, plan.session
    meter = admitted.meter
    assert meter is not None  # a stream is admitted with one
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    buffer = state.event_buffer()
    totals = [0, 0, 0]
    top = body.top_logprobs or 0

    def chunk(index: int, delta: dict[str, Any], **fields: Any) -> StreamItem:
        entry = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return fixed(stamp.chunk([{**entry, **fields}]))

    def delta_item(index: int, text: str) -> StreamItem:
        return StreamItem(
            build=lambda t: stamp.chunk(
                [{"index": index, "delta": {"content": t}, "logprobs": None, "finish_reason": None}]
            ),
            text=text,
            owner=f"choice-{index}",
            mergeable=True,
        )

    async def one(index: int) -> None:
        buffer.put(chunk(index, {"role": "assistant", "content": ""}))
        calls = ToolCallStream(tools) if tools is not None else None
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
                if first and delta.token_ids:
                    first = False
                    state.metrics.observe(
                        "microagent:time_to_first_token_seconds",
                        time.monotonic() - submitted,
                        model_name=bridge.model,
                    )
                text = bridge.chat.content(delta.text)
                if calls is not None:
                    text = calls.feed(text)
                if sampling.logprobs is not None:  # a chunk per delta: its tokens' logprobs
                    entries = logprobs_content(bridge, delta.logprobs, top)
                    if text or entries:
                        logprobs = {"content": entries, "refusal": None}
                        buffer.put(chunk(index, {"content": text}, logprobs=logprobs))
                elif text:
                    buffer.put(delta_item(index, text))
            result = gen.result
        assert result is not None
        totals[0] += result.prompt_tokens
        totals[1] += result.cached_tokens
        totals[2] += result.completion_tokens
        reason = finish_reason(result.finish_reason)
        if calls is not None:
            unsent, made = (
                calls.finish(complete=result.finish_reason == "stop")
                if result.finish_reason in ("stop", "length")
                else ("", [])
            )
            if unsent:
                buffer.put(chunk(index, {"content": unsent}))
            if made:
                reason = "tool_calls"
                deltas = [{"index": k, **call} for k, call in enumerate(made)]
                buffer.put(chunk(index, {"tool_calls": deltas}))
        if index == 0:
            message = (
                choice(bridge, 0, result, tools, 0)["message"]
                if tools is not None
                else {"content": result.content}
            )
            await turn_done(state, bridge, plan.tenant, session, result, message)
        buffer.put(chunk(index, {}, finish_reason=reason))

    async def produce(buf: EventBuffer) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for i in range(body.n):
                    tg.start_soon(one, i)
        except Exception as exc:
            error = engine_error(
                engine_cause(exc) or first_error(exc),
                retry_after([bridge], state.limits.retry_after),
            )
            if isinstance(error, EngineLost):
                count_lost(state.metrics, "completion", "stream")
            buf.put(fixed(error.body()))
            buf.put(fixed(DONE))
            return
        finally:
            admitted.release()
        state.metrics.add_usage(*totals, model=bridge.model)
        if include_usage:
            buf.put(fixed(stamp.chunk([], usage=usage(*totals))))
        buf.put(fixed(DONE))

    return state.sse_response(produce, buffer, admitted.release)


def stream_collaboration(
    state: ServerState, plan: CollaborationPlan, admitted: Admitted
) -> Response:
    """A collaboration as ``chat.completion.chunk`` events: each agent's progress as a
    ``collaboration_event``, the answer as the content delta, the outcome on the last
    chunk; an engine lost mid-stream ends it with the error event."""
    body, stamp = plan.body, plan.stamp
    meter = admitted.meter
    assert meter is not None  # a stream is admitted with one
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    buffer = state.event_buffer()
    answer_sent = [False]

    def empty(event: dict[str, Any]) -> dict[str, Any]:
        return stamp.chunk(
            [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}],
            collaboration_event=event,
        )

    def on_event(event: CollaborationEvent) -> None:
        data = event.to_dict()
        if event.type == "agent_finished":  # each engine request's usage, as it ends
            used = [data.get("prompt_tokens"), data.get("completion_tokens")]
            meter.add(sum(n for n in used if isinstance(n, int)))
        if event.type == "delta":
            agent = event.agent or ""
            text = str(data.pop("text", ""))

            def build(t: str, data: dict[str, Any] = data) -> dict[str, Any]:
                return empty({**data, "text": t})

            buffer.put(
                StreamItem(
                    build=build, text=text, owner=f"agent:{agent}", mergeable=True, droppable=True
                )
            )
            return
        if event.type == "final" and isinstance(data.get("answer"), str) and not answer_sent[0]:
            answer_sent[0] = True
            content = data["answer"]
            buffer.put(
                fixed(
                    stamp.chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"content": content},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                        collaboration_event=data,
                    )
                )
            )
            return
        buffer.put(StreamItem(build=lambda _t: empty(data), owner=f"agent:{event.agent or ''}"))

    async def produce(buf: EventBuffer) -> None:
        try:
            outcome = await run_collaboration(state, plan, on_event)
        except ApiError as exc:
            if isinstance(exc, EngineLost):  # data went out already: the stream says so, ends
                mode = plan.prepared.op.name
                state.metrics.inc("microagent:collaborations_total", mode=mode, status="failed")
                count_lost(state.metrics, "collaboration", "stream")
            buf.put(fixed(exc.body()))
            buf.put(fixed(DONE))
            return
        finally:
            admitted.release()
        await collaboration_turn_done(state, plan, outcome.answer)
        if not answer_sent[0]:
            buf.put(
                fixed(
                    stamp.chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"content": outcome.answer},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
            )
        collaboration = outcome.to_dict()

        def final(_t: str) -> dict[str, Any]:
            state.metrics.inc("microagent:sse_dropped_events_total", buf.dropped)
            return stamp.chunk(
                [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                collaboration=collaboration,
                dropped_events=buf.dropped,
                merged_deltas=buf.merged,
            )

        buf.put(StreamItem(build=final))
        if include_usage:
            buf.put(fixed(stamp.chunk([], usage=collaboration_usage(outcome))))
        buf.put(fixed(DONE))

    buffer.put(
        fixed(
            stamp.chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        )
    )
    return state.sse_response(produce, buffer, admitted.release)
