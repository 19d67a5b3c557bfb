"""Re-render BENCHMARKS.md and every family page under docs/benchmarks/ from bench/results/.

Runs no benchmark: every number comes from the JSON the bench scripts wrote.
BENCHMARKS.md is one short page (the headline table first, then a few lines a
family); each family's tables, plots and targets are on its own generated page.
A bench script's ``--update`` rewrites only its family's page and row
(``_sections.publish``); this script rewrites them all.

Usage: ``.venv/bin/python bench/report.py [--root DIR] [--results DIR]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402
import agents  # noqa: E402
import early_stop  # noqa: E402
import embedding_loop  # noqa: E402
import engine_rss  # noqa: E402
import faults  # noqa: E402
import hostile  # noqa: E402
import load  # noqa: E402
import lora_role  # noqa: E402
import quality  # noqa: E402
import quality_checks  # noqa: E402
import replicas  # noqa: E402
import soak  # noqa: E402
import tier_cells  # noqa: E402
import tools  # noqa: E402
from _sections import FamilyReport, index, write_page  # noqa: E402

import collab  # noqa: E402

#: Every family, in BENCHMARKS.md's order: its name and what renders it from a results folder.
FAMILIES: dict[str, Callable[[Path], FamilyReport]] = {
    "collab": collab.family_report,
    "load": load.family_report,
    "agents": agents.family_report,
    "early_stop": early_stop.family_report,
    "accuracy": accuracy.family_report,
    "quality": quality.family_report,
    "quality_checks": quality_checks.family_report,
    "tools": tools.family_report,
    "faults": faults.family_report,
    "soak": soak.family_report,
    "hostile": hostile.family_report,
    "replicas": replicas.family_report,
    "embedding_loop": embedding_loop.family_report,
    "tier_cells": tier_cells.family_report,
    "engine_rss": engine_rss.family_report,
    "lora_role": lora_role.family_report,
}


def reports(results: Path) -> list[FamilyReport]:
    """Every family's report, rendered from the JSON in ``results``."""
    return [render(results) for render in FAMILIES.values()]


def regenerate(root: Path, results: Path) -> list[FamilyReport]:
    """Write every family page and the whole BENCHMARKS.md under ``root``."""
    done = reports(results)
    for report in done:
        write_page(root, report)
    (root / "BENCHMARKS.md").write_text(index(done))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE.parent, help="where to write")
    parser.add_argument("--results", type=Path, default=HERE / "results", help="the JSON")
    args = parser.parse_args(argv)
    done = regenerate(args.root, args.results)
    size = (args.root / "BENCHMARKS.md").stat().st_size
    print(f"BENCHMARKS.md ({size} bytes) and {len(done)} family pages written", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
