"""OpenTelemetry: one trace per collaboration over HTTP, in the GenAI semantic conventions.

The spans go through the official SDK to its in-memory exporter here (the
collector test with Arize Phoenix reads them back over OTLP: ``test_clients``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from microagent.collab.trace import OtlpTracing
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
def server(spans: InMemorySpanExporter) -> Iterator[LiveServer]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing = OtlpTracing(provider.get_tracer("test"), provider)
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
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["microagent.cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert attrs["microagent.computed_tokens"] == (
        usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    )
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
