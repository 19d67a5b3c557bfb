"""bench/quality.py's report families: frozen, balanced, and of the kinds they claim.

The hash pins the items committed before any selection run: a change to a
generator or to the seed fails here instead of silently reporting new items.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import _quality_report_checks as C
import _quality_report_families as F
import _quality_tasks as T
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_report_items_are_the_frozen_ones() -> None:
    assert F.items_hash(F.report_items()) == F.REPORT_HASH
    assert F.report_family_items("product", 30) == F.report_items()[:30]  # a prefix


def test_report_families_are_not_selection_families() -> None:
    assert not set(F.REPORT_FAMILIES) & ({*T.PROBED, *T.FREE})


@pytest.mark.parametrize("family", [f for f, (k, _) in F.REPORT_FAMILIES.items() if k == "closed"])
def test_closed_report_families_are_balanced_with_distinct_choices(family: str) -> None:
    items = F.report_family_items(family, F.REPORT_ITEMS)
    assert all(len(set(i.choices)) == len(i.choices) and i.answer in i.choices for i in items)
    positions = Counter(i.choices.index(i.answer) for i in items)
    k = len(items[0].choices)
    assert set(positions) == set(range(k))
    assert max(positions.values()) - min(positions.values()) <= 1


def test_tool_families_need_arithmetic_and_the_passage_has_none() -> None:
    for item in F.report_family_items("product", 40):
        a, b = map(int, re.findall(r"\d+", item.question))
        assert item.answer == str(a * b)
    for item in F.report_family_items("shopping", 40):
        assert re.findall(r"\d+", item.question) and item.answer.isdigit()
    for item in F.report_family_items("passage", F.REPORT_ITEMS):
        assert not re.search(r"\d", item.question)
    assert {"product", "convert", "shopping"} == F.TOOL_FAMILIES


# Issue 40's families (``_quality_report_checks``): frozen the same way.


def test_the_checks_items_are_the_frozen_ones() -> None:
    assert C.items_hash(C.checks_items()) == C.CHECKS_HASH
    assert C.family_items("steps", 30) == C.checks_items()[:30]  # a prefix
    assert len(C.checks_items()) == 5 * 120


def test_checks_families_are_new_and_selection_never_sees_a_reported_question() -> None:
    assert not set(C.CHECKS_FAMILIES) & {*F.REPORT_FAMILIES, *T.PROBED, *T.FREE}
    reported = {item.question for item in C.checks_items()}
    chosen_on = C.selection_items(60)
    drawn = Counter(item.family for item in chosen_on)
    assert all(drawn[family] == 60 for family in C.CHECKED_FAMILIES)  # the control's space is small
    assert not reported & {item.question for item in chosen_on}


@pytest.mark.parametrize("family", [f for f, (k, _) in C.CHECKS_FAMILIES.items() if k == "closed"])
def test_closed_checks_families_are_balanced_with_distinct_choices(family: str) -> None:
    items = C.family_items(family, C.CHECKS_ITEMS)
    assert all(len(set(i.choices)) == len(i.choices) and i.answer in i.choices for i in items)
    positions = Counter(i.choices.index(i.answer) for i in items)
    assert set(positions) == set(range(len(items[0].choices)))
    assert max(positions.values()) - min(positions.values()) <= 1


def test_checks_answers_follow_from_the_question() -> None:
    for item in C.family_items("factor", 60):
        factor, n = map(int, re.findall(r"\d+", item.question))
        assert item.answer == str(factor * n)
    for item in C.family_items("count", 60):
        listed = re.search(r"list: (.*)\?", item.question)
        if listed:
            assert item.answer == str(len(listed.group(1).split(", ")))
        else:
            letter, word = re.findall(r'"(\w+)"', item.question)
            assert item.answer == str(word.count(letter))
    for item in C.family_items("plural", C.CHECKS_ITEMS):
        assert not re.search(r"\d", item.question)
    assert set(C.CHECKS_FAMILIES) - {"plural"} == C.CHECKED_FAMILIES


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_the_checks_families_were_committed_alone_before_compute_changed() -> None:
    """Issue 40: the families were frozen before any change to compute and any
    selection run on them; the commit graph says so."""
    assert _git("rev-parse", "--is-shallow-repository") == "false", (
        "needs the full history (git fetch --unshallow)"
    )
    frozen = _git(
        "log", "--diff-filter=A", "--format=%H", "--", "bench/_quality_report_checks.py"
    ).split()
    assert len(frozen) == 1
    freeze = frozen[0]
    touched = set(_git("show", "--name-only", "--format=", freeze).split())
    assert touched == {"bench/_quality_report_checks.py", "tests/test_bench_report_families.py"}
    # the first compute with named steps, and the first selection run on these families
    steps = _git(
        "log", "--reverse", "--format=%H", "-G", r"^    steps: int", "--",
        "collab/modes/_compute.py",
    ).split()  # fmt: skip
    first_run = _git(
        "log", "--reverse", "--diff-filter=A", "--format=%H", "--",
        "bench/results/quality_checks.json",
    ).split()  # fmt: skip
    assert steps, "compute's steps option is not in the history"
    for later in (steps[0], *first_run[:1]):
        assert later != freeze
        ancestor = subprocess.run(
            ["git", "merge-base", "--is-ancestor", freeze, later], cwd=ROOT, check=False
        )
        assert ancestor.returncode == 0, f"{later} does not come after the freeze {freeze}"
