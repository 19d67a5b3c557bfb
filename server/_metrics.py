"""Server metrics through prometheus_client: ours (``microagent:*``) and vLLM's (``vllm:*``).

Each app owns a ``CollectorRegistry`` (never the process-global one: tests and
``serve`` build several apps in one process). Counters and histograms are
incremented where things happen; engine gauges are read from the bridges at
scrape time — ``microagent:engine_requests_running`` comes from each engine's
scheduler, the number that proves cancelled requests really left the engine;
``microagent:asyncio_tasks`` counts the event loop's tasks (the soak bench checks
that it comes back to its idle level).

Names follow vLLM's style (``vllm:num_requests_running``) and every per-engine
series carries vLLM's ``model_name`` label (the served name), so one dashboard
filters both families by model. vLLM's own series come from each engine's
``PrometheusStatLogger`` (``EngineBridge.prometheus_collector``), each in its own
registry so several models do not unregister each other; families of the same
name are merged into one at scrape time (one ``# TYPE`` line per family).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from ..collab import Outcome
from ..engine_bridge import EngineBridge, RetentionStats, TierStats

#: The ``/metrics`` content type: Prometheus text, as ``vllm serve`` answers.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: The label every per-engine series carries (vLLM's name for it).
MODEL_LABEL: Final = "model_name"

#: Latency buckets (seconds) of the collaboration and agent histograms: a step of
#: a small model on a CPU up to a long multi-round collaboration.
DURATION_BUCKETS: Final = (
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    640.0,
)

#: Counters the code increments: name -> (help, label names).
COUNTERS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "microagent:requests_total": (
        "Chat completion requests by kind and HTTP status.",
        ("kind", "status"),
    ),
    "microagent:collaborations_total": ("Collaborations by mode and status.", ("mode", "status")),
    "microagent:prompt_tokens_total": (
        "Prompt tokens of finished requests and collaborations (a collaboration's, all its "
        "agents' included, under its request's model).",
        (MODEL_LABEL,),
    ),
    "microagent:cached_tokens_total": (
        "Prompt tokens served from the prefix cache.",
        (MODEL_LABEL,),
    ),
    "microagent:computed_prompt_tokens_total": (
        "Prompt tokens the engine computed (prompt minus cached).",
        (MODEL_LABEL,),
    ),
    "microagent:completion_tokens_total": ("Completion tokens generated.", (MODEL_LABEL,)),
    "microagent:saved_completion_tokens_total": (
        "Completion tokens avoided by pruning.",
        (MODEL_LABEL,),
    ),
    "microagent:early_stops_total": ("Collaborations stopped early, by mode.", ("mode",)),
    "microagent:pruned_agents_total": ("Agents pruned, by mode.", ("mode",)),
    "microagent:rejected_total": (
        "Requests refused for overload or shutdown, by reason.",
        ("reason",),
    ),
    "microagent:engine_retries_total": (
        "Requests run again after an engine death, by kind and outcome.",
        ("kind", "outcome"),
    ),
    "microagent:engine_resumed_tokens_total": (
        "Generated tokens a rerun after an engine death kept instead of decoding again.",
        ("kind",),
    ),
    "microagent:engine_lost_total": (
        "Requests lost to an engine death (a 503 or a stream's error event), "
        "by kind and why they were not run again.",
        ("kind", "reason"),
    ),
    "microagent:sse_dropped_events_total": ("Stream events dropped for slow clients.", ()),
}

#: Histograms (seconds): name -> (help, label names).
HISTOGRAMS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "microagent:collaboration_duration_seconds": (
        "Wall time of finished collaborations, by model and mode.",
        (MODEL_LABEL, "mode"),
    ),
    "microagent:agent_duration_seconds": (
        "Wall time of each agent of a finished collaboration, by model and role.",
        (MODEL_LABEL, "role"),
    ),
    "microagent:time_to_first_token_seconds": (
        "Time from a streamed completion's submission to its first token, by model.",
        (MODEL_LABEL,),
    ),
}

#: ``/metrics`` family -> (kind, help, ``TierStats`` field), per engine with a tier.
TIER_SERIES: Final[dict[str, tuple[str, str, str]]] = {
    "microagent:tier_capacity_bytes": ("gauge", "Host KV tier RAM allocated.", "capacity_bytes"),
    "microagent:tier_blocks": ("gauge", "KV blocks the host tier holds.", "entries"),
    "microagent:tier_held_sessions": (
        "gauge",
        "Sessions whose host-tier blocks are kept for them (waiting on a tool).",
        "held_sessions",
    ),
    "microagent:tier_stored_bytes_total": (
        "counter",
        "Bytes copied from the device cache to the host tier.",
        "stored_bytes",
    ),
    "microagent:tier_loaded_blocks_total": (
        "counter",
        "KV blocks loaded back into the device cache from the tiers (tier hits).",
        "loaded_blocks",
    ),
    "microagent:tier_loaded_bytes_total": (
        "counter",
        "Bytes copied from the host tier back to the device cache.",
        "loaded_bytes",
    ),
    "microagent:tier_load_seconds_total": (
        "counter",
        "Time spent loading tier blocks back into the device cache.",
        "load_seconds",
    ),
    "microagent:tier_evicted_blocks_total": (
        "counter",
        "Host-tier blocks dropped to make room.",
        "evicted_blocks",
    ),
    "microagent:tier_held_evicted_blocks_total": (
        "counter",
        "Host-tier blocks of waiting sessions dropped (no cold block was left).",
        "held_evicted_blocks",
    ),
    "microagent:tier_disk_bytes": ("gauge", "Bytes the file tier holds.", "disk_bytes"),
    "microagent:tier_disk_read_blocks_total": (
        "counter",
        "File-tier blocks read back and found whole.",
        "disk_read_blocks",
    ),
    "microagent:tier_disk_rejected_blocks_total": (
        "counter",
        "File-tier blocks found missing, truncated or altered (a miss).",
        "disk_rejected_blocks",
    ),
}


@attrs.frozen
class EngineScrape:
    """What one scrape reads of the engines: the bridges, and the stats read from the
    engine processes beforehand (``await bridge.retention_stats()``,
    ``await bridge.tier_stats()``; a restarting engine has none)."""

    engines: Mapping[str, EngineBridge]
    retention: Mapping[str, RetentionStats] = attrs.field(factory=dict)
    tiers: Mapping[str, TierStats] = attrs.field(factory=dict)
    #: retained session turns the server tracks, per model
    sessions: Mapping[str, int] = attrs.field(factory=dict)


@attrs.define
class ServerMetrics:
    """One app's metrics; ``render`` is the ``/metrics`` exposition.

    ``inc`` and ``observe`` take a family's full name (``microagent:requests_total``)
    and its labels; the server is one event loop, the client library locks anyway.
    """

    registry: CollectorRegistry = attrs.field(factory=lambda: CollectorRegistry(auto_describe=True))
    collaborations_running: int = 0
    requests_running: int = 0
    _counters: dict[str, Counter] = attrs.field(factory=dict, init=False)
    _histograms: dict[str, Histogram] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        for name, (text, labels) in COUNTERS.items():
            self._counters[name] = Counter(name, text, labels, registry=self.registry)
        for name, (text, labels) in HISTOGRAMS.items():
            self._histograms[name] = Histogram(
                name, text, labels, registry=self.registry, buckets=DURATION_BUCKETS
            )

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to counter ``name`` under ``labels`` (all of its label names)."""
        counter = self._counters[name]
        (counter.labels(**labels) if labels else counter).inc(amount)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record ``seconds`` in histogram ``name`` under ``labels``."""
        self._histograms[name].labels(**labels).observe(max(0.0, seconds))

    def value(self, name: str, **labels: str) -> float:
        """Current value of a counter (0 when never incremented)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def add_usage(
        self, prompt: int, cached: int, completion: int, saved: int = 0, *, model: str
    ) -> None:
        """Count the tokens of one finished request or collaboration on ``model``."""
        for name, amount in (
            ("microagent:prompt_tokens_total", prompt),
            ("microagent:cached_tokens_total", cached),
            ("microagent:computed_prompt_tokens_total", max(0, prompt - cached)),
            ("microagent:completion_tokens_total", completion),
            ("microagent:saved_completion_tokens_total", saved),
        ):
            self.inc(name, amount, model_name=model)

    def observe_collaboration(self, outcome: Outcome, model: str) -> None:
        """The latency of a finished collaboration on ``model`` and of each of its agents
        (an agent on another model counts under that model's name)."""
        self.observe(
            "microagent:collaboration_duration_seconds",
            outcome.wall_time,
            model_name=model,
            mode=outcome.mode,
        )
        for agent in outcome.agents:
            if agent.started is None or agent.finished is None:
                continue
            self.observe(
                "microagent:agent_duration_seconds",
                agent.finished - agent.started,
                model_name=agent.model or model,
                role=agent.role or agent.name,
            )

    def render(self, scrape: EngineScrape) -> bytes:
        """The Prometheus text exposition: our series, then each engine's ``vllm:*``."""
        return generate_latest(_Exposition(self, scrape))


