"""Chat completions' rendering: the engine loop's events as a ``chat.completion`` body or
as ``chat.completion.chunk`` server-sent events (``/v1/completions``: as
``text_completion`` objects, the same chunks through their ``Stamp``).

A stream goes through an ``EventBuffer`` (bounded: a slow client gets merged
deltas and, for agents' progress, dropped ones, counted on the last chunk) and
an ``SSEResponse`` that cancels the run when the client leaves. A plain
completion streams deltas per choice, each choice's calls as one ``tool_calls``
delta, usage last when asked; a collaboration streams each agent's progress as a
``collaboration_event``, the answer as the content delta and the outcome on the
last chunk. A failure after the stream began ends it with the error event.
"""

from __future__ import annotations

from typing import Any

import attrs
from starlette.responses import JSONResponse, Response

from ..collab import Outcome
from ._admit import Admitted
from ._completions import text_completion
from ._logprobs import logprobs_content
from ._plan import CollaborationPlan, CompletionPlan
from ._render import choice, collaboration_response, collaboration_usage, fixed, usage
from ._run import (
    Answered,
    ChoiceFinished,
    ChoiceStarted,
    Completed,
    EngineEvent,
    Failed,
    Progress,
    TextDelta,
    ToolCalls,
    Usage,
    stream_choices,
    stream_collaboration,
)
from ._sse import DONE, EventBuffer, StreamItem
from ._state import ServerState


@attrs.frozen
class ChatRenderer:
    """Renders a plan's run as chat completions do."""

    def completion(self, plan: CompletionPlan, done: Completed) -> Response:
        """A plain completion's ``chat.completion`` body, its ``n`` choices and ``usage``."""
        stamp, top = plan.stamp, plan.body.top_logprobs or 0
        return JSONResponse(
            {
                "id": stamp.id,
                "object": "chat.completion",
                "created": stamp.created,
                "model": stamp.model,
                "choices": _choices(plan, done, top),
                "usage": usage(*done.usage.counts),
            }
        )

    def collaboration(self, plan: CollaborationPlan, outcome: Outcome) -> Response:
        """A collaboration's ``chat.completion`` body with its ``collaboration`` outcome."""
        stamp = plan.stamp
        return JSONResponse(collaboration_response(outcome, stamp.model, stamp.id, stamp.created))

    def stream_completion(
        self, state: ServerState, plan: CompletionPlan, admitted: Admitted
    ) -> Response:
        """A plain completion as ``chat.completion.chunk`` events."""
        buffer = state.event_buffer()
        render = _CompletionChunks(plan, buffer)

        async def produce(_buf: EventBuffer) -> None:
            await stream_choices(state, plan, admitted, render)

        return state.sse_response(produce, buffer, admitted.release)

    def stream_collaboration(
        self, state: ServerState, plan: CollaborationPlan, admitted: Admitted
    ) -> Response:
        """A collaboration as ``chat.completion.chunk`` events."""
        buffer = state.event_buffer()
        render = _CollaborationChunks(state, plan, buffer)
        buffer.put(_chunk(plan, 0, {"role": "assistant", "content": ""}))

        async def produce(_buf: EventBuffer) -> None:
            await stream_collaboration(state, plan, admitted, render)

        return state.sse_response(produce, buffer, admitted.release)


@attrs.frozen
class TextRenderer(ChatRenderer):
    """Renders a ``/v1/completions`` run: ``text_completion`` objects (its plan's stamp
    makes its chunks text too)."""

    def completion(self, plan: CompletionPlan, done: Completed) -> Response:
        """The ``text_completion`` body of a finished plain completion."""
        choices = _choices(plan, done, plan.body.top_logprobs or 0)
        return JSONResponse(text_completion(plan.stamp, choices, done.usage.counts))


def _choices(plan: CompletionPlan, done: Completed, top: int) -> list[dict[str, Any]]:
    return [choice(plan.bridge, c.index, c.result, plan.tools, top) for c in done.choices]


def _chunk(
    plan: CompletionPlan | CollaborationPlan, index: int, delta: dict[str, Any], **fields: Any
) -> StreamItem:
    entry = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
    return fixed(plan.stamp.chunk([{**entry, **fields}]))


