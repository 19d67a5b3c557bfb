"""bench/tier_cells.py's verdicts and tables come from its JSON, and can fail."""

from __future__ import annotations

import json
from pathlib import Path

import tier_cells as C

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "tier_cells.json"


def turn(computed: int, new: int) -> dict[str, int]:
    return {"prompt": 1000, "cached": 1000 - computed, "computed": computed, "new": new}


def test_targets_hold_only_within_a_block_and_a_tenth() -> None:
    data = {
        "long_wait": [
            {"system": "tier-sessions", "turns": [turn(150, 40), turn(160, 40)]},
            {"system": "no-tier", "turns": [turn(900, 40)]},
        ],
        "restart": [
            {"kill": False, "turns": [turn(100, 40)]},
            {"kill": True, "turns": [turn(111, 40)]},
        ],
    }
    verdicts = {t["name"].split(":")[0]: t["met"] for t in C.targets(data)}
    assert verdicts == {
        "long wait, tier-sessions": True,  # 120 beyond its new tokens: within a block
        "long wait, no-tier": False,
        "restart": False,  # 1.11x
    }


def test_the_published_tables_are_the_jsons() -> None:
    data = json.loads(RESULTS.read_text())
    table = C.report(data)
    for cell in data["long_wait"]:
        t = C.totals(cell)
        assert f"| {cell['system']} |" in table and f"| {t['computed']} |" in table
    assert [t["met"] for t in C.targets(data)] == [t["met"] for t in data["targets"]]