@attrs.frozen
class _Exposition:
    """One scrape's collectors in one (``generate_latest`` takes any ``collect()``)."""

    metrics: ServerMetrics
    scrape: EngineScrape

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.registry.collect()
        yield from _server_gauges(self.metrics)
        yield from engine_families(self.scrape)
        yield from merge_families(
            (name, collector.collect())
            for name, bridge in sorted(self.scrape.engines.items())
            if (collector := bridge.prometheus_collector()) is not None
        )


def _server_gauges(metrics: ServerMetrics) -> Iterator[Metric]:
    for name, text, value in (
        (
            "microagent:collaborations_running",
            "Collaborations in progress.",
            metrics.collaborations_running,
        ),
        (
            "microagent:requests_running",
            "Chat completion requests in progress.",
            metrics.requests_running,
        ),
        (
            "microagent:asyncio_tasks",
            "Tasks alive on the server's event loop (-1: not an asyncio loop).",
            _asyncio_tasks(),
        ),
    ):
        yield GaugeMetricFamily(name, text, value=value)


def engine_families(scrape: EngineScrape) -> Iterator[Metric]:
    """The per-engine series read at scrape time, each with a ``model_name`` label."""
    label = [MODEL_LABEL]
    gauges = {
        name: GaugeMetricFamily(name, text, labels=label)
        for name, text in (
            ("microagent:engine_requests_running", "Requests running in the engine's scheduler."),
            ("microagent:engine_requests_waiting", "Requests waiting in the engine's scheduler."),
            ("microagent:engine_requests_live", "Engine requests the bridge tracks as live."),
            ("microagent:engine_kv_cache_usage", "KV cache usage of the engine (0..1)."),
            ("microagent:engine_retained_blocks", "KV blocks held by retentions."),
            ("microagent:engine_retentions", "Live retentions."),
            ("microagent:session_turns", "Retained turns kept for the clients' next turns."),
        )
    }
    counters = {
        name: CounterMetricFamily(name, text, labels=label)
        for name, text in (
            ("microagent:engine_deaths_total", "Engine deaths (deaths while idle count)."),
            ("microagent:engine_restarts_total", "Engine restarts."),
            (
                "microagent:engine_retained_hit_tokens_total",
                "Cached prompt tokens served from retained handles.",
            ),
            (
                "microagent:engine_recomputed_tokens_total",
                "Prompt tokens recomputed after their blocks were evicted.",
            ),
        )
    }
    releases = CounterMetricFamily(
        "microagent:engine_retention_releases_total",
        "Retentions ended, by cause.",
        labels=[MODEL_LABEL, "cause"],
    )
    for name, bridge in sorted(scrape.engines.items()):
        stats = bridge.stats()
        for family, value in (
            ("microagent:engine_requests_running", stats.scheduler_running),
            ("microagent:engine_requests_waiting", stats.scheduler_waiting),
            ("microagent:engine_requests_live", stats.requests_live),
            ("microagent:engine_kv_cache_usage", stats.kv_cache_usage),
            ("microagent:session_turns", scrape.sessions.get(name, 0)),
        ):
            gauges[family].add_metric([name], value)
        for family, value in (
            ("microagent:engine_deaths_total", bridge.deaths),
            ("microagent:engine_restarts_total", bridge.restarts),
            ("microagent:engine_retained_hit_tokens_total", stats.retained_hit_tokens),
            ("microagent:engine_recomputed_tokens_total", stats.recomputed_tokens),
        ):
            counters[family].add_metric([name], value)
        kept = scrape.retention.get(name)
        if kept is not None:
            gauges["microagent:engine_retained_blocks"].add_metric([name], kept.retained_blocks)
            gauges["microagent:engine_retentions"].add_metric([name], kept.entries)
            for cause, count in sorted(kept.released.items()):
                releases.add_metric([name, cause], count)
    yield from gauges.values()
    yield from counters.values()
    yield releases
    yield from tier_families(scrape.tiers)


