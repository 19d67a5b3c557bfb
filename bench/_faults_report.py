"""Summary, table and the BENCHMARKS.md section of ``bench/faults.py``, all from its JSON."""

from __future__ import annotations

import math
import statistics
from typing import Any

from _sections import machine_sentence

#: envelope key -> what it measures (the table's first column)
ENVELOPES = {
    "abort_to_idle_ms": "abort → scheduler running 0",
    "death_to_error_ms": "EngineCore killed → `EngineDied` in the consumer",
    "restart_to_success_s": "EngineCore killed → first successful request",
}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest rank: a value that was measured."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per envelope: trials, p50, p95, max (and min) over the recorded trials."""
    out: dict[str, dict[str, float]] = {}
    for key in ENVELOPES:
        values = [float(v) for v in data["trials"].get(key, [])]
        if not values:
            continue
        out[key] = {
            "n": len(values),
            "min": min(values),
            "p50": statistics.median(values),
            "p95": percentile(values, 95),
            "max": max(values),
        }
    return out


def table(data: dict[str, Any]) -> str:
    s = data["settings"]
    m = data.get("machine", {})
    lines = [
        f"Settings: {s['model']} on vLLM {s.get('vllm', '?')}, generations of "
        f"{s['max_tokens']} tokens, abort after {s['abort_after_tokens']} tokens, kill after "
        f"{s['kill_after_tokens']}. Machine: {machine_sentence(m)}.",
        "",
        "| envelope | trials | p50 | p95 | max |",
        "|---|---|---|---|---|",
    ]
    for key, row in summarize(data).items():
        unit = "s" if key.endswith("_s") else "ms"
        digits = 1 if unit == "s" else 0
        cells = " | ".join(f"{row[q]:.{digits}f} {unit}" for q in ("p50", "p95", "max"))
        lines.append(f"| {ENVELOPES[key]} | {row['n']:.0f} | {cells} |")
    return "\n".join(lines) + "\n"
