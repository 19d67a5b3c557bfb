"""The pure parts of bench/faults.py: percentiles, the table and the BENCHMARKS.md section.

No engine: the benchmark itself runs by hand on a quiet machine (see BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any

import _faults_report as R
import pytest

DATA: dict[str, Any] = {
    "settings": {
        "model": "SmolLM2-135M-Instruct",
        "vllm": "0.32.0",
        "max_tokens": 400,
        "abort_after_tokens": 4,
        "kill_after_tokens": 4,
    },
    "machine": {"cpus": 2, "loadavg_at_start": 0.3, "seconds": 600},
    "trials": {
        "abort_to_idle_ms": [float(v) for v in range(1, 21)],  # 1..20 ms
        "death_to_error_ms": [70.0] * 19 + [300.0],
        "restart_to_success_s": [24.0, 25.0, 26.0],
    },
}


def test_percentiles_are_measured_values_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert R.percentile(values, 50) == 10.0
    assert R.percentile(values, 95) == 19.0
    assert R.percentile(values, 100) == 20.0
    assert R.percentile([5.0], 95) == 5.0
    with pytest.raises(ValueError):
        R.percentile([], 50)


def test_summary_and_table() -> None:
    summary = R.summarize(DATA)
    assert summary["abort_to_idle_ms"] == {
        "n": 20,
        "min": 1.0,
        "p50": 10.5,
        "p95": 19.0,
        "max": 20.0,
    }
    assert (
        summary["death_to_error_ms"]["p95"] == 70.0 and summary["death_to_error_ms"]["max"] == 300.0
    )
    table = R.table(DATA)
    assert "| abort → scheduler running 0 | 20 | 10 ms | 19 ms | 20 ms |" in table
    assert (
        "| EngineCore killed → first successful request | 3 | 25.0 s | 26.0 s | 26.0 s |" in table
    )
    assert "NOT a quiet machine" not in table
    forced = {**DATA, "machine": {**DATA["machine"], "forced": True}}
    assert "NOT a quiet machine" in R.table(forced)
