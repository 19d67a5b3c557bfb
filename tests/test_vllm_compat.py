"""``vllm._compat`` pieces that run outside the engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

from microagent.engine_bridge import SchedulerSnapshot, resolve_model
from microagent.engine_bridge.vllm._compat import StatSink


def test_bridges_opening_together_load_their_tokenizers_without_an_import_race() -> None:
    """Bridges open their tokenizers in worker threads. transformers' lazy modules fail when
    two threads load them at once in a fresh interpreter ("cannot import name
    'AutoTokenizer'"): ``HFTokenizer`` loads them one thread at a time."""
    script = textwrap.dedent(
        f"""
        import threading
        from microagent.engine_bridge.vllm._compat import HFTokenizer

        errors = []

        def load():
            try:
                HFTokenizer({str(resolve_model("default", progress=False))!r})
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(errors)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_each_engines_prometheus_logger_keeps_its_series_in_its_own_registry() -> None:
    """vLLM's ``PrometheusStatLogger`` unregisters every ``vllm:*`` series of the global
    registry when it is built: two engines (and a restarted one) would erase each other's.
    Bound to one registry each, two models and a restart of one keep all their series,
    nothing is registered twice, and nothing lands in the global registry."""
    from microagent.engine_bridge.vllm._compat import cpu_environment_defaults, prometheus_logger
    from prometheus_client import REGISTRY, CollectorRegistry
    from vllm.engine.arg_utils import AsyncEngineArgs

    cpu_environment_defaults()
    model = str(resolve_model("default", progress=False))
    configs = {
        name: AsyncEngineArgs(
            model=model, served_model_name=name, enforce_eager=True, max_model_len=512
        ).create_engine_config()
        for name in ("a", "b")
    }
    registries = []
    for name in ("a", "b", "b"):  # the second "b": that engine restarted
        registry = CollectorRegistry()
        logger = prometheus_logger(registry)(vllm_config=configs[name], engine_indexes=[0])
        logger.log_engine_initialized()  # vllm:cache_config_info, built late
        registries.append((name, registry))
    for name, registry in registries:
        families = list(registry.collect())
        names = [f.name for f in families]
        assert len(names) == len(set(names)) and "vllm:num_requests_running" in names
        assert "vllm:cache_config_info" in names
        labelled = {s.labels.get("model_name") for f in families for s in f.samples}
        assert labelled - {None} == {name}
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("vllm:")]


def test_the_stat_sink_folds_reports_into_one_scheduler_snapshot() -> None:
    """Gauges are the latest report's; cache counters and preemptions add up."""
    sink = StatSink()
    assert sink.snapshot == SchedulerSnapshot()

    def report(running: int, queries: int, hits: int, preempted: int) -> SimpleNamespace:
        prefix = SimpleNamespace(queries=queries, hits=hits, preempted_requests=preempted)
        return SimpleNamespace(
            num_running_reqs=running,
            num_waiting_reqs=2,
            num_skipped_waiting_reqs=1,
            kv_cache_usage=0.25 * running,
            prefix_cache_stats=prefix,
        )

    sink.observe(report(1, 100, 60, 0))
    sink.observe(report(3, 50, 10, 2))
    assert sink.snapshot == SchedulerSnapshot(
        running=3,
        waiting=3,
        prefix_cache_queries=150,
        prefix_cache_hits=70,
        kv_cache_usage=0.75,
        preemptions=2,
    )
