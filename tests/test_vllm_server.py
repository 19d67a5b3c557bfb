"""``microagent.testing``'s vLLM server helpers that need no server: reading its counters."""

from __future__ import annotations

from microagent.testing import VLLM_COUNTERS, metric_delta, parse_metrics


def test_parse_metrics_sums_label_sets() -> None:
    text = (
        "# HELP vllm:prompt_tokens_total x\n"
        'vllm:prompt_tokens_total{engine="0",model_name="bench"} 120.0\n'
        'vllm:prompt_tokens_total{engine="1",model_name="bench"} 5.0\n'
        'vllm:prefix_cache_hits_total{engine="0"} 64\n'
        "vllm:unrelated_total 3\n"
    )
    m = parse_metrics(text)
    assert set(m) == set(VLLM_COUNTERS)  # an absent counter reads 0
    assert m["vllm:prompt_tokens_total"] == 125.0
    assert m["vllm:prefix_cache_hits_total"] == 64.0
    assert m["vllm:request_success_total"] == 0.0
    delta = metric_delta(m, {**m, "vllm:prompt_tokens_total": 200.0})
    assert delta["vllm:prompt_tokens_total"] == 75.0 and delta["vllm:prefix_cache_hits_total"] == 0
