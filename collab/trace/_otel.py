"""OpenTelemetry traces of collaborations, in the GenAI semantic conventions.

An ``OtelExporter`` is an ``on_event`` callback (like ``TraceRecorder``): it keeps
the collaboration's events and, at ``finish``, turns them into one trace:

* the collaboration: ``invoke_agent microagent.<mode>`` (the root, or a child of
  the caller's span when a W3C ``traceparent`` came with the request), with the
  client's request (``GenAIRequest``: ``gen_ai.request.*``, ``gen_ai.conversation.id``,
  ``gen_ai.response.id``), the usage of every request, the cached and computed
  prompt tokens, the tokens an early stop saved, and ``early_stop``/``pruned`` events;
* each agent: ``invoke_agent <agent>``, from its first request to its last;
* each engine request: ``chat <model>`` with its sampling (``gen_ai.request.*``),
  ``gen_ai.usage.input_tokens``, ``output_tokens`` and ``cache_read.input_tokens``,
  and ``microagent.computed_tokens`` (the prompt tokens not read from cache);
* each tool call: ``execute_tool <tool>``.

Names follow the OpenTelemetry GenAI semantic conventions; ``microagent.*`` holds
what they have no name for. With ``GenAIMetrics``, ``finish`` also records the
conventions' histograms: ``gen_ai.client.token.usage`` (each engine request's input
and output tokens), ``gen_ai.server.time_to_first_token`` and
``gen_ai.server.request.duration`` (each engine request, and the collaboration as
``invoke_agent``).

Spans are built after the collaboration ends, with the times its events carry
(seconds since it started, placed on the wall clock at the exporter's creation),
so tracing adds no work to the agents' path. ``opentelemetry`` is imported only
by ``otlp_tracing`` and ``finish``: a server without an OTLP endpoint never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._outcome import CollaborationEvent, Outcome

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, Meter
    from opentelemetry.trace import Span, Tracer

#: The GenAI provider name of an in-process engine (``gen_ai.provider.name``).
PROVIDER = "vllm"

#: The GenAI conventions' advised buckets: tokens, seconds of a request, seconds to a token
_TOKEN_BUCKETS = tuple(4.0**i for i in range(14))  # 1, 4, 16 … 67 108 864
_DURATION_BUCKETS = tuple(0.01 * 2.0**i for i in range(14))  # 0.01 … 81.92
_TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25)
_TTFT_BUCKETS += (0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


@attrs.frozen
class GenAIRequest:
    """What the client asked for: the collaboration span's request attributes.

    Attributes:
        temperature: ``gen_ai.request.temperature`` (None: not given).
        top_p: ``gen_ai.request.top_p``.
        max_tokens: ``gen_ai.request.max_tokens``.
        seed: ``gen_ai.request.seed``.
        conversation_id: ``gen_ai.conversation.id``, on every span of the trace: the
            session (``prompt_cache_key``, or a ``previous_response_id`` chain's).
        response_id: ``gen_ai.response.id`` of the collaboration (the API's response id).
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    conversation_id: str | None = None
    response_id: str | None = None

    def attributes(self) -> dict[str, str | int | float]:
        """The attributes of the values given (absent ones are left out, not zero)."""
        named = {
            "gen_ai.request.temperature": self.temperature,
            "gen_ai.request.top_p": self.top_p,
            "gen_ai.request.max_tokens": self.max_tokens,
            "gen_ai.request.seed": self.seed,
            "gen_ai.conversation.id": self.conversation_id,
            "gen_ai.response.id": self.response_id,
        }
        return {k: v for k, v in named.items() if v is not None}


@attrs.frozen
class GenAIMetrics:
    """The GenAI semantic conventions' histograms that ``OtelExporter.finish`` records.

    Attributes:
        token_usage: ``gen_ai.client.token.usage`` ({token}; ``gen_ai.token.type`` input
            or output), one record each per engine request.
        time_to_first_token: ``gen_ai.server.time_to_first_token`` (s), per engine request.
        request_duration: ``gen_ai.server.request.duration`` (s), per engine request
            (``chat``) and per collaboration (``invoke_agent``).
    """

    token_usage: Histogram
    time_to_first_token: Histogram
    request_duration: Histogram

    @classmethod
    def of(cls, meter: Meter) -> GenAIMetrics:
        """The three histograms made with ``meter``, with the conventions' buckets."""
        return cls(
            meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            ),
            meter.create_histogram(
                "gen_ai.server.time_to_first_token",
                unit="s",
                description="Time to generate first token for successful responses",
                explicit_bucket_boundaries_advisory=_TTFT_BUCKETS,
            ),
            meter.create_histogram(
                "gen_ai.server.request.duration",
                unit="s",
                description="Generative AI server request duration",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            ),
        )


@attrs.define(eq=False)
class _Request:
    agent: str
    start: float
    label: str
    round: int | None
    end: float | None = None
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
class OtelExporter:
    """Records one collaboration's events and exports them as an OpenTelemetry trace.

    Attributes:
        tracer: the tracer spans are made with (``otlp_tracing``'s, or your own provider's).
        mode: the collaboration mode (the root span's name).
        model: the default model's name (``gen_ai.request.model``).
        parent: the caller's context (``opentelemetry.propagate.extract`` of its headers).
        forward: another event callback, called after recording.
        request: the client's request parameters, conversation and response id.
        metrics: the GenAI histograms to record into (None: spans only).
    """

    tracer: Tracer
    mode: str
    model: str
    parent: object | None = None
    forward: Callable[[CollaborationEvent], Awaitable[None] | None] | None = None
    request: GenAIRequest = attrs.field(factory=GenAIRequest)
    metrics: GenAIMetrics | None = None
    events: list[CollaborationEvent] = attrs.field(factory=list)
    _wall0: int = attrs.field(factory=time.time_ns)

    def __call__(self, event: CollaborationEvent) -> Awaitable[None] | None:
        if event.type != "delta":  # deltas are text, not structure
            self.events.append(event)
        return None if self.forward is None else self.forward(event)

    def finish(self, outcome: Outcome | None, error: BaseException | None = None) -> None:
        """Export the trace (with ``error`` on the root span when the collaboration failed)."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        end = max((e.time for e in self.events), default=0.0)
        if outcome is not None:
            end = max(end, outcome.wall_time)
        root = self.tracer.start_span(
            f"invoke_agent microagent.{self.mode}",
            context=self.parent,  # type: ignore[arg-type]
            kind=trace.SpanKind.INTERNAL,
            start_time=self._ns(0.0),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.agent.name": f"microagent.{self.mode}",
                "gen_ai.request.model": self.model,
                "microagent.collaboration.mode": self.mode,
                **self.request.attributes(),
            },
        )
        conversation = self._conversation()
        requests, tools, marks = self._pair()
        agents: dict[str, list[_Request]] = {}
        for request in requests:
            agents.setdefault(request.agent, []).append(request)
        root_ctx = trace.set_span_in_context(root)
        for agent, mine in agents.items():
            span = self.tracer.start_span(
                f"invoke_agent {agent}",
                context=root_ctx,
                start_time=self._ns(min(r.start for r in mine)),
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.provider.name": PROVIDER,
                    "gen_ai.agent.name": agent,
                    **conversation,
                },
            )
            agent_ctx = trace.set_span_in_context(span)
            totals = {"input": 0, "output": 0, "cached": 0}
            for request in mine:
                self._chat_span(request, agent_ctx, totals, end)
            for name, call_id, start, stop, ok in tools.get(agent, ()):
                tool = self.tracer.start_span(
                    f"execute_tool {name}",
                    context=agent_ctx,
                    start_time=self._ns(start),
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": name,
                        "gen_ai.tool.call.id": call_id,
                        **conversation,
                    },
                )
                if not ok:
                    tool.set_status(Status(StatusCode.ERROR, "the tool failed"))
                tool.end(end_time=self._ns(stop))
            span.set_attributes(_usage(totals))
            for kind, at, data in marks.get(agent, ()):
                span.add_event(kind, attributes=_flat(data), timestamp=self._ns(at))
            span.end(end_time=self._ns(max(r.end or end for r in mine)))
        for kind, at, data in marks.get(None, ()):
            root.add_event(kind, attributes=_flat(data), timestamp=self._ns(at))
        if outcome is not None:
            u = outcome.usage
            root.set_attributes(
                {
                    **_usage(
                        {
                            "input": u.prompt_tokens,
                            "output": u.completion_tokens,
                            "cached": u.cached_tokens,
                        }
                    ),
                    "microagent.saved_completion_tokens": u.saved_completion_tokens,
                    "microagent.early_stopped": outcome.early_stopped,
                    "microagent.pruned_agents": sum(
                        1 for a in outcome.agents if a.finish_reason == "pruned"
                    ),
                }
            )
            if outcome.early_stopped:
                root.add_event("early_stop", timestamp=self._ns(end))
        if error is not None:
            root.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            root.record_exception(error)
        root.end(end_time=self._ns(end))
        if self.metrics is not None:
            self.metrics.request_duration.record(
                end, {**self._metric_attributes("invoke_agent"), **_error_type(error)}
            )

    def _conversation(self) -> dict[str, str]:
        conversation = self.request.conversation_id
        return {} if conversation is None else {"gen_ai.conversation.id": conversation}

    def _metric_attributes(self, operation: str) -> dict[str, str]:
        return {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": self.model,
        }

    def _chat_span(
        self, request: _Request, parent: object, totals: dict[str, int], end: float
    ) -> None:
        from opentelemetry.trace import Status, StatusCode

        data = request.data
        prompt = int(data.get("prompt_tokens", 0) or 0)
        cached = int(data.get("cached_tokens", 0) or 0)
        completion = int(data.get("completion_tokens", 0) or 0)
        totals["input"] += prompt
        totals["output"] += completion
        totals["cached"] += cached
        finish = str(data.get("finish_reason", "aborted"))
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": self.model,
            "gen_ai.response.finish_reasons": [finish],
            "microagent.turn.label": request.label,
            **_usage({"input": prompt, "output": completion, "cached": cached}),
            **self._conversation(),
        }
        for name in ("temperature", "top_p", "max_tokens", "seed"):  # what it sampled with
            if isinstance(data.get(name), int | float) and not isinstance(data[name], bool):
                attributes[f"gen_ai.request.{name}"] = data[name]
        if request.round is not None:
            attributes["microagent.turn.round"] = request.round
        if data.get("request_id"):
            attributes["gen_ai.response.id"] = str(data["request_id"])
        span: Span = self.tracer.start_span(
            f"chat {self.model}",
            context=parent,  # type: ignore[arg-type]
            start_time=self._ns(request.start),
            attributes=attributes,
        )
        if data.get("first_token") is not None:
            span.add_event("first_token", timestamp=self._ns(float(data["first_token"])))
        if finish == "error":
            span.set_status(Status(StatusCode.ERROR, str(data.get("error", "error"))))
        stop = request.end if request.end is not None else end
        span.end(end_time=self._ns(stop))
        if self.metrics is not None:
            self._record(request, prompt, completion, stop, failed=finish == "error")

    def _record(
        self, request: _Request, prompt: int, completion: int, stop: float, *, failed: bool
    ) -> None:
        """One engine request's GenAI metrics (``finish``, after its span)."""
        assert self.metrics is not None
        chat = self._metric_attributes("chat")
        if failed:
            chat["error.type"] = "engine_error"
        for kind, count in (("input", prompt), ("output", completion)):
            self.metrics.token_usage.record(count, {**chat, "gen_ai.token.type": kind})
        self.metrics.request_duration.record(max(stop - request.start, 0.0), chat)
        first = request.data.get("first_token")
        if first is not None and not failed:
            self.metrics.time_to_first_token.record(max(float(first) - request.start, 0.0), chat)

    def _pair(
        self,
    ) -> tuple[
        list[_Request],
        dict[str, list[tuple[str, str, float, float, bool]]],
        dict[str | None, list[tuple[str, float, Mapping[str, Any]]]],
    ]:
        """Engine requests (start/finish pairs), tool calls and marks, from the events."""
        requests: list[_Request] = []
        open_requests: dict[str, _Request] = {}
        tools: dict[str, list[tuple[str, str, float, float, bool]]] = {}
        marks: dict[str | None, list[tuple[str, float, Mapping[str, Any]]]] = {}
        for ev in self.events:
            agent, data = ev.agent, ev.data
            if ev.type == "agent_started" and agent is not None:
                open_requests[agent] = _Request(
                    agent, ev.time, str(data.get("label", "turn")), data.get("round")
                )
            elif ev.type == "agent_finished" and agent is not None:
                request = open_requests.pop(agent, None) or _Request(
                    agent, ev.time, str(data.get("label", "turn")), data.get("round")
                )
                request.end = float(data.get("finished", ev.time) or ev.time)
                request.data = data
                requests.append(request)
            elif ev.type == "tool_result" and agent is not None:
                duration = float(data.get("duration", 0.0) or 0.0)
                tools.setdefault(agent, []).append(
                    (
                        str(data.get("name")),
                        str(data.get("call_id")),
                        ev.time - duration,
                        ev.time,
                        bool(data.get("ok", True)),
                    )
                )
            elif ev.type in ("pruned", "vote", "round", "final", "escalate", "validation"):
                target = agent if ev.type == "pruned" else None
                shown = (
                    dict(data) if agent is None or target is not None else {**data, "agent": agent}
                )
                marks.setdefault(target, []).append((ev.type, ev.time, shown))
        requests.extend(open_requests.values())  # cut by the end: no finish
        return requests, tools, marks

    def _ns(self, seconds: float) -> int:
        return self._wall0 + int(seconds * 1e9)


def _usage(totals: Mapping[str, int]) -> dict[str, int]:
    return {
        "gen_ai.usage.input_tokens": totals["input"],  # cached ones included, as specified
        "gen_ai.usage.output_tokens": totals["output"],
        "gen_ai.usage.cache_read.input_tokens": totals["cached"],
        "microagent.computed_tokens": totals["input"] - totals["cached"],
    }


def _error_type(error: BaseException | None) -> dict[str, str]:
    return {} if error is None else {"error.type": type(error).__name__}


def _flat(data: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Event attributes as OpenTelemetry takes them (scalars; the rest as text)."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in data.items():
        if isinstance(value, str | int | float | bool):
            out[key] = value
        elif value is not None:
            out[key] = str(value)
    return out
