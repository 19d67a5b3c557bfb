"""bench/agents.py: the agent programs, the grid, the report, and a tiny scripted run.

The end-to-end test runs the benchmark with ``--engine scripted`` (the
ScriptedEngine in process and ``microagent serve --engine scripted`` as two child
processes) on tiny programs, then reruns it in the same folder: the second run
must resume (no cell runs twice) and a cell missing from the JSON must be the
only one run again. The real-engine benchmark is run by hand on a quiet machine.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import _agents_programs as P
import _agents_report as R
import agents as A
import pytest

# -- the programs ----------------------------------------------------------------------------


def test_programs_are_paired_reproducible_and_share_only_the_system_prompt() -> None:
    shape = P.SHAPES["swe"]
    first = P.programs(shape, P.Scale(), 2.0, 6, 0, seed=7)
    again = P.programs(shape, P.Scale(), 2.0, 6, 0, seed=7)
    assert first == again  # every system gets the same arrivals, texts and tool durations
    other = P.programs(shape, P.Scale(), 2.0, 6, 1, seed=7)
    assert [p.task for p in other] != [p.task for p in first]
    assert [p.arrival for p in first] == sorted(p.arrival for p in first)
    assert len({p.system for p in first}) == 1
    heads = [p.task.split()[:2] for p in first]  # "Task <pid>:" first: no common prefix
    assert len({tuple(h) for h in heads}) == len(heads)
    assert len({p.pid for p in first}) == len(first)


@pytest.mark.parametrize(
    ("name", "turns", "median", "p95"), [("bfcl", (5, 7), 1.0, 5.0), ("swe", (8, 11), 3.0, 20.0)]
)
def test_shapes_have_the_specified_turns_sizes_and_tool_durations(
    name: str, turns: tuple[int, int], median: float, p95: float
) -> None:
    shape = P.SHAPES[name]
    progs = [
        P.draw_program(shape, P.Scale(), random.Random(i), f"p{i}", i, 0.0) for i in range(400)
    ]
    assert {p.turns for p in progs} <= set(range(turns[0], turns[1] + 1))
    lo, hi = shape.initial_tokens
    assert all(lo <= p.task_tokens - 8 <= hi + 14 for p in progs)
    assert all(p.contexts()[-1] <= shape.max_context + 64 for p in progs)
    seconds = sorted(t.seconds for p in progs for t in p.tools)
    assert statistics.median(seconds) == pytest.approx(median, rel=0.15)
    assert seconds[int(0.95 * len(seconds))] == pytest.approx(p95, rel=0.25)
    tokens = [t.tokens for p in progs for t in p.tools]
    assert max(tokens) <= shape.result_tokens[1] + 20


def test_words_are_about_one_token_each_in_the_scripted_tokenizer() -> None:
    from microagent.testing import ToyTokenizer

    text, count = P.words(random.Random(0), 300)
    assert abs(len(ToyTokenizer().encode(" " + text)) - count) <= 2


def test_quick_scale_shrinks_contexts_turns_and_tool_time() -> None:
    shape = P.SHAPES["swe"]
    full = P.working_set(shape, P.Scale(), 2.0, 200.0, 25.0)
    quick = P.working_set(shape, A.QUICK_SCALE, 2.0, 200.0, 25.0)
    assert quick.max_context < full.max_context / 2
    assert quick.duration_s < full.duration_s / 2
    assert P.working_set(shape, P.Scale(), 4.0, 200.0, 25.0).tokens == pytest.approx(
        2 * full.tokens
    )  # Little's law: twice the rate, twice the live tokens


def test_kv_blocks_follow_the_pressure_down_to_the_floor() -> None:
    assert P.kv_blocks(16_000, 1.6, 128, 66) == math.ceil(16_000 / 1.6 / 128)
    assert P.kv_blocks(16_000, 3.0, 128, 66) == 66  # vLLM needs one max_model_len sequence
    assert P.kv_blocks(16_000, 0.75, 128, 66) > P.kv_blocks(16_000, 1.6, 128, 66)


# -- the grid ---------------------------------------------------------------------------------


def test_default_grid_is_the_headline_the_pressure_sweep_and_a_light_anchor() -> None:
    args = A.parse_args(["--block", "128"])
    cells = A.grid(args, "swe")
    rates = (A.CPU_RATES if args.cpu_defaults else A.RATES)["swe"]
    headline = {(s, r) for s, pr, r in cells if pr == 1.6}
    assert {(s, r) for s in A.DEFAULT_SYSTEMS for r in rates[1:]} == headline - {
        ("microagent", rates[0]),
        ("vllm", rates[0]),
    }
    assert {r for s, r in headline if s == "microagent"} == set(rates)  # >= 4 rates
    assert {pr for s, pr, r in cells if s == "vllm" and r == rates[-1]} == set(A.PRESSURES)
    assert {s for s, pr, r in cells if pr != 1.6} == {"microagent", "vllm"}


def test_a_cpu_run_sizes_max_model_len_to_its_longest_program() -> None:
    """A scaled run's engine fits the longest scaled program, so the cache's floor (one such
    sequence) leaves room for pressure; the model's 8 192 stays the ceiling."""
    small = A.engine_settings(A.CPU_SCALE)["max_model_len"]
    longest = max(round(s.max_context * A.CPU_SCALE.context) for s in P.SHAPES.values())
    assert longest + A.CPU_SCALE.max_tokens <= small < longest + 512 and small % 128 == 0
    assert A.engine_settings(P.Scale(context=2.0))["max_model_len"] == 8192


