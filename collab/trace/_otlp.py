"""Where collaborations' OpenTelemetry traces and GenAI metrics go: OTLP, configured
the standard way, by the ``OTEL_*`` environment variables.

``otlp_tracing_from_env`` decides whether a server exports at all: when an endpoint
is known (an explicit one, such as ``serve --otlp-endpoint``, or
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. ``otlp_tracing`` builds
the SDK's pipelines, and the SDK reads the rest itself: the service name and resource
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``microagent`` when neither
names a service), each signal's endpoint, headers, timeout and compression, and the
metric export interval (``OTEL_METRIC_EXPORT_INTERVAL``). Only the protocol
(``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL``) is read here, because it picks the
exporter class (the SDK's exporters do not read it): ``http/protobuf`` (the default)
or ``grpc``; Python has no ``http/json`` exporter. Metrics are exported beside the
traces unless ``OTEL_METRICS_EXPORTER=none`` (a traces-only collector such as Phoenix).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import attrs

from ._otel import GenAIMetrics

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

_PROTOCOLS = ("http/protobuf", "grpc")


@attrs.frozen
class OtlpTracing:
    """Collaborations' telemetry to an OTLP collector: the ``tracer`` spans are made
    with, the GenAI ``metrics`` (None: traces only), and their providers, whose batches
    ``flush`` sends (``shutdown``: flush and stop) before the process exits."""

    tracer: Tracer
    provider: Any
    metrics: GenAIMetrics | None = None
    meter_provider: Any = None

    def flush(self, timeout_ms: int = 10_000) -> bool:
        """Send every finished span and the metrics now; False when the collector did not
        take them in time."""
        ok = bool(self.provider.force_flush(timeout_ms))
        if self.meter_provider is not None:
            ok = bool(self.meter_provider.force_flush(timeout_ms)) and ok
        return ok

    def shutdown(self) -> None:
        self.provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def _exporter_off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "none"


def otlp_tracing_from_env(endpoint: str | None = None) -> OtlpTracing | None:
    """``otlp_tracing(endpoint)`` when an OTLP endpoint is known and the environment
    does not turn the SDK or its traces off; None otherwise (nothing is imported then).

    Raises:
        ValueError: an OTLP protocol other than ``http/protobuf`` or ``grpc`` (the
            variable named), or ``grpc`` without its exporter installed.
    """
    if _env_true("OTEL_SDK_DISABLED") or _exporter_off("OTEL_TRACES_EXPORTER"):
        return None
    named = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if endpoint is None and not named:
        return None
    return otlp_tracing(endpoint)


def otlp_tracing(
    endpoint: str | None = None, *, service: str = "microagent", metrics: bool | None = None
) -> OtlpTracing:
    """Traces (in batches) and GenAI metrics (periodically) to an OTLP collector, through
    the SDK's official exporters.

    Args:
        endpoint: the collector's base URL (OTLP/HTTP: ``/v1/traces`` and ``/v1/metrics``
            appended); None: each signal's ``OTEL_EXPORTER_OTLP_*ENDPOINT``, as the SDK
            reads them (its default: localhost).
        service: ``service.name`` when ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
            name none.
        metrics: export the GenAI histograms (None: unless ``OTEL_METRICS_EXPORTER=none``).

    Raises:
        ValueError: an unsupported OTLP protocol (the variable named).
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    span_exporter = _exporter("traces", endpoint)
    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read by the SDK
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if metrics is None:
        metrics = not _exporter_off("OTEL_METRICS_EXPORTER")
    if not metrics:
        return OtlpTracing(provider.get_tracer("microagent"), provider)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(_exporter("metrics", endpoint))
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    return OtlpTracing(
        provider.get_tracer("microagent"),
        provider,
        GenAIMetrics.of(meter_provider.get_meter("microagent")),
        meter_provider,
    )


def _protocol(signal: str) -> str:
    """The signal's OTLP protocol, from the standard variables (``http/protobuf`` unset)."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip()
        if value:
            if value not in _PROTOCOLS:
                raise ValueError(
                    f"{name}={value!r}: the OTLP exporters here speak {' or '.join(_PROTOCOLS)}"
                )
            return value
    return _PROTOCOLS[0]


def _exporter(signal: str, endpoint: str | None) -> Any:
    """The SDK's OTLP exporter of ``signal`` (``traces`` or ``metrics``) for its protocol;
    without ``endpoint`` it reads its own endpoint variables."""
    protocol = _protocol(signal)
    kind = "trace" if signal == "traces" else "metric"
    cls = "OTLPSpanExporter" if signal == "traces" else "OTLPMetricExporter"
    if protocol == "grpc":
        try:
            module = __import__(
                f"opentelemetry.exporter.otlp.proto.grpc.{kind}_exporter", fromlist=[cls]
            )
        except ImportError as exc:
            raise ValueError(
                f"OTLP over grpc needs opentelemetry-exporter-otlp-proto-grpc ({exc})"
            ) from None
        return getattr(module, cls)(endpoint=endpoint)
    module = __import__(f"opentelemetry.exporter.otlp.proto.http.{kind}_exporter", fromlist=[cls])
    if endpoint is None:
        return getattr(module, cls)()
    url = endpoint.rstrip("/").removesuffix("/v1/traces").removesuffix("/v1/metrics")
    return getattr(module, cls)(endpoint=f"{url}/v1/{signal}")
