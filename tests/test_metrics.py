"""``/metrics`` without an engine: the tier and retention series per engine, our counters and
histograms with ``model_name``, and several engines' ``vllm:*`` families merged into one each.

Every exposition is read back with prometheus_client's own parser, as Prometheus would.
"""

from __future__ import annotations

import inspect
import json
import re
from collections import Counter as Tally
from pathlib import Path

import pytest
from microagent.collab import AgentRecord, Outcome, Usage
from microagent.engine_bridge import RetentionStats, TierStats
from microagent.server._metrics import TIER_SERIES, EngineScrape, ServerMetrics
from microagent.testing import ScriptedEngine
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

ROOT = Path(__file__).resolve().parents[1]


def samples(text: str) -> dict[str, list[Sample]]:
    """Each family's samples, by family name; fails on a family defined twice."""
    families = list(text_string_to_metric_families(text))
    twice = [name for name, n in Tally(f.name for f in families).items() if n > 1]
    assert twice == []
    return {f.name: f.samples for f in families}


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def value(found: list[Sample], name: str, **labels: str) -> float | None:
    return next((s.value for s in found if s.name == name and s.labels == labels), None)


TIERED = TierStats(
    enabled=True,
    capacity_bytes=94_371_840,
    entries=7,
    held_sessions=2,
    stored_bytes=8_847_360,
    loaded_blocks=3,
    loaded_bytes=8_847_360,
    load_seconds=0.25,
    evicted_blocks=4,
    held_evicted_blocks=1,
)


def test_tier_series_name_each_engine_with_a_tier_and_skip_the_others() -> None:
    engines = {"m1": ScriptedEngine(model="m1"), "m2": ScriptedEngine(model="m2")}
    scrape = EngineScrape(engines, tiers={"m1": TIERED, "m2": TierStats()})
    text = ServerMetrics().render(scrape).decode()
    found, kinds = samples(text), types(text)
    for family, (kind, _, field) in TIER_SERIES.items():
        base = family.removesuffix("_total")
        assert kinds[base] == kind
        sample = family if kind == "gauge" else base + "_total"
        assert value(found[base], sample, model_name="m1") == float(getattr(TIERED, field))
        assert value(found[base], sample, model_name="m2") is None
    assert 'microagent:tier_load_seconds_total{model_name="m1"} 0.25' in text.splitlines()


def test_retention_series_carry_the_model_and_the_release_cause() -> None:
    engines = {"m1": ScriptedEngine(model="m1"), "m2": ScriptedEngine(model="m2")}
    kept = RetentionStats(entries=2, retained_blocks=9, released={"expired": 3, "superseded": 1})
    text = ServerMetrics().render(EngineScrape(engines, retention={"m1": kept})).decode()
    found = samples(text)
    blocks = found["microagent:engine_retained_blocks"]
    assert value(blocks, "microagent:engine_retained_blocks", model_name="m1") == 9
    assert value(blocks, "microagent:engine_retained_blocks", model_name="m2") is None
    entries = found["microagent:engine_retentions"]
    assert value(entries, "microagent:engine_retentions", model_name="m1") == 2
    releases = found["microagent:engine_retention_releases"]
    name = "microagent:engine_retention_releases_total"
    assert value(releases, name, model_name="m1", cause="expired") == 3
    assert value(releases, name, model_name="m1", cause="superseded") == 1
    for family in ("microagent:engine_retained_hit_tokens", "microagent:engine_recomputed_tokens"):
        assert {s.labels["model_name"] for s in found[family]} == {"m1", "m2"}
    running = found["microagent:engine_requests_running"]
    assert {s.labels["model_name"] for s in running} == {"m1", "m2"}


def test_usage_and_latency_are_counted_per_model() -> None:
    metrics = ServerMetrics()
    metrics.add_usage(100, 60, 20, 5, model="m1")
    metrics.inc("microagent:requests_total", kind="collaboration", status="200")
    outcome = Outcome(
        mode="vote",
        answer="yes",
        agents=(
            AgentRecord(name="a", role="solver", started=1.0, finished=3.5),
            AgentRecord(name="b", role="judge", model="m2", started=1.0, finished=2.0),
            AgentRecord(name="c", role="solver"),  # never ran: no duration
        ),
        usage=Usage(),
        wall_time=4.0,
    )
    metrics.observe_collaboration(outcome, "m1")
    text = metrics.render(EngineScrape({})).decode()
    found, kinds = samples(text), types(text)
    tokens = found["microagent:computed_prompt_tokens"]
    assert value(tokens, "microagent:computed_prompt_tokens_total", model_name="m1") == 40
    assert metrics.value("microagent:cached_tokens_total", model_name="m1") == 60
    assert metrics.value("microagent:saved_completion_tokens_total", model_name="m1") == 5
    assert kinds["microagent:collaboration_duration_seconds"] == "histogram"
    wall = found["microagent:collaboration_duration_seconds"]
    name = "microagent:collaboration_duration_seconds"
    assert value(wall, name + "_sum", model_name="m1", mode="vote") == 4.0
    assert value(wall, name + "_count", model_name="m1", mode="vote") == 1
    assert value(wall, name + "_bucket", model_name="m1", mode="vote", le="+Inf") == 1
    agents = found["microagent:agent_duration_seconds"]
    name = "microagent:agent_duration_seconds"
    assert value(agents, name + "_sum", model_name="m1", role="solver") == 2.5
    assert value(agents, name + "_count", model_name="m1", role="solver") == 1
    assert value(agents, name + "_sum", model_name="m2", role="judge") == 1.0


