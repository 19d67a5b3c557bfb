"""Server metrics, rendered as Prometheus text by hand (no client library needed).

Counters are plain dicts keyed by label tuples: the server is one event loop,
so no locking is needed. Engine gauges are read from the bridges at scrape
time — ``microagent_engine_requests_running`` comes from each engine's
scheduler, the number that proves cancelled requests really left the engine;
``microagent_asyncio_tasks`` counts the event loop's tasks (the soak bench
checks that it comes back to its idle level).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping

import attrs

from ..engine_bridge import EngineBridge, RetentionStats, TierStats

_Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: _Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


@attrs.define
class _Family:
    name: str
    kind: str
    help: str
    values: dict[_Labels, float] = attrs.field(factory=lambda: defaultdict(float))


@attrs.define
class ServerMetrics:
    """Counters of one app; ``render(engines)`` adds the engine gauges."""

    _families: dict[str, _Family] = attrs.field(factory=dict)
    collaborations_running: int = 0
    requests_running: int = 0

    def __attrs_post_init__(self) -> None:
        for name, kind, text in (
            (
                "microagent_requests_total",
                "counter",
                "Chat completion requests by kind and HTTP status.",
            ),
            ("microagent_collaborations_total", "counter", "Collaborations by mode and status."),
            ("microagent_prompt_tokens_total", "counter", "Prompt tokens of every engine request."),
            (
                "microagent_cached_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
            ),
            ("microagent_completion_tokens_total", "counter", "Completion tokens generated."),
            (
                "microagent_saved_completion_tokens_total",
                "counter",
                "Completion tokens avoided by pruning.",
            ),
            ("microagent_early_stops_total", "counter", "Collaborations stopped early, by mode."),
            ("microagent_pruned_agents_total", "counter", "Agents pruned, by mode."),
            (
                "microagent_rejected_total",
                "counter",
                "Requests refused for overload or shutdown, by reason.",
            ),
            (
                "microagent_engine_retries_total",
                "counter",
                "Requests run again after an engine death, by kind and outcome.",
            ),
            (
                "microagent_engine_resumed_tokens_total",
                "counter",
                "Generated tokens a rerun after an engine death kept instead of decoding again.",
            ),
            (
                "microagent_engine_lost_total",
                "counter",
                "Requests lost to an engine death (a 503 or a stream's error event), "
                "by kind and why they were not run again.",
            ),
            (
                "microagent_sse_dropped_events_total",
                "counter",
                "Stream events dropped for slow clients.",
            ),
        ):
            self._families[name] = _Family(name, kind, text)

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to counter ``name`` under ``labels``."""
        family = self._families[name]
        family.values[tuple(sorted(labels.items()))] += amount

    def value(self, name: str, **labels: str) -> float:
        """Current value of a counter (0 when never incremented)."""
        return self._families[name].values.get(tuple(sorted(labels.items())), 0.0)

    def add_usage(self, prompt: int, cached: int, completion: int, saved: int = 0) -> None:
        """Count the tokens of one finished request or collaboration."""
        self.inc("microagent_prompt_tokens_total", prompt)
        self.inc("microagent_cached_tokens_total", cached)
        self.inc("microagent_completion_tokens_total", completion)
        self.inc("microagent_saved_completion_tokens_total", saved)

    def render(
        self,
        engines: Mapping[str, EngineBridge],
        retention: Mapping[str, RetentionStats] | None = None,
        tiers: Mapping[str, TierStats] | None = None,
    ) -> str:
        """The Prometheus text exposition of every counter and gauge.

        ``retention`` and ``tiers`` hold each engine's retention and KV-tier stats
        (read from the engine process by the caller: ``await bridge.retention_stats()``,
        ``await bridge.tier_stats()``).
        """
        lines: list[str] = []
        for family in self._families.values():
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            if not family.values and family.name in _UNLABELLED:
                lines.append(f"{family.name} 0")
            for labels, value in sorted(family.values.items()):
                lines.append(f"{family.name}{_labels(labels)} {_number(value)}")
        running = waiting = live = 0
        per_engine: list[tuple[str, int, int, int, float]] = []
        for name, bridge in engines.items():
            stats = bridge.stats()
            running += stats.scheduler_running
            waiting += stats.scheduler_waiting
            live += stats.requests_live
            per_engine.append(
                (
                    name,
                    stats.scheduler_running,
                    stats.scheduler_waiting,
                    stats.requests_live,
                    stats.kv_cache_usage,
                )
            )
        gauges = (
            (
                "microagent_engine_requests_running",
                "Requests running in the engines' schedulers.",
                running,
            ),
            (
                "microagent_engine_requests_waiting",
                "Requests waiting in the engines' schedulers.",
                waiting,
            ),
            ("microagent_engine_requests_live", "Engine requests the bridges track as live.", live),
            (
                "microagent_collaborations_running",
                "Collaborations in progress.",
                self.collaborations_running,
            ),
            (
                "microagent_requests_running",
                "Chat completion requests in progress.",
                self.requests_running,
            ),
            (
                "microagent_asyncio_tasks",
                "Tasks alive on the server's event loop (-1: not an asyncio loop).",
                _asyncio_tasks(),
            ),
        )
        for name, text, total in gauges:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {total}"]
        lines += [
            "# HELP microagent_engine_kv_cache_usage KV cache usage per engine (0..1).",
            "# TYPE microagent_engine_kv_cache_usage gauge",
        ]
        for name, _, _, _, usage in per_engine:
            lines.append(
                f'microagent_engine_kv_cache_usage{{model="{_escape(name)}"}} {_number(usage)}'
            )
        lines += self._lifecycle_lines(engines)
        lines += self._retention_lines(engines, retention or {})
        lines += self._tier_lines(tiers or {})
        return "\n".join(lines) + "\n"

    @staticmethod
    def _tier_lines(tiers: Mapping[str, TierStats]) -> list[str]:
        """The host and file KV tiers of the engines that run one (``TIER_SERIES``)."""
        lines: list[str] = []
        for family, (kind, text, field) in TIER_SERIES.items():
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
            for name, stats in sorted(tiers.items()):
                if stats.enabled:
                    value = getattr(stats, field)
                    lines.append(f'{family}{{model="{_escape(name)}"}} {_number(value)}')
        return lines

    @staticmethod
    def _lifecycle_lines(engines: Mapping[str, EngineBridge]) -> list[str]:
        """Deaths and restarts of each engine (kept by its bridge, so deaths while idle count)."""
        deaths = ["# HELP microagent_engine_deaths_total Engine deaths, by model."]
        restarts = ["# HELP microagent_engine_restarts_total Engine restarts, by model."]
        deaths.append("# TYPE microagent_engine_deaths_total counter")
        restarts.append("# TYPE microagent_engine_restarts_total counter")
        for name, bridge in engines.items():
            model = f'model="{_escape(name)}"'
            deaths.append(f"microagent_engine_deaths_total{{{model}}} {bridge.deaths}")
            restarts.append(f"microagent_engine_restarts_total{{{model}}} {bridge.restarts}")
        return deaths + restarts

    @staticmethod
    def _retention_lines(
        engines: Mapping[str, EngineBridge], retention: Mapping[str, RetentionStats]
    ) -> list[str]:
        families: dict[str, tuple[str, str, list[str]]] = {
            "microagent_engine_retained_blocks": ("gauge", "KV blocks held by retentions.", []),
            "microagent_engine_retentions": ("gauge", "Live retentions.", []),
            "microagent_engine_retention_releases_total": (
                "counter",
                "Retentions ended, by cause.",
                [],
            ),
            "microagent_engine_retained_hit_tokens_total": (
                "counter",
                "Cached prompt tokens served from retained handles.",
                [],
            ),
            "microagent_engine_recomputed_tokens_total": (
                "counter",
                "Prompt tokens recomputed after their blocks were evicted.",
                [],
            ),
        }
        for name, bridge in engines.items():
            model = f'model="{_escape(name)}"'
            stats = bridge.stats()
            for family, value in (
                ("microagent_engine_retained_hit_tokens_total", stats.retained_hit_tokens),
                ("microagent_engine_recomputed_tokens_total", stats.recomputed_tokens),
            ):
                families[family][2].append(f"{family}{{{model}}} {value}")
            kept = retention.get(name)
            if kept is None:
                continue
            families["microagent_engine_retained_blocks"][2].append(
                f"microagent_engine_retained_blocks{{{model}}} {kept.retained_blocks}"
            )
            families["microagent_engine_retentions"][2].append(
                f"microagent_engine_retentions{{{model}}} {kept.entries}"
            )
            for cause, count in sorted(kept.released.items()):
                families["microagent_engine_retention_releases_total"][2].append(
                    f'microagent_engine_retention_releases_total{{{model},cause="{cause}"}} {count}'
                )
        lines: list[str] = []
        for family, (kind, text, values) in families.items():
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}", *values]
        return lines


