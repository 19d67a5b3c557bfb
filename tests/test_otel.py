"""OpenTelemetry: one trace per collaboration over HTTP, in the GenAI semantic conventions,
its GenAI metrics, and the standard ``OTEL_*`` environment variables.

The spans and metrics go through the official SDK to its in-memory exporter and
reader here; the environment tests export over OTLP/HTTP to a stub collector that
decodes what it receives (the collector test with Arize Phoenix reads spans back
from a real one: ``test_clients``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import pytest
from microagent.collab.trace import GenAIMetrics, OtlpTracing, otlp_tracing_from_env
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_server_helpers import LiveServer, live_server, scripted

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
VOTE = {
    "messages": [{"role": "user", "content": "Is the sky blue?"}],
    "max_tokens": 8,
    "agents": [{"name": "voter", "count": 5}],
    "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
}


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def metrics() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture(scope="module")
def server(spans: InMemorySpanExporter, metrics: InMemoryMetricReader) -> Iterator[LiveServer]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider(metric_readers=[metrics])
    tracing = OtlpTracing(
        provider.get_tracer("test"),
        provider,
        GenAIMetrics.of(meters.get_meter("test")),
        meters,
    )
    yield from _serve(tracing)


def _serve(tracing: OtlpTracing) -> Iterator[LiveServer]:
    with live_server(scripted(script=lambda ids, r: "yes"), tracing=tracing) as srv:
        yield srv


def _post(srv: LiveServer, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _by_parent(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def test_a_collaboration_is_one_trace_that_continues_the_callers(
    server: LiveServer, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    body = _post(
        server,
        {**VOTE, "collaboration": {**VOTE["collaboration"], "early_stop": False}},
        traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01",
    )
    finished = list(spans.get_finished_spans())
    (root,) = [s for s in finished if s.name == "invoke_agent microagent.vote"]
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert root.parent is not None and f"{root.parent.span_id:016x}" == PARENT_ID
    assert {f"{s.context.trace_id:032x}" for s in finished} == {TRACE_ID}
    agents = _by_parent(finished, root)
    names = sorted(s.name for s in agents)
    assert names == [
        f"invoke_agent {a['name']}"
        for a in sorted(body["collaboration"]["agents"], key=lambda a: a["name"])
    ]
    usage = body["usage"]
    chats = [c for a in agents for c in _by_parent(finished, a)]
    assert chats and all(c.name == "chat scripted" for c in chats)
    assert all(
        c.attributes is not None and c.attributes["gen_ai.operation.name"] == "chat" for c in chats
    )
    total_in = sum(int((c.attributes or {})["gen_ai.usage.input_tokens"]) for c in chats)
    total_out = sum(int((c.attributes or {})["gen_ai.usage.output_tokens"]) for c in chats)
    assert total_in == usage["prompt_tokens"] and total_out == usage["completion_tokens"]
    attrs = root.attributes or {}
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == cached
    assert attrs["microagent.computed_tokens"] == usage["prompt_tokens"] - cached
    assert "microagent.cached_tokens" not in attrs  # the conventions' name replaced it
    chat_cached = sum(
        int((c.attributes or {})["gen_ai.usage.cache_read.input_tokens"]) for c in chats
    )
    assert chat_cached == cached
    assert attrs["gen_ai.response.id"] == body["id"]
    assert "gen_ai.request.temperature" not in attrs  # not given: left out, not zero
    for child in [*agents, *chats]:  # every span lies within its parent's time
        assert root.start_time is not None and root.end_time is not None
        assert child.start_time is not None and child.end_time is not None
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time


def test_an_early_stop_and_its_pruned_agents_are_marked(
    server: LiveServer, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    body = _post(server, {**VOTE, "collaboration": {**VOTE["collaboration"], "wave": 3}})
    assert body["collaboration"]["early_stopped"]
    finished = list(spans.get_finished_spans())
    (root,) = [s for s in finished if s.name == "invoke_agent microagent.vote"]
    assert root.parent is None  # no traceparent: a trace of its own
    assert (root.attributes or {})["microagent.early_stopped"] is True
    assert "early_stop" in [e.name for e in root.events]
    pruned = (root.attributes or {})["microagent.pruned_agents"]
    assert pruned == sum(
        1 for a in body["collaboration"]["agents"] if a["finish_reason"] == "pruned"
    )


def test_plain_completions_and_a_server_without_tracing_make_no_spans(
    server: LiveServer, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    _post(server, {"messages": VOTE["messages"], "max_tokens": 4})
    assert spans.get_finished_spans() == ()
    with live_server(scripted(script=lambda ids, r: "yes")) as plain:
        assert plain.state.tracing is None
        _post(plain, VOTE)
    assert spans.get_finished_spans() == ()


def test_the_request_and_its_conversation_are_on_the_spans(
    server: LiveServer, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    sampling = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 8, "seed": 7}
    body = _post(server, {**VOTE, **sampling, "prompt_cache_key": "conversation-1"})
    finished = list(spans.get_finished_spans())
    (root,) = [s for s in finished if s.name == "invoke_agent microagent.vote"]
    attrs = root.attributes or {}
    assert {k: attrs[f"gen_ai.request.{k}"] for k in sampling} == sampling
    assert attrs["gen_ai.request.model"] == "scripted"
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.response.id"] == body["id"]
    assert {(s.attributes or {}).get("gen_ai.conversation.id") for s in finished} == {
        "conversation-1"
    }
    chats = [s for s in finished if s.name.startswith("chat ")]
    assert chats
    for chat in chats:  # each engine request with the sampling it ran with
        c = chat.attributes or {}
        assert c["gen_ai.request.model"] == "scripted"
        assert c["gen_ai.request.temperature"] == 0.5
        assert int(c["gen_ai.request.max_tokens"]) >= 1  # the agent's own budget
        assert c["gen_ai.response.id"]  # the engine's request id
    seeds = {(c.attributes or {})["gen_ai.request.seed"] for c in chats}
    assert 7 in seeds and len(seeds) > 1  # each agent its own seed, derived from the request's


def _points(reader: InMemoryMetricReader, name: str) -> list[HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    ]


def test_the_genai_metrics_count_every_engine_request(
    server: LiveServer, spans: InMemorySpanExporter, metrics: InMemoryMetricReader
) -> None:
    def total(name: str, **match: str) -> tuple[int, float]:
        points = [
            p
            for p in _points(metrics, name)
            if all(p.attributes.get(k) == v for k, v in match.items())
        ]
        return sum(p.count for p in points), sum(p.sum for p in points)

    before_in = total("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"})
    before_out = total("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})
    before_chat = total("gen_ai.server.request.duration", **{"gen_ai.operation.name": "chat"})
    before_collab = total(
        "gen_ai.server.request.duration", **{"gen_ai.operation.name": "invoke_agent"}
    )
    before_ttft = total("gen_ai.server.time_to_first_token")
    spans.clear()
    body = _post(server, {**VOTE, "collaboration": {**VOTE["collaboration"], "early_stop": False}})
    usage = body["usage"]
    requests = sum(1 for s in spans.get_finished_spans() if s.name.startswith("chat "))
    assert requests >= 5  # a voter's request each at least
    after_in = total("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"})
    after_out = total("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})
    assert after_in[0] - before_in[0] == requests
    assert after_in[1] - before_in[1] == usage["prompt_tokens"]
    assert after_out[1] - before_out[1] == usage["completion_tokens"]
    chat = total("gen_ai.server.request.duration", **{"gen_ai.operation.name": "chat"})
    assert chat[0] - before_chat[0] == requests
    collab = total("gen_ai.server.request.duration", **{"gen_ai.operation.name": "invoke_agent"})
    assert collab[0] - before_collab[0] == 1 and collab[1] - before_collab[1] >= 0
    ttft = total("gen_ai.server.time_to_first_token")
    assert ttft[0] - before_ttft[0] == requests  # every request made a token
    (point, *_) = _points(metrics, "gen_ai.client.token.usage")
    assert point.attributes["gen_ai.provider.name"] == "vllm"
    assert point.attributes["gen_ai.request.model"] == "scripted"


class _Collector(BaseHTTPRequestHandler):
    """A stub OTLP/HTTP collector: keeps each request's path and body."""

    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", 0))
        self.received.append((self.path, self.rfile.read(size)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    received: list[tuple[str, bytes]] = []
    handler = type("Handler", (_Collector,), {"received": received})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", received
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_otel_variables_configure_the_export(
    collector: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = collector
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert otlp_tracing_from_env() is None  # no endpoint: nothing exported, nothing loaded
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-agents")
    tracing = otlp_tracing_from_env()
    assert tracing is not None and tracing.metrics is not None
    try:
        tracing.tracer.start_span("probe").end()
        tracing.metrics.token_usage.record(5, {"gen_ai.token.type": "input"})
        assert tracing.flush()
    finally:
        tracing.shutdown()
    paths = {path for path, _ in received}
    assert paths == {"/v1/traces", "/v1/metrics"}
    trace_body = ExportTraceServiceRequest.FromString(
        next(b for p, b in received if p == "/v1/traces")
    )
    (resource_spans,) = trace_body.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "my-agents"
    assert [s.name for ss in resource_spans.scope_spans for s in ss.spans] == ["probe"]
    metrics_body = ExportMetricsServiceRequest.FromString(
        next(b for p, b in received if p == "/v1/metrics")
    )
    names = {
        m.name
        for rm in metrics_body.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert names == {"gen_ai.client.token.usage"}


def test_the_traces_endpoint_variable_wins_and_metrics_can_be_off(
    collector: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = collector
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # not this one
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{url}/custom/traces")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    tracing = otlp_tracing_from_env()
    assert tracing is not None and tracing.metrics is None
    try:
        tracing.tracer.start_span("probe").end()
        assert tracing.flush()
    finally:
        tracing.shutdown()
    assert [p for p, _ in received] == ["/custom/traces"]
    (resource_spans,) = ExportTraceServiceRequest.FromString(received[0][1]).resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "microagent"  # no OTEL_SERVICE_NAME: ours


def test_an_explicit_endpoint_gets_the_signal_paths(
    collector: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = collector
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    tracing = otlp_tracing_from_env(url)  # serve --otlp-endpoint: over the variables
    assert tracing is not None and tracing.metrics is not None
    try:
        tracing.tracer.start_span("probe").end()
        tracing.metrics.request_duration.record(0.5, {"gen_ai.operation.name": "chat"})
        assert tracing.flush()
    finally:
        tracing.shutdown()
    assert {p for p, _ in received} == {"/v1/metrics", "/v1/traces"}


@pytest.mark.parametrize(
    ("name", "value"), [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")]
)
def test_the_sdk_or_its_traces_turned_off_export_nothing(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(name, value)
    assert otlp_tracing_from_env("http://127.0.0.1:9") is None


def test_an_unsupported_protocol_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        otlp_tracing_from_env("http://127.0.0.1:9")
