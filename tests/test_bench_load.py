"""The pure parts of bench/load.py: arrivals, contexts, the tables and the BENCHMARKS.md section.

No engine: the benchmark itself is run by hand on a quiet machine (see BENCHMARKS.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import _load_report as R  # noqa: E402
import load as L  # noqa: E402


def run(system: str, rate: float, rep: int, p95: float, recomputed: int) -> dict[str, object]:
    return {
        "system": system,
        "rate_per_min": rate,
        "rep": rep,
        "loadavg_before": 0.1,
        "completed": 9,
        "failed": 0,
        "per_min": 5.0,
        "p50_s": p95 / 2,
        "p95_s": p95,
        "p99_s": p95,
        "computed_tokens": 1000,
        "recomputed_tokens": recomputed,
        "retained_hit_tokens": 0,
        "preemptions": 0,
    }


DATA = {
    "settings": {
        "collaborations_per_run": 9,
        "mix": ["vote5-reason"],
        "reps": 2,
        "kv_blocks": 40,
        "block_tokens": 128,
        "context_words": 700,
    },
    "machine": {"cpus": 2, "loadavg_at_start": 0.2, "seconds": 10},
    "runs": [
        run("microagent", 6, 0, 4.0, 100),
        run("microagent", 6, 1, 6.0, 300),
        run("ablation", 6, 0, 10.0, 800),
        run("ablation", 6, 1, 10.0, 800),
    ],
}


def test_arrivals_are_poisson_and_reproducible() -> None:
    a = L.arrivals(2.0, 500, seed=3)
    assert a == L.arrivals(2.0, 500, seed=3) and a == sorted(a)
    mean_gap = a[-1] / len(a)
    assert 0.4 < mean_gap < 0.6  # rate 2/s


def test_contexts_are_unique_per_seed() -> None:
    assert L.context_text(1, 50) != L.context_text(2, 50)
    assert L.context_text(1, 50) == L.context_text(1, 50)


def test_tables_take_medians_and_ratios_from_the_json() -> None:
    text = R.tables(DATA)
    assert "| 6 | microagent | 18 (0) | 5.00 | 2.5 | 5.0 | 5.0 | 1000 | 200 |" in text
    assert "| 6 | 0.50× | 0.25× |" in text


def test_the_benchmarks_section_is_replaced_not_duplicated(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n")
    R.update_benchmarks(doc, "first\n", "x.png")
    R.update_benchmarks(doc, "second\n", "x.png")
    text = doc.read_text()
    assert text.count(R.BEGIN) == 1 and "second" in text and "first" not in text
