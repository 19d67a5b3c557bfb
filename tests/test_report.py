"""evaluation's report numbers on a hand fixture: coverage, accuracy when answered, and
greedy's own confidence cut-off at the same coverage (``greedy_at_coverage``)."""

from __future__ import annotations

import pytest
from microagent.collab.modes import NO_CONFIDENT_ANSWER
from microagent.evaluation import Choice, EvalItem, Reply, Score
from microagent.evaluation._report import config_report, greedy_cutoff, render_table

ITEMS = [EvalItem(i + 1, f"question {i}?", ("right",)) for i in range(6)]


def _greedy() -> list[Reply]:
    # (right, logprob): ranked by logprob, greedy's order is 3, 0, 1, 2, 5, then 4 (none)
    table = [
        (True, -0.1),
        (False, -0.2),
        (True, -3.0),
        (False, -0.05),
        (True, None),
        (False, -5.0),
    ]
    return [Reply("right" if ok else "wrong", logprob=lp) for ok, lp in table]


def _gated() -> list[Reply]:
    # abstains on items 1 and 5; right on 0, 2 and 3 of the four it answers
    out = []
    for i in range(6):
        if i in (1, 5):
            out.append(Reply(NO_CONFIDENT_ANSWER, abstained=True))
        else:
            out.append(Reply("wrong" if i == 4 else "right"))
    return out


def test_coverage_and_accuracy_when_answered_match_the_hand_count() -> None:
    got = config_report("gated", ITEMS, _gated(), _greedy())
    assert got.answered == 4 and got.abstained == 2
    assert got.coverage == pytest.approx(4 / 6)
    assert got.accuracy == pytest.approx(3 / 6)
    assert got.accuracy_when_answered == pytest.approx(3 / 4)
    # greedy's 4 most confident items (3, 0, 1, 2): right on 0 and 2
    assert got.greedy_at_coverage == pytest.approx(2 / 4)


def test_greedy_itself_and_full_coverage_have_no_cutoff() -> None:
    greedy = config_report("greedy", ITEMS, _greedy(), _greedy())
    assert greedy.coverage == 1.0 and greedy.greedy_at_coverage is None
    assert greedy.accuracy_when_answered == pytest.approx(3 / 6)
    full = config_report("full", ITEMS, [Reply("right")] * 6, _greedy())
    assert full.coverage == 1.0 and full.greedy_at_coverage is None


def test_the_cutoff_ranks_replies_without_a_logprob_last_and_needs_one() -> None:
    right = [True, False, True, False, True, False]
    # all six: every item, the one without a logprob included
    assert greedy_cutoff(right, _greedy(), 6) == pytest.approx(3 / 6)
    # the top 5 leave out item 4 (no logprob), a right one
    assert greedy_cutoff(right, _greedy(), 5) == pytest.approx(2 / 5)
    assert greedy_cutoff(right, _greedy(), 1) == 0.0  # item 3, wrong
    assert greedy_cutoff(right, _greedy(), 0) is None
    # a journal written before logprobs were recorded: nothing to rank by
    assert greedy_cutoff(right, [Reply("right")] * 6, 3) is None
    old = config_report("gated", ITEMS, _gated(), [Reply("right")] * 6)
    assert old.greedy_at_coverage is None and old.coverage == pytest.approx(4 / 6)


def test_the_table_shows_coverage_accuracy_when_answered_and_the_cutoff() -> None:
    reports = [
        config_report("greedy", ITEMS, _greedy(), _greedy()),
        config_report("gated", ITEMS, _gated(), _greedy()),
    ]
    choice = Choice("greedy", False, "no candidate beat greedy")
    table = render_table({"greedy": Score(6, 3, 1.0)}, reports, choice, "heading")
    lines = table.split("Report part")[1].splitlines()
    header = next(line for line in lines if "accuracy" in line and "cover" in line)
    assert header.split()[-3:] == ["cover", "acc|ans", "greedy@c"]
    gated = next(line for line in lines if line.strip().startswith("gated"))
    assert gated.split()[-3:] == ["0.67", "0.750", "0.500"]
    greedy = next(line for line in lines if line.strip().startswith("greedy "))
    assert greedy.split()[-3:] == ["1.00", "0.500", "–"]