def tier_families(tiers: Mapping[str, TierStats]) -> Iterator[Metric]:
    """The host and file KV tiers of the engines that run one (``TIER_SERIES``)."""
    for family, (kind, text, field) in TIER_SERIES.items():
        metric: GaugeMetricFamily | CounterMetricFamily = (
            CounterMetricFamily(family, text, labels=[MODEL_LABEL])
            if kind == "counter"
            else GaugeMetricFamily(family, text, labels=[MODEL_LABEL])
        )
        for name, stats in sorted(tiers.items()):
            if stats.enabled:
                metric.add_metric([name], float(getattr(stats, field)))
        yield metric


def merge_families(collections: Iterable[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """Families of the same name from several engines' registries as one family each.

    ``collections``: (served model, that engine's families). Every engine's
    ``PrometheusStatLogger`` defines the same ``vllm:*`` families, told apart by their
    ``model_name`` label; exposed side by side they would repeat a family's ``# TYPE``
    line, which Prometheus refuses. A sample without the label (vLLM's info gauges,
    ``vllm:cache_config_info``) gets its engine's, so two engines' samples never collide.
    """
    merged: dict[str, Metric] = {}
    for model, families in collections:
        for family in families:
            kept = merged.get(family.name)
            if kept is None:
                kept = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            kept.samples.extend(
                sample
                if MODEL_LABEL in sample.labels
                else sample._replace(labels={**sample.labels, MODEL_LABEL: model})
                for sample in family.samples
            )
    return list(merged.values())


def _asyncio_tasks() -> int:
    """Tasks alive on the running asyncio loop (the scrape's own included); -1 elsewhere (trio)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running asyncio loop
        return -1
