"""The pure parts of bench/quality_checks.py: its items, per-family rows and targets.

No engine: the benchmark itself is run by hand (BENCHMARKS.md). The rows here are
synthetic report rows, so every verdict is checked both ways.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import _quality_report_checks as C
import _quality_report_families as F
import pytest
import quality_checks as Q


def test_items_pin_every_frozen_report_item_and_select_on_other_draws() -> None:
    got = Q.items(120, 20)
    report = [i for i in got if i.part == "report"]
    selection = [i for i in got if i.part == "selection"]
    assert [i.question for i in report] == [
        i.question for i in (*F.report_items(120), *C.checks_items(120))
    ]
    assert not {i.question for i in report} & {i.question for i in selection}
    drawn = Counter(i.family for i in selection)
    # convert (48 questions) and the control (32) have few questions, nearly all reported
    roomy = {*F.REPORT_FAMILIES, *C.CHECKED_FAMILIES} - {"convert"}
    assert all(drawn[f] == 20 for f in roomy) and drawn["convert"] < 20
    assert [i.line for i in got] == list(range(1, len(got) + 1))


def _row(config: str, family: str, line: int, correct: bool, **extra: Any) -> dict[str, Any]:
    return {
        "line": line,
        "family": family,
        "part": "report",
        "config": config,
        "correct": correct,
        "abstained": False,
        "refused": None,
        "failed": None,
        "completion_tokens": 4,
        "logprob": None,
        **extra,
    }


def _data(lift: int, abstain_right: bool, n: int = 40) -> dict[str, Any]:
    """Greedy right on the first half of every family; compute on ``lift`` more items of
    steps and factor; the abstainer answers 75 % of items (right ones if ``abstain_right``)."""
    rows = []
    line = 0
    for family in Q.FAMILIES:
        for k in range(n):
            line += 1
            greedy_right = k < n // 2
            rows.append(_row("greedy", family, line, greedy_right, logprob=-float(k)))
            lifted = family in ("steps", "factor") and k < n // 2 + lift
            rows.append(_row("compute", family, line, greedy_right or lifted, completion_tokens=8))
            answered = k < 3 * n // 4
            rows.append(
                _row(
                    Q.ABSTAINER,
                    family,
                    line,
                    answered and (abstain_right or k % 2 == 0),
                    abstained=not answered,
                    completion_tokens=20,
                )
            )
    names = ("greedy", "compute")
    return {
        "published": {"name": "compute", "beat_greedy": True, "reason": "synthetic"},
        "abstainer": Q.ABSTAINER,
        "abstention": {
            "rows": [r for r in rows if r["config"] in ("greedy", Q.ABSTAINER)],
            "candidates": [{"name": "greedy"}, {"name": Q.ABSTAINER}],
        },
        "report": {
            "rows": [r for r in rows if r["config"] in names],
            "candidates": [{"name": c} for c in names],
            "choice": {"name": "compute", "reason": "synthetic"},
            "report": [
                {"name": "greedy", "tokens_vs_greedy": 1.0},
                {"name": "compute", "tokens_vs_greedy": 2.0},
            ],
        },
        "replay": {"identical": True, "measured": "identical report.json"},
    }


def test_a_large_lift_on_two_families_meets_the_target_and_a_small_one_does_not() -> None:
    data = _data(lift=15, abstain_right=True)
    data["families"] = Q.family_rows(data)
    beat, worst, tokens, _, replay, again = Q.targets(data)
    assert beat["met"] and "steps" in beat["measured"] and "factor" in beat["measured"]
    assert worst["met"] and tokens["met"] and replay["met"]
    assert not again["met"] and again["measured"] == "not run"
    steps = next(r for r in data["families"] if r["config"] == "compute" and r["family"] == "steps")
    assert steps["difference"] == pytest.approx(15 / 40)
    assert steps["p_holm"] >= steps["p"]
    small = _data(lift=3, abstain_right=True)
    small["families"] = Q.family_rows(small)
    assert not Q.targets(small)[0]["met"]


def test_abstention_is_judged_against_greedys_own_cut_off_at_the_same_coverage() -> None:
    data = _data(lift=15, abstain_right=True)
    data["families"] = Q.family_rows(data)
    gated = [r for r in data["families"] if r["config"] == Q.ABSTAINER]
    # greedy's log-probability ranks its right half first: at 75 % coverage it is right on
    # 20 of 30; the abstainer on all 30 it answered
    assert all(r["coverage"] == 0.75 for r in gated)
    assert all(r["greedy_at_coverage"] == pytest.approx(20 / 30) for r in gated)
    assert Q.targets(data)[3]["met"]
    worse = _data(lift=15, abstain_right=False)
    worse["families"] = Q.family_rows(worse)
    assert not Q.targets(worse)[3]["met"]  # 15 of 30 answered right: below the cut-off


def test_a_loss_on_the_control_fails_the_interval_target() -> None:
    data = _data(lift=15, abstain_right=True)
    for r in data["report"]["rows"]:
        if r["config"] == "compute" and r["family"] == "plural" and r["line"] % 40 in range(1, 9):
            r["correct"] = False  # compute loses 8 of greedy's right answers on the control
    data["families"] = Q.family_rows(data)
    worst = Q.targets(data)[1]
    assert not worst["met"] and "plural" in worst["measured"]


def test_the_abstainer_reported_is_chosen_on_selection_coverage_then_accuracy() -> None:
    def rows(name: str, answered: int, right: int) -> list[dict[str, Any]]:
        return [
            _row(name, "steps", k, k < right, abstained=k >= answered, **{"part": "selection"})
            for k in range(10)
        ]

    wide, narrow = f"{Q.ABSTAINER}-60", f"{Q.ABSTAINER}-80"
    # the narrow gate is more often right but answers 6 of 10: below the coverage floor
    assert Q.choose_abstainer([*rows(wide, 8, 6), *rows(narrow, 6, 6)]) == wide
    assert Q.choose_abstainer([*rows(wide, 8, 6), *rows(narrow, 9, 8)]) == narrow
    assert Q.choose_abstainer([*rows(wide, 5, 5), *rows(narrow, 6, 6)]) == narrow  # none covers


def test_a_benchmark_refuses_a_busy_machine_unless_forced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    import _sections

    monkeypatch.setattr(_sections, "os", types.SimpleNamespace(getloadavg=lambda: (1.2, 0, 0)))
    assert _sections.quiet_load(False, 1.0) is None
    assert "1.20 >= 1: the machine is not quiet" in capsys.readouterr().err
    assert _sections.quiet_load(True, 1.0) == 1.2  # forced: run, and the record says so
    assert _sections.quiet_load(False, 1.5) == 1.2


def test_a_fresh_rerun_is_judged_by_whether_every_cell_lands_inside_its_interval() -> None:
    cells = [
        {"config": "greedy", "family": "steps", "inside": True},
        {"config": "compute", "family": "factor", "inside": False},
    ]
    data = _data(lift=15, abstain_right=True)
    data["families"] = Q.family_rows(data)
    data["rerun"] = {"cells": cells, "all_inside": False}
    again = Q.targets(data)[5]
    assert not again["met"] and again["measured"] == "1 of 2 inside (outside: compute/factor)"
    data["rerun"] = {"cells": cells[:1], "all_inside": True}
    assert Q.targets(data)[5]["met"]