class _CompletionChunks:
    """A plain completion's events as chunks: a role delta as each choice starts, text
    deltas (merged per choice when the client reads slowly; one chunk per engine delta
    with logprobs), the calls, the finish reason, then ``usage`` when asked and ``[DONE]``."""

    def __init__(self, plan: CompletionPlan, buffer: EventBuffer) -> None:
        self.plan = plan
        self.buffer = buffer
        options = plan.body.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.top = plan.body.top_logprobs or 0

    def __call__(self, event: EngineEvent) -> None:
        plan, buffer = self.plan, self.buffer
        if isinstance(event, ChoiceStarted):
            buffer.put(_chunk(plan, event.index, {"role": "assistant", "content": ""}))
        elif isinstance(event, TextDelta):
            self._text(event)
        elif isinstance(event, ToolCalls):
            deltas = [{"index": k, **call} for k, call in enumerate(event.calls)]
            buffer.put(_chunk(plan, event.index, {"tool_calls": deltas}))
        elif isinstance(event, ChoiceFinished):
            buffer.put(_chunk(plan, event.index, {}, finish_reason=event.finish_reason))
        elif isinstance(event, Usage):
            if self.include_usage:
                buffer.put(fixed(plan.stamp.chunk([], usage=usage(*event.counts))))
            buffer.put(fixed(DONE))
        elif isinstance(event, Failed):
            buffer.put(fixed(event.error.body()))
            buffer.put(fixed(DONE))

    def _text(self, event: TextDelta) -> None:
        plan, index, text = self.plan, event.index, event.text
        if event.held:
            self.buffer.put(_chunk(plan, index, {"content": text}))
        elif event.logprobs is not None:  # a chunk per delta: its tokens' logprobs
            entries = logprobs_content(plan.bridge, event.logprobs, self.top)
            if text or entries:
                logprobs = {"content": entries, "refusal": None}
                self.buffer.put(_chunk(plan, index, {"content": text}, logprobs=logprobs))
        elif text:
            stamp = plan.stamp
            self.buffer.put(
                StreamItem(
                    build=lambda t: stamp.chunk(
                        [
                            {
                                "index": index,
                                "delta": {"content": t},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    ),
                    text=text,
                    owner=f"choice-{index}",
                    mergeable=True,
                )
            )


class _CollaborationChunks:
    """A collaboration's events as chunks: each agent's progress as a ``collaboration_event``
    (its text deltas merged, or dropped when the client reads too slowly), the answer as the
    content delta, the outcome on the last chunk, ``usage`` when asked, then ``[DONE]``."""

    def __init__(self, state: ServerState, plan: CollaborationPlan, buffer: EventBuffer) -> None:
        self.state = state
        self.plan = plan
        self.buffer = buffer
        options = plan.body.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.answer_sent = False

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, Answered):
            self._answered(event.outcome)
        elif isinstance(event, Failed):
            self.buffer.put(fixed(event.error.body()))
            self.buffer.put(fixed(DONE))

    def _empty(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.plan.stamp.chunk(
            [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}],
            collaboration_event=event,
        )

    def _progress(self, progress: Progress) -> None:
        event, buffer = progress.event, self.buffer
        data = event.to_dict()
        if event.type == "delta":
            agent = event.agent or ""
            text = str(data.pop("text", ""))

            def build(t: str, data: dict[str, Any] = data) -> dict[str, Any]:
                return self._empty({**data, "text": t})

            buffer.put(
                StreamItem(
                    build=build, text=text, owner=f"agent:{agent}", mergeable=True, droppable=True
                )
            )
            return
        if event.type == "final" and isinstance(data.get("answer"), str) and not self.answer_sent:
            self.answer_sent = True
            entry = {
                "index": 0,
                "delta": {"content": data["answer"]},
                "logprobs": None,
                "finish_reason": None,
            }
            buffer.put(fixed(self.plan.stamp.chunk([entry], collaboration_event=data)))
            return
        buffer.put(
            StreamItem(build=lambda _t: self._empty(data), owner=f"agent:{event.agent or ''}")
        )

    def _answered(self, outcome: Outcome) -> None:
        plan, buffer, metrics = self.plan, self.buffer, self.state.metrics
        if not self.answer_sent:
            buffer.put(_chunk(plan, 0, {"content": outcome.answer}))
        collaboration = outcome.to_dict()

        def final(_t: str) -> dict[str, Any]:
            metrics.inc("microagent:sse_dropped_events_total", buffer.dropped)
            return plan.stamp.chunk(
                [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                collaboration=collaboration,
                dropped_events=buffer.dropped,
                merged_deltas=buffer.merged,
            )

        buffer.put(StreamItem(build=final))
        if self.include_usage:
            buffer.put(fixed(plan.stamp.chunk([], usage=collaboration_usage(outcome))))
        buffer.put(fixed(DONE))
