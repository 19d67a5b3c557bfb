"""The pure parts of bench/quality.py: task families, request fields, the target, the report.

No engine: the benchmark itself is run by hand (see BENCHMARKS.md).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import _quality_report as R  # noqa: E402
import _quality_tasks as T  # noqa: E402
import quality as Q  # noqa: E402


@pytest.mark.parametrize("family", list(T.PROBED))
def test_each_family_is_seeded_balanced_and_verifiable(family: str) -> None:
    items = T.family_items(family, 200)
    assert items == T.family_items(family, 200) and items != T.family_items(family, 200, seed=15)
    assert T.family_items(family, 50) == items[:50]  # quick runs are a prefix of full ones
    assert len({i.id for i in items}) == 200 and {i.family for i in items} == {family}
    for item in items:
        assert item.answer in item.choices and len(set(item.choices)) == len(item.choices) == 2
    first = sum(i.answer == i.choices[0] for i in items)
    assert first == 100  # an answer-blind "first listed" bias scores exactly chance
    if family == "capital":
        assert all(i.choices == ("yes", "no") for i in items)
        assert sum(i.answer == "yes" for i in items) == 100
    if family in ("sum", "larger"):
        numbers = [[int(n) for n in re.findall(r"\d+", i.question)] for i in items]
        expected = [sum(n) if family == "sum" else max(n) for n in numbers]
        assert [int(i.answer) for i in items] == expected


def test_the_reported_families_are_probed_ones_and_the_set_is_family_by_family() -> None:
    assert set(T.FAMILIES) <= set(T.PROBED) and len(T.FAMILIES) >= 4
    items = T.quality_set(3)
    assert [i.family for i in items] == [f for f in T.FAMILIES for _ in range(3)]


@given(st.sampled_from(sorted(Q.METHODS)), st.sampled_from(list(T.PROBED)), st.integers(0, 50))
def test_every_method_is_request_fields_with_the_items_choices(
    method: str, family: str, i: int
) -> None:
    item = T.family_items(family, i + 1)[i]
    body = Q.request_of(method, item)
    assert set(body) == {"agents", "collaboration", "temperature", "max_tokens"}
    assert body["collaboration"]["answer"]["choices"] == list(item.choices)
    assert body["collaboration"]["mode"] in ("vote", "best_of", "auto")
    assert "answer" not in Q.METHODS[method].get("collaboration", {})  # added per item only


def test_the_published_configuration_is_exactly_the_request_fields() -> None:
    best = json.loads((BENCH / "results" / "quality_best.json").read_text())
    assert set(best) <= {"agents", "collaboration", "max_tokens"}
    assert {"agents", "collaboration"} <= set(best)
    assert "answer" not in best["collaboration"]  # the client adds answer.choices
    page = (ROOT / "docs" / "quality.md").read_text()
    block = re.search(r"```json\n(.*?)```", page, re.S)
    assert block is not None and json.loads(block.group(1)) == best  # the page shows the file


def _rows(method: str, family: str, correct: list[bool], tokens: float) -> list[dict[str, Any]]:
    return [
        {
            "method": method,
            "item": f"{family}-{i}",
            "family": family,
            "rep": 0,
            "answer": "a" if ok else "b",
            "correct": ok,
            "ordered": ["a" if ok else "b"],
            "samples": 1,
            "prompt_tokens": 10,
            "cached_tokens": 0,
            "completion_tokens": tokens,
        }
        for i, ok in enumerate(correct)
    ]


def _data() -> dict[str, Any]:
    n = 40
    rows: list[dict[str, Any]] = []
    items = []
    for family in ("f1", "f2", "f3"):
        items += [
            {"id": f"{family}-{i}", "family": family, "question": "q", "choices": ["a", "b"],
             "answer": "a"}
            for i in range(n)
        ]  # fmt: skip
        base = [i % 2 == 0 for i in range(n)]  # 0.5
        rows += _rows("greedy", family, base, 2)
        rows += _rows("single", family, base, 2)
        rows += _rows("good", family, [True] * n, 4)  # wins 20/0 on every family
        rows += _rows("costly", family, [True] * n, 7)  # wins, but over 3× the tokens
    rows += [{"method": "refuser", "item": "f1-0", "family": "f1", "refused": "shares a token"}]
    return {
        "settings": {
            "model": "m",
            "items_per_family": n,
            "seed": 1,
            "max_tokens": 8,
            "temperature": 0.7,
            "families": ["f1", "f2", "f3"],
            "methods": {m: {} for m in ("greedy", "single", "good", "costly", "refuser")},
        },
        "items": items,
        "rows": rows,
        "machine": {"cpus": 2, "loadavg_at_start": 0.1, "seconds": 5},
    }


def test_the_target_needs_significant_wins_within_the_token_budget() -> None:
    data = _data()
    summary = R.summarize(data, R.answered(data["rows"]))
    for base in R.BASELINES:
        got = R.target(summary, base)
        assert got["good"] == {"families": ["f1", "f2", "f3"], "over_budget": [], "met": True}
        assert got["costly"]["families"] == [] and not got["costly"]["met"]
        assert got["costly"]["over_budget"] == ["f1", "f2", "f3"]
        assert not got["greedy" if base == "single" else "single"]["met"]
        assert not R.target(summary, base, R.above_chance(data, summary))["good"]["met"]
        assert R.target(summary, base, {"f1", "f3"})["good"]["met"]


def test_the_report_is_derived_from_the_rows_and_regenerates_byte_for_byte(
    tmp_path: Path,
) -> None:
    data = _data()
    md = R.tables(data)
    assert md == R.tables(json.loads(json.dumps(data)))
    assert "| good | 1.000 |" in md and "f1*, f2*, f3* — *met*" in md  # all at chance
    assert "| refuser | refused (1 items: shares a token) |" in md
    assert "| f1 | 0.500 |" in md  # the chance table
    page = tmp_path / "BENCHMARKS.md"
    page.write_text("# Benchmarks\n")
    R.update_benchmarks(page, md, "bench/results/q.json")
    once = page.read_text()
    R.update_benchmarks(page, md, "bench/results/q.json")
    assert page.read_text() == once and once.count(R.BEGIN) == 1
    R.update_benchmarks(page, "subset tables\n", "bench/results/quality_auto.json", "quality_auto")
    both = page.read_text()
    assert once.rstrip("\n") in both  # the full run's section stays as it was
    assert both.count(R.BEGIN) == 1 and "subset tables" in both
    assert both.count("<!-- quality_auto:begin") == 1
    assert "bench/results/q.png" in once
    png = tmp_path / "q.png"
    R.plot(data, png)
    assert png.read_bytes().startswith(b"\x89PNG")
