"""The paired statistics of microagent eval and bench/quality_checks.py: the interval of
a paired difference and the Holm correction, against reference computations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from microagent.evaluation import PairedTable, Score, choose, holm, paired_difference_interval


def _wald(t: PairedTable) -> tuple[float, float]:
    n = t.both + t.only_greedy + t.only_candidate + t.neither
    d = (t.only_candidate - t.only_greedy) / n
    var = (t.only_candidate + t.only_greedy) / n**2 - (t.only_candidate - t.only_greedy) ** 2 / n**3
    return d - 1.96 * math.sqrt(var), d + 1.96 * math.sqrt(var)


def test_the_interval_approaches_the_wald_interval_on_many_items() -> None:
    # at a large n the hybrid score interval and the Wald interval of a paired
    # difference coincide: a reference independent of the Wilson arithmetic
    table = PairedTable(both=40_000, only_greedy=6_000, only_candidate=9_000, neither=45_000)
    low, high = paired_difference_interval(table)
    ref_low, ref_high = _wald(table)
    assert low == pytest.approx(ref_low, abs=2e-4)
    assert high == pytest.approx(ref_high, abs=2e-4)


def test_the_interval_is_not_symmetric_near_the_bound_and_stays_in_range() -> None:
    # the candidate right on all 20, greedy on 18: Wald's upper bound would pass 1 - p2
    low, high = paired_difference_interval(PairedTable(18, 0, 2, 0))
    assert 0.0 < high <= 1.0 and low < 0.1 < high
    assert high - 0.1 != pytest.approx(0.1 - low)  # not a Wald interval


@given(st.tuples(*(st.integers(0, 60) for _ in range(4))).filter(lambda c: sum(c) > 0))
def test_the_interval_holds_the_observed_difference(cells: tuple[int, int, int, int]) -> None:
    table = PairedTable(*cells)
    n = sum(cells)
    d = (table.only_candidate - table.only_greedy) / n
    low, high = paired_difference_interval(table)
    assert -1.0 <= low <= d + 1e-12 and d - 1e-12 <= high <= 1.0
    # swapping the two sides mirrors the interval
    mirrored = paired_difference_interval(
        PairedTable(table.both, table.only_candidate, table.only_greedy, table.neither)
    )
    assert mirrored == pytest.approx((-high, -low))


def test_pairing_narrows_the_interval_when_outcomes_agree() -> None:
    # the same accuracies (0.6 vs 0.5), once with outcomes that mostly agree, once not
    agree = paired_difference_interval(PairedTable(50, 0, 10, 40))
    disagree = paired_difference_interval(PairedTable(30, 20, 30, 20))
    assert agree[1] - agree[0] < disagree[1] - disagree[0]
    assert agree[0] > 0 > disagree[0]


def test_holm_against_a_hand_computation() -> None:
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1 -> max(0.06, 0.04)=0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == []


def test_a_token_budget_keeps_a_costly_candidate_from_being_chosen() -> None:
    selection = {
        "greedy": Score(100, 50, 4.0),
        "costly": Score(100, 70, 20.0),  # 5x greedy's tokens
        "cheap": Score(100, 60, 10.0),  # 2.5x
    }
    assert choose(selection).name == "costly"
    within = choose(selection, max_token_ratio=3.0)
    assert within.name == "cheap" and "within 3x" in within.reason
    none = choose(selection, max_token_ratio=2.0)
    assert none.name == "greedy" and not none.beat_greedy and "2x" in none.reason
    with pytest.raises(ValueError, match="max_token_ratio"):
        choose(selection, max_token_ratio=0.0)
