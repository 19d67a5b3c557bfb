"""bench/report.py: BENCHMARKS.md and the family pages, regenerated from the stored JSON.

Runs no benchmark: it re-renders the committed results into a temporary folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import report as B
from _sections import FamilyReport, publish

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[FamilyReport]]:
    root = tmp_path_factory.mktemp("report")
    return root, B.regenerate(root, RESULTS)


def _row(text: str, family: str) -> str:
    return next(line for line in text.splitlines() if f"(docs/benchmarks/{family}.md) |" in line)


def test_benchmarks_md_is_one_short_page_with_the_headline_table_first(
    written: tuple[Path, list[FamilyReport]],
) -> None:
    root, reports = written
    raw = (root / "BENCHMARKS.md").read_bytes()
    assert len(raw) < 25_000
    lines = raw.decode().splitlines()
    header = lines.index("| family | key figure | microagent | against | target | machine | date |")
    sections = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert header < sections[0]  # the headline table comes before any section
    assert header + 2 + len(reports) < 40  # the whole table on the first screen
    assert len(sections) == len(reports) == len(B.FAMILIES)


def test_every_family_has_its_page_and_its_links(written: tuple[Path, list[FamilyReport]]) -> None:
    root, reports = written
    text = (root / "BENCHMARKS.md").read_text()
    for report in reports:
        page = (root / report.link).read_text()
        assert page.startswith("# ") and "## What was run" in page
        assert "](../../bench/results/" in page  # links the JSON it was generated from
        assert text.count(f"]({report.link})") == 2  # its headline row and its section
    assert {r.family for r in reports} == set(B.FAMILIES)


def test_headline_ratios_are_recomputed_from_their_json(
    written: tuple[Path, list[FamilyReport]],
) -> None:
    root, _ = written
    text = (root / "BENCHMARKS.md").read_text()
    loop = json.loads((RESULTS / "embedding_loop.json").read_text())
    ratio = loop["in_process"]["cached_tokens"] / loop["http"]["cached_tokens"]
    assert f"| {ratio:.2f}× |" in _row(text, "embedding_loop")
    replicas = json.loads((RESULTS / "replicas.json").read_text())
    by = {r["routing"]: r["session"]["computed"] for r in replicas["summaries"]}
    assert f"| {by['affinity'] / by['serve']:.2f}× |" in _row(text, "replicas")
    date = replicas["machine"]["started"].split(" ")[0]
    assert _row(text, "replicas").endswith(f"| {date} |")


def test_the_committed_report_is_what_the_json_regenerates(
    written: tuple[Path, list[FamilyReport]],
) -> None:
    root, reports = written
    assert (ROOT / "BENCHMARKS.md").read_text() == (root / "BENCHMARKS.md").read_text()
    for report in reports:
        assert (ROOT / report.link).read_text() == (root / report.link).read_text(), report.link


def test_publish_rewrites_only_its_own_row_section_and_page(tmp_path: Path) -> None:
    reports = B.regenerate(tmp_path, RESULTS)
    before = (tmp_path / "BENCHMARKS.md").read_text()
    old = next(r for r in reports if r.family == "faults")
    new = dataclasses.replace(
        old,
        headline=dataclasses.replace(old.headline, value="42 ms"),
        summary="A new summary.",
        page="# changed\n",
    )
    publish(tmp_path, new)
    publish(tmp_path, new)  # idempotent
    after = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| 42 ms |" in _row(after, "faults") and after.count("A new summary.") == 1
    assert (tmp_path / new.link).read_text() == "# changed\n"
    changed = set(after.splitlines()) ^ set(before.splitlines())
    assert changed == {old.row(), new.row(), old.summary.strip(), "A new summary."}


def test_publish_starts_a_missing_benchmarks_md_and_appends_a_new_family(tmp_path: Path) -> None:
    faults, tools = (B.FAMILIES[name](RESULTS) for name in ("faults", "tools"))
    publish(tmp_path, faults)
    publish(tmp_path, tools)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text.index(faults.row()) < text.index(tools.row()) < text.index("## ")
    assert text.count("<!-- tools:begin") == 1 and (tmp_path / tools.link).exists()