def test_scripted_engine_skips_vllms_servers(capsys: pytest.CaptureFixture[str]) -> None:
    args = A.parse_args(["--engine", "scripted", "--systems", "microagent", "vllm"])
    assert args.systems == ["microagent"]
    assert "skipping vllm" in capsys.readouterr().out


def test_a_cell_deadline_counts_the_unfinished_programs_as_failed() -> None:
    class Stuck:
        name = "stuck"

        async def counters(self) -> dict[str, float | None]:
            return {"preemptions": 0, "queue_s": None}

        async def program(self, p: P.Program, turns: list[dict[str, Any]]) -> None:
            turns.append({"ttft_s": 0.01, "latency_s": 0.01, "prompt": 10, "cached": 0,
                          "completion": 2})  # fmt: skip
            if p.index:
                await asyncio.sleep(60)  # a program the deadline has to cut

    programs = P.programs(P.SHAPES["bfcl"], P.Scale(time=0.0), 60_000.0, 3, 0, seed=0)
    result = asyncio.run(A.run_cell(Stuck(), programs, timeout=0.5))
    assert [p["ok"] for p in result["programs"]] == [True, False, False]
    assert all("deadline" in p["error"] for p in result["programs"][1:])
    assert result["wall_s"] < 5 and result["preemptions"] == 0 and result["queue_s"] is None
    cell = {**_cell("microagent", 1.0, 1.0, 10), **result}
    row = next(iter(R.rows({"cells": [cell]}).values()))
    assert row["failed"] == 2 and row["p95_s"] == math.inf


# -- the report -------------------------------------------------------------------------------


def test_percentile_is_nearest_rank_and_failures_are_infinitely_late() -> None:
    assert R.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert R.percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    assert R.percentile([1.0] * 19 + [math.inf], 95) == 1.0
    assert R.percentile([1.0] * 9 + [math.inf], 95) == math.inf
    assert math.isnan(R.percentile([], 50))