class _Exporting(ScriptedEngine):
    """A scripted engine with its own registry of ``vllm:*``-like series."""

    def __init__(self, model: str) -> None:
        super().__init__(model=model)
        self.registry = CollectorRegistry()
        running = Counter(
            "vllm:prompt_tokens", "Prompt tokens.", ["model_name", "engine"], registry=self.registry
        )
        running.labels(model, "0").inc(7)
        ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "TTFT.",
            ["model_name", "engine"],
            registry=self.registry,
        )
        ttft.labels(model, "0").observe(0.2)
        info = Gauge(
            "vllm:cache_config_info", "Cache config.", ["block_size"], registry=self.registry
        )
        info.labels("16").set(1)  # no model_name: vLLM's info gauges carry none

    def prometheus_collector(self) -> Collector | None:
        return self.registry


def test_each_engines_vllm_series_are_merged_into_one_family() -> None:
    """Two engines define the same families: one ``# TYPE`` each, both models' samples."""
    engines = {"a": _Exporting("a"), "b": _Exporting("b"), "c": ScriptedEngine(model="c")}
    text = ServerMetrics().render(EngineScrape(engines)).decode()
    found = samples(text)
    assert text.count("# TYPE vllm:prompt_tokens_total counter") == 1
    assert text.count("# TYPE vllm:time_to_first_token_seconds histogram") == 1
    tokens = found["vllm:prompt_tokens"]
    assert value(tokens, "vllm:prompt_tokens_total", model_name="a", engine="0") == 7
    assert value(tokens, "vllm:prompt_tokens_total", model_name="b", engine="0") == 7
    ttft = found["vllm:time_to_first_token_seconds"]
    assert {s.labels["model_name"] for s in ttft if s.name.endswith("_count")} == {"a", "b"}
    info = found["vllm:cache_config_info"]
    assert sorted(s.labels["model_name"] for s in info) == ["a", "b"]  # the engine's name added


def test_two_apps_in_one_process_keep_their_own_counters() -> None:
    """Each app owns its registry: nothing global is registered twice or shared."""
    first, second = ServerMetrics(), ServerMetrics()
    first.inc("microagent:rejected_total", reason="quota")
    assert first.value("microagent:rejected_total", reason="quota") == 1
    assert second.value("microagent:rejected_total", reason="quota") == 0


#: What a sample's name adds to its family's (a counter's total, a histogram's parts).
_SUFFIX = r"_(total|bucket|sum|count)$"


def test_the_grafana_dashboard_reads_only_series_that_exist() -> None:
    """Every ``microagent:*`` series ``docs/grafana.json`` queries is one ``/metrics`` has,
    and every ``vllm:*`` one is a family vLLM's ``PrometheusStatLogger`` defines."""
    dashboard = json.loads((ROOT / "docs" / "grafana.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    wanted = {m for e in exprs for m in re.findall(r"(?:vllm|microagent):[a-z0-9_]+", e)}
    assert any(w.startswith("vllm:") for w in wanted)
    assert any(w.startswith("microagent:") for w in wanted)
    metrics = ServerMetrics()
    metrics.observe("microagent:time_to_first_token_seconds", 0.1, model_name="m1")
    engines = {"m1": ScriptedEngine(model="m1")}
    kept = RetentionStats(entries=1, retained_blocks=1, released={"expired": 1})
    scrape = EngineScrape(engines, retention={"m1": kept}, tiers={"m1": TIERED})
    text = metrics.render(scrape).decode()
    shown = {f.name for f in text_string_to_metric_families(text)}  # labelled: no sample yet
    ours = {re.sub(_SUFFIX, "", w) for w in wanted if w.startswith("microagent:")}
    assert ours - shown == set()
    loggers = pytest.importorskip("vllm.v1.metrics.loggers")
    defined = set(re.findall(r'name="(vllm:[a-z0-9_]+)"', inspect.getsource(loggers)))
    theirs = {re.sub(_SUFFIX, "", w) for w in wanted if w.startswith("vllm:")}
    assert theirs - defined == set()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["targets"] for p in panels)
