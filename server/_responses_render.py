"""Rendering for ``/v1/responses``: a ``response`` object, or its event stream.

The same plans run as on chat completions; only the shape differs. A reply is
``output`` items: a ``message`` with one ``output_text`` part, then one
``function_call`` item per call. A reply cut by ``max_output_tokens`` is
``status: "incomplete"`` (``incomplete_details.reason: "max_output_tokens"``).

A stream sends the event sequence the openai SDK's stream accumulator and the
Agents SDK read: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` … ``.done`` (a message's
``content_part.added``, ``output_text.delta``s, ``output_text.done`` and
``content_part.done``; a call's ``function_call_arguments.delta`` and
``.done``), then ``response.completed`` (or ``response.incomplete``) carrying
the whole response with its ``usage``. Each event has a ``sequence_number``.

A finished response (``completed`` or ``incomplete``, streamed or not) is stored
unless its request said ``store: false`` (``keep_response``); a failed or
cancelled one is not stored at all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
from starlette.responses import JSONResponse, Response

from ..collab import Outcome
from ..engine_bridge import GenerationResult
from ._admit import Admitted
from ._errors import ApiError
from ._plan import CollaborationPlan, CompletionPlan
from ._render import choice
from ._response_store import ResponseStore
from ._responses_api import ResponsesRequest
from ._run import (
    Answered,
    ChoiceFinished,
    Completed,
    EngineEvent,
    Failed,
    TextDelta,
    ToolCalls,
    Usage,
    stream_choices,
    stream_collaboration,
)
from ._sse import DONE, EventBuffer, StreamItem
from ._state import ServerState


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseShape:
    """One response's identity and the request fields it echoes."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request = request
        self.id = request.response_id
        self.created_at = int(time.time())
        self.model = model
        self.message_id = _id("msg")

    def body(
        self,
        output: list[dict[str, Any]],
        *,
        status: str,
        usage: tuple[int, int, int] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """The ``response`` object with ``output`` and, when finished, its ``usage``."""
        r = self.request
        tools = [dict(t) for t in r.tools or ()]
        fmt = {"type": "text"}
        if r.text is not None and isinstance(r.text.get("format"), dict):
            fmt = r.text["format"]
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "store": r.stores,
            "temperature": r.temperature,
            "text": {"format": fmt},
            "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
            "tools": tools,
            "top_p": r.top_p,
            "truncation": "disabled",
            "metadata": dict(r.metadata or {}),
            "user": r.user,
            "usage": None,
            **extra,
        }
        if usage is not None:
            prompt, cached, completion = usage
            body["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
        return body

    def message(self, text: str, *, done: bool = True) -> dict[str, Any]:
        """The ``message`` output item holding ``text``."""
        return {
            "type": "message",
            "id": self.message_id,
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": [_text_part(text)] if done else [],
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call: dict[str, Any], *, done: bool = True) -> dict[str, Any]:
    """A chat ``tool_calls`` entry as a ``function_call`` output item."""
    fn = call["function"]
    return {
        "type": "function_call",
        "id": _id("fc"),
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"] if done else "",
        "status": "completed" if done else "in_progress",
    }


def output_items(
    shape: ResponseShape, content: str | None, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A reply's ``output``: its message (when it has text, or nothing else), then its calls."""
    items: list[dict[str, Any]] = []
    if content or not calls:
        items.append(shape.message(content or ""))
    items.extend(_call_item(c) for c in calls)
    return items


def completion_response(
    request: ResponsesRequest,
    plan: CompletionPlan,
    message: dict[str, Any],
    finish: str,
    used: tuple[int, int, int],
) -> dict[str, Any]:
    """A finished plain completion's ``response`` object."""
    shape = ResponseShape(request, plan.stamp.model)
    content, calls = message.get("content"), list(message.get("tool_calls") or [])
    status = "incomplete" if finish == "length" else "completed"
    # a reply cut before it wrote anything (a required call cut by the budget) has no
    # output: an empty message would read as a (blank) answer
    output = output_items(shape, content, calls) if content or calls or finish != "length" else []
    return shape.body(output, status=status, usage=used)


def collaboration_result(
    request: ResponsesRequest, plan: CollaborationPlan, outcome: Outcome
) -> dict[str, Any]:
    """A finished collaboration's ``response`` object (its outcome under ``collaboration``)."""
    shape = ResponseShape(request, plan.stamp.model)
    u = outcome.usage
    used = (u.prompt_tokens, u.cached_tokens, u.completion_tokens)
    message = shape.message(outcome.answer)
    return shape.body([message], status="completed", usage=used, collaboration=outcome.to_dict())


def keep_response(
    store: ResponseStore, tenant: str, request: ResponsesRequest, response: dict[str, Any]
) -> None:
    """Store a finished ``response`` for ``tenant`` unless its request said ``store: false``
    (streamed or not; a failed or cancelled response never gets here, so is not stored)."""
    if request.stores:
        conversation = request.conversation(response["output"])
        store.put(tenant, response, conversation, request.chain)


def _at(shape: ResponseShape) -> dict[str, Any]:
    """Where a message's text events point: its item, output index 0, content index 0."""
    return {"item_id": shape.message_id, "output_index": 0, "content_index": 0}


class _Events:
    """Numbers and queues one stream's events."""

    def __init__(self, buffer: EventBuffer) -> None:
        self.buffer = buffer
        self.sequence = 0

    def put(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        self.buffer.put(StreamItem(build=lambda _t: event))

    def open_message(self, shape: ResponseShape) -> None:
        """The message item and its one text part begin (output index 0)."""
        self.put("response.output_item.added", output_index=0, item=shape.message("", done=False))
        self.put("response.content_part.added", part=_text_part(""), **_at(shape))

    def text_delta(self, shape: ResponseShape, text: str) -> None:
        self.put("response.output_text.delta", delta=text, logprobs=[], **_at(shape))

    def close_message(self, shape: ResponseShape, text: str) -> dict[str, Any]:
        """The message's text, part and item end; returns the finished item."""
        self.put("response.output_text.done", text=text, logprobs=[], **_at(shape))
        self.put("response.content_part.done", part=_text_part(text), **_at(shape))
        item = shape.message(text)
        self.put("response.output_item.done", output_index=0, item=item)
        return item

    def error(self, exc: ApiError) -> None:
        body = exc.body()
        self.buffer.put(StreamItem(build=lambda _t: body))
        self.buffer.put(StreamItem(build=lambda _t: DONE))


@attrs.frozen
class ResponsesRenderer:
    """Renders a plan's run as a ``response`` object or its events, and stores it when it
    finished (``keep_response``) for ``tenant``."""

    request: ResponsesRequest
    store: ResponseStore
    tenant: str

    def completion(self, plan: CompletionPlan, done: Completed) -> Response:
        """A finished plain completion's ``response`` object."""
        first = choice(plan.bridge, 0, done.choices[0].result, plan.tools, 0)
        reply = completion_response(
            self.request, plan, first["message"], first["finish_reason"], done.usage.counts
        )
        keep_response(self.store, self.tenant, self.request, reply)
        return JSONResponse(reply)

    def collaboration(self, plan: CollaborationPlan, outcome: Outcome) -> Response:
        """A finished collaboration's ``response`` object."""
        reply = collaboration_result(self.request, plan, outcome)
        keep_response(self.store, self.tenant, self.request, reply)
        return JSONResponse(reply)

    def stream_completion(
        self, state: ServerState, plan: CompletionPlan, admitted: Admitted
    ) -> Response:
        """A plain completion streamed as Responses events (text deltas as they come; each
        call as one ``function_call`` item when the reply ends)."""
        buffer = state.event_buffer()
        render = _CompletionEvents(self, plan, buffer)

        async def produce(_buf: EventBuffer) -> None:
            render.begin()
            await stream_choices(state, plan, admitted, render)

        return state.sse_response(produce, buffer, admitted.release)

    def stream_collaboration(
        self, state: ServerState, plan: CollaborationPlan, admitted: Admitted
    ) -> Response:
        """A collaboration streamed as Responses events: the answer as one message when the
        collaboration ends (its agents' progress is on the chat route's stream)."""
        buffer = state.event_buffer()
        events = _Events(buffer)
        shape = ResponseShape(self.request, plan.stamp.model)

        def render(event: EngineEvent) -> None:
            if isinstance(event, Failed):
                events.error(event.error)
            elif isinstance(event, Answered):
                outcome = event.outcome
                events.open_message(shape)
                events.text_delta(shape, outcome.answer)
                item = events.close_message(shape, outcome.answer)
                u = outcome.usage
                used = (u.prompt_tokens, u.cached_tokens, u.completion_tokens)
                final = shape.body(
                    [item], status="completed", usage=used, collaboration=outcome.to_dict()
                )
                keep_response(self.store, self.tenant, self.request, final)
                events.put("response.completed", response=final)
                buffer.put(StreamItem(build=lambda _t: DONE))

        async def produce(_buf: EventBuffer) -> None:
            events.put("response.created", response=shape.body([], status="in_progress"))
            events.put("response.in_progress", response=shape.body([], status="in_progress"))
            await stream_collaboration(state, plan, admitted, render)

        return state.sse_response(produce, buffer, admitted.release)


class _CompletionEvents:
    """A plain completion's events as Responses events: the message's text as it comes,
    then its calls' items, then ``response.completed`` (or ``.incomplete``)."""

    def __init__(self, renderer: ResponsesRenderer, plan: CompletionPlan, buffer: EventBuffer):
        self.renderer = renderer
        self.buffer = buffer
        self.events = _Events(buffer)
        self.shape = ResponseShape(renderer.request, plan.stamp.model)
        self.sent: list[str] = []
        self.made: list[Mapping[str, Any]] = []
        self.result: GenerationResult | None = None

    def begin(self) -> None:
        shape = self.shape
        self.events.put("response.created", response=shape.body([], status="in_progress"))
        self.events.put("response.in_progress", response=shape.body([], status="in_progress"))

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, TextDelta):
            if event.text:
                self._send(event.text)
        elif isinstance(event, ToolCalls):
            self.made = list(event.calls)
        elif isinstance(event, ChoiceFinished):
            self.result = event.result
        elif isinstance(event, Usage):
            self._finish(event)
        elif isinstance(event, Failed):
            self.events.error(event.error)

    def _send(self, text: str) -> None:
        if not self.sent:
            self.events.open_message(self.shape)
        self.sent.append(text)
        self.events.text_delta(self.shape, text)

    def _finish(self, used: Usage) -> None:
        events, shape, sent, made, result = (
            self.events,
            self.shape,
            self.sent,
            self.made,
            self.result,
        )
        assert result is not None
        output: list[dict[str, Any]] = []
        if sent or not (made or result.finish_reason == "length"):
            if not sent:
                events.open_message(shape)
            output.append(events.close_message(shape, "".join(sent)))
        for call in made:
            index = len(output)
            item = _call_item(dict(call))
            started = {**item, "arguments": "", "status": "in_progress"}
            events.put("response.output_item.added", output_index=index, item=started)
            at = {"item_id": item["id"], "output_index": index}
            events.put("response.function_call_arguments.delta", delta=item["arguments"], **at)
            done = {"name": item["name"], "arguments": item["arguments"]}
            events.put("response.function_call_arguments.done", **done, **at)
            events.put("response.output_item.done", output_index=index, item=item)
            output.append(item)
        status = "incomplete" if result.finish_reason == "length" and not made else "completed"
        final = shape.body(output, status=status, usage=used.counts)
        r = self.renderer
        keep_response(r.store, r.tenant, r.request, final)
        events.put(f"response.{status}", response=final)
        self.buffer.put(StreamItem(build=lambda _t: DONE))
