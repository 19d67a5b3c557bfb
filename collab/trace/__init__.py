"""Collaboration traces: record the events, export trace-event JSON, draw the timeline, and
export OpenTelemetry traces (GenAI semantic conventions) to an OTLP collector."""

from ..._public import publish as _publish
from ._otel import GenAIMetrics as GenAIMetrics
from ._otel import GenAIRequest as GenAIRequest
from ._otel import OtelExporter as OtelExporter
from ._otlp import OtlpTracing as OtlpTracing
from ._otlp import otlp_tracing as otlp_tracing
from ._otlp import otlp_tracing_from_env as otlp_tracing_from_env
from ._recorder import GLOBAL_EVENTS as GLOBAL_EVENTS
from ._recorder import PHASES as PHASES
from ._recorder import TraceRecorder as TraceRecorder
from ._recorder import write_trace as write_trace
from ._timeline import plot_timeline as plot_timeline

__all__ = [
    "GLOBAL_EVENTS",
    "PHASES",
    "GenAIMetrics",
    "GenAIRequest",
    "OtelExporter",
    "OtlpTracing",
    "TraceRecorder",
    "otlp_tracing",
    "otlp_tracing_from_env",
    "plot_timeline",
    "write_trace",
]

_publish(globals(), __name__)
