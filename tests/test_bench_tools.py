"""The pure parts of bench/tools.py: contexts, the tool, the tables and the BENCHMARKS.md section.

No engine: the benchmark itself is run by hand on a quiet machine (see BENCHMARKS.md).
"""

from __future__ import annotations

import _tools_report as R
import anyio
import pytest
import tools as T


def run(system: str, load: int, rep: int, wall: float, steps: list[int]) -> dict[str, object]:
    return {
        "system": system,
        "load": load,
        "rep": rep,
        "wall_s": wall,
        "steps": len(steps),
        "tool_calls": len(steps) - 1,
        "computed_per_step": steps,
        "prompt_tokens": 9000,
        "loadavg_before": 0.1,
    }


DATA = {
    "settings": {"steps": 3, "tool_seconds": 0.2, "context_words": 900, "kv_blocks": 40,
                 "loads": [0, 2], "reps": 2},
    "machine": {"cpus": 2, "loadavg_at_start": 0.2, "seconds": 100},
    "runs": [
        run("microagent", 0, 0, 2.0, [2000, 60, 60, 60]),
        run("microagent", 0, 1, 3.0, [2000, 80, 60, 60]),
        run("client", 0, 0, 4.0, [2000, 100, 100, 100]),
        run("client", 0, 1, 4.0, [2000, 100, 100, 100]),
        run("microagent", 2, 0, 2.5, [2000, 60, 60, 60]),
        run("client", 2, 0, 5.0, [2000, 2100, 2100, 2100]),
    ],
}  # fmt: skip


def test_medians_and_ratios() -> None:
    rows = R.medians(DATA)
    assert rows[(0, "microagent")]["wall_s"] == 2.5
    assert rows[(0, "microagent")]["computed_after_first"] == pytest.approx((60 + 200 / 3) / 2)
    assert rows[(2, "client")]["computed_total"] == 8300
    text = R.tables(DATA)
    assert "| 0 | 0.62× |" in text  # 2.5 / 4.0
    assert "| 2 | 0.50× | 0.26× |" in text  # 2.5 / 5.0, 2180 / 8300


def test_context_and_tool_are_deterministic() -> None:
    assert T.context_text(3, 50) == T.context_text(3, 50) != T.context_text(4, 50)

    async def call() -> str:
        return await T.lookup("gamma")

    assert anyio.run(call) == "gamma: code 37"
