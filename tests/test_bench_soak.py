"""bench/soak.py: the request mix, the checks and report, a ``--quick`` soak of a server process.

The quick soak starts ``microagent serve --engine scripted`` as a process (the
same server as the real run, on the ScriptedEngine: tokens take 5 ms, so cancels
and disconnects cut work in flight) and sends it 150 mixed requests after a
warm-up; every measure must come back to its starting level. The 2 000-request
soak on the real engine is run by hand on a quiet machine (see BENCHMARKS.md).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import _soak_report as R
import _soak_requests as Q
import soak as S


def sample(phase: str, requests: int, **values: float) -> dict[str, Any]:
    base: dict[str, Any] = {
        "phase": phase,
        "requests": requests,
        "t_s": float(requests),
        "rss_mb": 100.0,
        "engine_rss_mb": 500.0,
        "processes": 3,
        "fds": 40,
        "threads": 12,
        "asyncio_tasks": 3,
        "engine_running": 0,
        "engine_waiting": 0,
        "engine_live": 0,
        "retained_blocks": 0,
        "retentions": 0,
        "requests_running": 0,
        "collaborations_running": 0,
        "loadavg": 0.1,
    }
    return {**base, **values}


DATA: dict[str, Any] = {
    "settings": {
        "engine": "vllm",
        "vllm": "0.32.0",
        "requests": 20,
        "warmup": 5,
        "concurrency": 2,
        "every": 10,
        "max_tokens": 8,
        "long_tokens": 96,
        "tool_tokens": 40,
        "cancel_after_s": 0.5,
        "settle_s": 3.0,
        "tolerance": 0.05,
    },
    "server": {"command": "serve --engine vllm", "start_s": 30.0, "exit_code": 0},
    "warmup": {"seconds": 4.0, "statuses": {"200": 5}},
    "run_s": 20.0,
    "idle_wait_s": {"baseline": 1.0, "final": 2.5},
    "machine": {"cpus": 2, "loadavg_at_start": 0.2, "seconds": 90},
    "samples": [
        sample("baseline", 0),
        sample("run", 10, rss_mb=120.0, fds=46, asyncio_tasks=30, engine_running=5),
        sample("run", 20, rss_mb=110.0, retained_blocks=12, retentions=3),
        sample("final", 20, rss_mb=104.9, fds=41),
    ],
    "statuses": {"200": 14, "400": 2, "left": 2, "cancelled": 2},
    "by_kind": {
        "plain": {"200": 14},
        "bad": {"400": 2},
        "disconnect": {"left": 2},
        "cancel": {"cancelled": 2},
    },
    "seconds_p50": {"plain": 0.2, "bad": 0.01, "disconnect": 0.1, "cancel": 0.5},
    "unexpected": [],
    "server_requests": {'{kind="completion",status="200"}': 14.0},
}


# -- the request mix ---------------------------------------------------------------------


def test_the_schedule_covers_every_kind_in_every_deck_and_is_reproducible() -> None:
    deck = sum(Q.MIX.values())
    kinds = Q.schedule(3 * deck, seed=4)
    assert kinds == Q.schedule(3 * deck, seed=4) and kinds != Q.schedule(3 * deck, seed=5)
    for start in range(0, 3 * deck, deck):
        assert Counter(kinds[start : start + deck]) == Counter(Q.MIX)
    assert len(Q.schedule(10, seed=0)) == 10


def test_every_mode_and_every_bad_input_is_in_the_mix() -> None:
    from microagent.collab.modes import BUILTIN_MODES

    assert set(Q.MODES) == {op.name for op in BUILTIN_MODES}
    calls = [Q.make_call(kind, i, 0.5) for kind in Q.MIX for i in range(len(Q.BAD_INPUTS))]
    modes = {c.body["collaboration"]["mode"] for c in calls if c.body and "collaboration" in c.body}
    assert set(Q.MODES) <= modes
    bad = {c.variant for c in calls if c.kind == "bad"}
    assert bad == {name for name, *_ in Q.BAD_INPUTS}
    assert all(c.expect >= 400 for c in calls if c.kind == "bad")
    assert all(c.leave_after and c.stream for c in calls if c.kind == "disconnect")
    assert all(c.timeout == 0.5 for c in calls if c.kind == "cancel")
    tools = [c for c in calls if c.kind == "server_tool"]
    assert tools and all(c.body and c.body["collaboration"]["tools"] == ["lookup"] for c in tools)
    for c in calls:  # small requests, except those meant to be cut or to carry a tool call
        if c.body and c.kind not in ("disconnect", "cancel", "server_tool", "client_tool"):
            assert c.body.get("max_tokens", 0) <= 16, c


def test_a_stream_passes_only_when_it_ends_with_done_and_no_error() -> None:
    ok = ['data: {"choices":[]}', "", "data: [DONE]"]
    assert Q._stream_outcome(ok) == ("200", "")
    assert Q._stream_outcome(['data: {"choices":[]}'])[0] == "stream_cut"
    error = ['data: {"error":{"code":"engine_unavailable"}}', "data: [DONE]"]
    assert Q._stream_outcome(error)[0] == "stream_error:engine_unavailable"


def test_metrics_parse_sums_label_sets() -> None:
    text = (
        '# HELP x y\nmicroagent:engine_retained_blocks{model_name="a"} 3\n'
        'microagent:engine_retained_blocks{model_name="b"} 4\nmicroagent:asyncio_tasks 7\n'
        'microagent:requests_total{kind="completion",status="200"} 5\n'
    )
    m = S.parse_metrics(text)
    assert m["microagent:engine_retained_blocks"] == 7 and m["microagent:asyncio_tasks"] == 7
    assert S.labelled(text, "microagent:requests_total") == {
        '{kind="completion",status="200"}': 5.0
    }


# -- the checks and the report -------------------------------------------------------------


def test_within_is_relative_and_zero_must_stay_zero() -> None:
    assert R.within(100, 105) and R.within(100, 95) and not R.within(100, 105.1)
    assert R.within(0, 0) and not R.within(0, 1)


def test_checks_compare_the_idle_samples_not_the_peaks() -> None:
    rows = {r["measure"]: r for r in R.checks(DATA)}
    assert rows["rss_mb"]["ok"] and rows["rss_mb"]["peak"] == 120.0
    assert rows["fds"]["ok"]  # 41 vs 40: 2.5 %
    assert rows["retained_blocks"]["ok"] and rows["retained_blocks"]["peak"] == 12
    assert R.passed(DATA)
    leaked = copy.deepcopy(DATA)
    leaked["samples"][-1]["retained_blocks"] = 1
    assert not R.passed(leaked)
    assert not {r["measure"]: r for r in R.checks(leaked)}["retained_blocks"]["ok"]
    busy = copy.deepcopy(DATA)
    busy["samples"][-1]["not_idle"] = True
    assert not R.passed(busy)
    failing = copy.deepcopy(DATA)
    failing["statuses"]["500"] = 1
    assert R.five_xx(failing) == 1 and not R.passed(failing)
    served = copy.deepcopy(DATA)
    served["server_requests"]['{kind="collaboration",status="503"}'] = 2.0
    assert R.five_xx(served) == 2
    cut = copy.deepcopy(DATA)
    cut["statuses"]["stream_error:internal_error"] = 1
    assert R.stream_errors(cut) == 1 and not R.passed(cut)


def test_tables_show_levels_outcomes_and_every_sample() -> None:
    text = R.tables(DATA)
    assert "| server RSS (MiB) | 100 | 120 | 104.9 | +4.9 % | yes |" in text
    assert "| server open file descriptors | 40 | 46 | 41 | +2.5 % | yes |" in text
    assert "| retained KV blocks | 0 | 12 | 0 | 0 | yes |" in text
    assert "| cancel | 2 | cancelled × 2 | 0.50 |" in text
    assert "**All checks passed.**" in text and "NOT a quiet machine" not in text
    assert text.count("\n| run |") == 2 and "| final | 20 |" in text
    leaked = copy.deepcopy(DATA)
    leaked["samples"][-1]["rss_mb"] = 106.0
    leaked["machine"]["forced"] = True
    text = R.tables(leaked)
    assert "+6.0 % | **NO** |" in text and "**Some checks FAILED.**" in text
    assert "NOT a quiet machine" in text


def test_plot_draws_the_curves(tmp_path: Path) -> None:
    R.plot(DATA, tmp_path / "soak.png")
    assert (tmp_path / "soak.png").stat().st_size > 10_000


# -- the quick soak of a real server process ---------------------------------------------------


def test_quick_soak_of_a_server_process_comes_back_to_its_starting_level(tmp_path: Path) -> None:
    argv = ["--quick", "--engine", "scripted", "--out", str(tmp_path), "--settle", "1"]
    args = S.parse_args(argv)
    assert args.requests == 150 and "history_limit=64" in args.engine_arg
    data = S.run(args, load=0.0, forced=False)
    written = json.loads((tmp_path / "soak_quick.json").read_text())
    assert written["samples"] == data["samples"]
    assert (tmp_path / "soak_quick.png").exists() and (tmp_path / "soak_quick_tables.md").exists()
    failed = [r for r in R.checks(data) if not r["ok"]]
    assert not failed, failed
    assert R.five_xx(data) == 0 and R.stream_errors(data) == 0
    assert data["unexpected"] == [], data["unexpected"]
    assert sum(data["by_kind"]["bad"].values()) == data["by_kind"]["bad"].get("400", 0) + data[
        "by_kind"
    ]["bad"].get("404", 0)
    assert data["by_kind"]["disconnect"].get("left", 0) >= 1  # left mid-stream, really
    assert data["by_kind"]["cancel"].get("cancelled", 0) >= 1  # timed out with work in flight
    assert sum(data["by_kind"]["server_tool"].values()) == data["by_kind"]["server_tool"]["200"]
    assert data["samples"][0]["asyncio_tasks"] > 0  # the gauge is there
    assert data["server"]["exit_code"] == 0  # SIGTERM drained an idle server
    assert R.passed(data)