#: ``/metrics`` family -> (kind, help, ``TierStats`` field), per engine with a tier.
TIER_SERIES: dict[str, tuple[str, str, str]] = {
    "microagent_tier_capacity_bytes": ("gauge", "Host KV tier RAM allocated.", "capacity_bytes"),
    "microagent_tier_blocks": ("gauge", "KV blocks the host tier holds.", "entries"),
    "microagent_tier_held_sessions": (
        "gauge",
        "Sessions whose host-tier blocks are kept for them (waiting on a tool).",
        "held_sessions",
    ),
    "microagent_tier_stored_bytes_total": (
        "counter",
        "Bytes copied from the device cache to the host tier.",
        "stored_bytes",
    ),
    "microagent_tier_loaded_blocks_total": (
        "counter",
        "KV blocks loaded back into the device cache from the tiers (tier hits).",
        "loaded_blocks",
    ),
    "microagent_tier_loaded_bytes_total": (
        "counter",
        "Bytes copied from the host tier back to the device cache.",
        "loaded_bytes",
    ),
    "microagent_tier_load_seconds_total": (
        "counter",
        "Time spent loading tier blocks back into the device cache.",
        "load_seconds",
    ),
    "microagent_tier_evicted_blocks_total": (
        "counter",
        "Host-tier blocks dropped to make room.",
        "evicted_blocks",
    ),
    "microagent_tier_held_evicted_blocks_total": (
        "counter",
        "Host-tier blocks of waiting sessions dropped (no cold block was left).",
        "held_evicted_blocks",
    ),
    "microagent_tier_disk_bytes": ("gauge", "Bytes the file tier holds.", "disk_bytes"),
    "microagent_tier_disk_read_blocks_total": (
        "counter",
        "File-tier blocks read back and found whole.",
        "disk_read_blocks",
    ),
    "microagent_tier_disk_rejected_blocks_total": (
        "counter",
        "File-tier blocks found missing, truncated or altered (a miss).",
        "disk_rejected_blocks",
    ),
}

_UNLABELLED = {
    "microagent_prompt_tokens_total",
    "microagent_cached_tokens_total",
    "microagent_completion_tokens_total",
    "microagent_saved_completion_tokens_total",
    "microagent_sse_dropped_events_total",
}


def _asyncio_tasks() -> int:
    """Tasks alive on the running asyncio loop (the scrape's own included); -1 elsewhere (trio)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running asyncio loop
        return -1


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