def _cell(system: str, rate: float, latency: float, computed: int, **kw: Any) -> dict[str, Any]:
    turns = [
        {"ttft_s": 0.5, "latency_s": 1.0, "prompt": 1000, "cached": 1000 - computed // 2,
         "completion": 32},
        {"ttft_s": kw.get("ttft", 0.2), "latency_s": 1.0, "prompt": 1400,
         "cached": 1400 - computed // 2, "completion": 32},
    ]  # fmt: skip
    programs = [
        {"pid": f"p{i}", "index": i, "arrival_s": float(i), "finish_s": i + latency,
         "tool_s": latency / 2, "turns_planned": 2, "turns": turns, "ok": True}
        for i in range(10)
    ]  # fmt: skip
    return {
        "key": A.cell_key(system, "swe", 1.6, rate, 0),
        "system": system, "shape": "swe", "pressure": 1.6, "rate_per_min": rate, "rep": 0,
        "blocks": 80, "block_tokens": 128, "clamped": False, "pressure_at_rate": 1.6,
        "loadavg_before": 0.1, "wall_s": 600.0 / kw.get("speed", 1.0), "programs": programs,
        "preemptions": 0, "queue_s": None, "retained_hit_tokens": 0,
    }  # fmt: skip


def test_targets_compare_with_the_plain_client_and_say_which_baseline() -> None:
    cells = []
    for rate in (1.0, 2.0):
        cells.append(_cell("microagent", rate, 10.0, 1200, ttft=0.05, speed=2.5))
        cells.append(_cell("vllm", rate, 20.0, 2000, ttft=0.2))
    goals = {g["target"]: g for g in R.targets({"cells": cells})}
    x_floor = goals["microagent: prompt computed <= 1.3x the floor at 1.6x pressure (swe)"]
    assert x_floor["measured"] == pytest.approx(1200 / 1432, rel=0.01)  # floor: 1400 + 32
    assert x_floor["met"] is True
    ttft = goals["microagent: later-turn TTFT p95 <= 0.5x the plain client's"]
    assert ttft["measured"] == pytest.approx(0.25) and ttft["met"] is True
    assert ttft["baseline"] == "vllm"
    p95 = goals["microagent: program p95 no worse than the plain client's at any rate"]
    assert p95["measured"] == pytest.approx(0.5) and p95["met"] is True
    throughput = goals["microagent: >= 2x programs/min at equal p95 vs vllm"]
    assert throughput["measured"] == pytest.approx(2.5) and throughput["met"] is True
    missing = goals["microagent-http: later-turn TTFT p95 <= 0.5x the plain client's"]
    assert missing["measured"] is None and missing["met"] is None  # not run: not evaluated
    bfcl = goals["microagent: prompt computed <= 1.3x the floor at 1.6x pressure (bfcl)"]
    assert bfcl["met"] is None


def test_a_worse_p95_fails_the_no_worse_target() -> None:
    cells = [_cell("microagent", 1.0, 30.0, 1200), _cell("vllm", 1.0, 20.0, 1200)]
    goals = {g["target"]: g for g in R.targets({"cells": cells})}
    worse = goals["microagent: program p95 no worse than the plain client's at any rate"]
    assert worse["measured"] == pytest.approx(1.5) and worse["met"] is False


# -- a tiny scripted run, then a resumed one ---------------------------------------------------

TINY = [
    "--engine", "scripted", "--quick", "--force", "--shapes", "swe", "--programs", "6",
    "--context-scale", "0.05", "--turn-scale", "0.4", "--time-scale", "0.02",
    "--max-tokens", "8", "--rates", "600", "1200",
]  # fmt: skip
TARGETS = {
    f"{ours}: {name}"
    for ours in ("microagent", "microagent-http")
    for name in (
        "prompt computed <= 1.3x the floor at 1.6x pressure (bfcl)",
        "prompt computed <= 1.3x the floor at 1.6x pressure (swe)",
        "later-turn TTFT p95 <= 0.5x the plain client's",
        ">= 2x programs/min at equal p95 vs vllm",
        ">= 2x programs/min at equal p95 vs vllm-priority",
        "program latency without tool time p99 <= 3x p50",
        "program p95 no worse than the plain client's at any rate",
    )
}


def test_scripted_run_writes_every_cell_and_resumes(tmp_path: Path) -> None:
    argv = [*TINY, "--out", str(tmp_path)]
    data = A.run(A.parse_args(argv))
    path = tmp_path / "agents_quick.json"
    written = json.loads(path.read_text())
    systems = ("microagent", "microagent-http", "microagent-http-nokey")
    assert sorted((c["system"], c["rate_per_min"]) for c in written["cells"]) == sorted(
        (s, r) for s in systems for r in (600.0, 1200.0)
    )
    assert all(p["ok"] for c in written["cells"] for p in c["programs"])
    assert data["sessions"][-1]["new_cells"] == 6
    # every turn of every program was measured, with a first token and a prompt
    for cell in written["cells"]:
        for program in cell["programs"]:
            assert len(program["turns"]) == program["turns_planned"] >= 2
            assert all(t["prompt"] > 0 and t["ttft_s"] is not None for t in program["turns"])

    table = R.rows(written)

    def computed(system: str) -> float:
        return sum(r["computed_tokens"] for k, r in table.items() if k[3] == system)

    # retention keeps each program's context for its next turn: no more prefill than the
    # plain loop, and close to the workload floor
    assert computed("microagent") <= 1.25 * computed("microagent-http-nokey")
    assert all(r["x_floor"] <= 1.5 for k, r in table.items() if k[3] == "microagent")
    assert all(
        r["retained_hit_tokens"] > 0 for k, r in table.items() if k[3] != "microagent-http-nokey"
    )

    goals = written["targets"]
    assert {g["target"] for g in goals} == TARGETS
    for g in goals:
        if "(bfcl)" in g["target"]:  # the shape was not run
            assert g["measured"] is None and g["met"] is None
            continue
        assert isinstance(g["measured"], float) and isinstance(g["met"], bool), g
        assert g["baseline"] in (None, "microagent-http-nokey")
    assert (tmp_path / "agents_quick_tables.md").read_text().count("| microagent |") == 2
    assert (tmp_path / "agents_quick.png").stat().st_size > 1000

    again = A.run(A.parse_args(argv))  # resumes: every cell is there already
    assert again["sessions"][-1]["new_cells"] == 0
    assert len(json.loads(path.read_text())["cells"]) == 6

    kept = [c for c in written["cells"] if c["key"] != A.cell_key("microagent", "swe", 1.6, 600, 0)]
    path.write_text(json.dumps({**written, "cells": kept}))  # as if interrupted before it
    third = A.run(A.parse_args(argv))
    assert third["sessions"][-1]["new_cells"] == 1
    assert len(third["cells"]) == 6

    with pytest.raises(SystemExit, match="other settings"):
        A.run(A.parse_args([*argv[:-2], "--max-tokens", "4", "--out", str(tmp_path)]))


def test_the_block_floor_recomputes_each_turns_partial_block() -> None:
    """A perfect cache of 128-token blocks keeps the whole blocks a turn left and computes the
    rest: a turn that ends mid-block costs its tail again next turn."""
    turns = [
        {"prompt": 300, "completion": 20},  # 320 tokens live: 2 whole blocks (256)
        {"prompt": 400, "completion": 20},  # computes 400 - 256
        {"prompt": 420, "completion": 5},  # the previous turn left 420: 3 blocks (384)
    ]
    assert R.block_floor(turns, 128) == 300 + 144 + 36
    assert R.block_floor(turns, 0) == 300 + 80 + 1  # per token: only the last token again
    cell = _cell("vllm", 1.0, 10.0, 400)  # 2 turns: 1000 then 1400 prompt tokens, 200 cached each
    settings = {"configs": [{"block_tokens": 128}]}
    row = next(iter(R.rows({"cells": [cell], "settings": settings}).values()))
    assert row["x_block_floor"] == pytest.approx(400 / (1000 + 1400 - (1031 // 128) * 128))
