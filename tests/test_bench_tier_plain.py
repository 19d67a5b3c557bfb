"""bench/tier_plain.py's verdict: the tiered server's median throughput over vLLM's."""

from __future__ import annotations

import tier_plain as TP


def run(system: str, tokens_per_s: float) -> dict[str, object]:
    return {"system": system, "tokens_per_s": tokens_per_s}


def test_the_verdict_reads_medians_and_can_fail() -> None:
    runs = [run("vllm", 100.0), run("microagent-http-tier", 99.0),
            run("microagent-http-tier", 10.0), run("vllm", 100.0),
            run("microagent-http-tier", 98.5)]  # fmt: skip
    (ok,) = TP.targets(runs)
    assert ok["met"] and ok["measured"] == 0.985  # the median tiered run, not its mean
    (slow,) = TP.targets([run("vllm", 100.0), run("microagent-http-tier", 97.0)])
    assert not slow["met"] and slow["measured"] == 0.97
    (none,) = TP.targets([run("vllm", 100.0)])
    assert none["met"] is None and none["measured"] == "no data"
