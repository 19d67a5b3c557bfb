"""``/metrics`` on the real engine with two served models: vLLM's own ``vllm:*`` series and
ours, each with a ``model_name`` label per model, histograms whole, and one family per name
(read back with prometheus_client's parser, as Prometheus would) — before and after one
engine is killed and restarted.

Two engines in one process is the case vLLM's global registry gets wrong (each new engine
unregisters the previous one's series): the session's shared engine and a second, small one
on the same weights under another name.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter as Tally
from collections.abc import Iterator

import httpx
import pytest
from _engine import RealEngine
from microagent.engine_bridge import EngineBridgeError, Sampling, VLLMBridge
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from test_server_helpers import LiveServer, live_server

SECOND = "second"


def families(text: str) -> dict[str, list[Sample]]:
    """Each family's samples by name; fails when a family is defined twice."""
    parsed = list(text_string_to_metric_families(text))
    twice = [name for name, n in Tally(f.name for f in parsed).items() if n > 1]
    assert twice == []
    return {f.name: f.samples for f in parsed}


def models_of(samples: list[Sample], suffix: str = "") -> dict[str, float]:
    """``model_name`` -> the summed value of the samples whose name ends with ``suffix``."""
    out: dict[str, float] = {}
    for s in samples:
        if s.name.endswith(suffix) and "model_name" in s.labels:
            out[s.labels["model_name"]] = out.get(s.labels["model_name"], 0.0) + s.value
    return out


@pytest.fixture(scope="module")
def two_models(real_engine: RealEngine) -> Iterator[tuple[LiveServer, VLLMBridge]]:
    """A server over the shared engine and a second, smallest engine under ``SECOND``."""
    second = VLLMBridge(
        "default", served_name=SECOND, max_num_seqs=2, max_model_len=1024, progress=False
    )
    real_engine.call(second.open)
    bridges = {real_engine.bridge.model: real_engine.bridge, SECOND: second}
    try:
        with live_server(lambda: bridges, portal=real_engine.portal, open_engines=False) as srv:
            yield srv, second
    finally:
        real_engine.call(second.close)


def _ask_each(srv: LiveServer, models: list[str]) -> None:
    """A streamed completion on each model (TTFT) and a vote collaboration on each."""
    for model in models:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Say one word about {model} rivers."}],
            "max_tokens": 6,
        }
        with httpx.stream(
            "POST", f"{srv.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
        ) as r:
            assert r.status_code == 200
            r.read()
        vote = {
            **body,
            "max_tokens": 16,
            "agents": [{"name": "voter", "count": 2}],
            "collaboration": {"mode": "vote", "early_stop": False},
        }
        assert (
            httpx.post(f"{srv.url}/v1/chat/completions", json=vote, timeout=120).status_code == 200
        )


def _check(text: str, models: set[str]) -> None:
    found = families(text)
    vllm = [name for name in found if name.startswith("vllm:")]
    assert len(vllm) > 10, vllm
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert set(models_of(found[name])) == models, name
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries"):
        counted = models_of(found[name], "_total")
        assert set(counted) == models and all(v > 0 for v in counted.values()), (name, counted)
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "microagent:collaboration_duration_seconds",
        "microagent:agent_duration_seconds",
        "microagent:time_to_first_token_seconds",
    ):
        samples = found[name]
        for suffix in ("_bucket", "_sum", "_count"):
            assert any(s.name == name + suffix for s in samples), (name, suffix)
        counts = models_of(samples, "_count")
        assert set(counts) == models and all(v >= 1 for v in counts.values()), (name, counts)
    for name in (
        "microagent:prompt_tokens",
        "microagent:computed_prompt_tokens",
        "microagent:completion_tokens",
        "microagent:engine_requests_running",
        "microagent:engine_kv_cache_usage",
        "microagent:engine_restarts",
    ):
        assert set(models_of(found[name])) == models, name


@pytest.mark.engine
def test_metrics_have_each_models_vllm_and_microagent_series_across_a_restart(
    two_models: tuple[LiveServer, VLLMBridge], real_engine: RealEngine
) -> None:
    srv, second = two_models
    models = {real_engine.bridge.model, SECOND}
    _ask_each(srv, sorted(models))
    response = httpx.get(f"{srv.url}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    _check(response.text, models)

    # The second engine dies and comes back: its fresh logger registers anew, nothing twice.
    restarts = second.restarts
    for pid in second.engine_core_pids():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 240
    while second.restarts == restarts:
        assert time.monotonic() < deadline, "the second engine did not restart"
        try:
            real_engine.call(second.generate, second.handle([1, 2, 3]), Sampling(max_tokens=2))
        except EngineBridgeError:
            time.sleep(0.5)
    real_engine.call(second.wait_ready)
    _ask_each(srv, [SECOND])
    text = httpx.get(f"{srv.url}/metrics").text
    _check(text, models)
    found = families(text)
    assert models_of(found["microagent:engine_restarts"])[SECOND] == restarts + 1
    real_engine.assert_idle()
    assert real_engine.call(second.wait_idle, 5.0)
