"""Answer normalisation, the tie rule, and the exact early-stop test of a vote."""

from __future__ import annotations

from hypothesis import given
from microagent.collab import Tally, all_agree, majority, normalize_answer
from strategies import vote_sequences


def test_normalize_maps_to_choices() -> None:
    assert normalize_answer(" Yes. ", ["yes", "no"]) == "yes"
    assert normalize_answer("I think the answer is NO", ["yes", "no"]) == "no"
    assert normalize_answer("perhaps", ["yes", "no"]) == ""


def test_normalize_free_text() -> None:
    assert normalize_answer("Some reasoning\nAnswer: 42.") == "42"
    assert normalize_answer("  The   Cat!  ") == "the cat"
    assert normalize_answer("3.5") == "3.5"


def test_tie_rule_prefers_first_choice_then_first_arrival() -> None:
    assert majority(["no", "yes"], ["yes", "no"]) == "yes"
    assert majority(["b", "a"]) == "b"
    assert majority(["b", "a", "a"]) == "a"


def test_decided_when_leader_unreachable() -> None:
    tally = Tally(total_voters=5, choices=("yes", "no"))
    for a in ("yes", "yes"):
        tally.add(a)
    assert not tally.decided()
    tally.add("yes")
    assert tally.decided() and tally.leader() == "yes"


def test_all_agree() -> None:
    assert all_agree({"a": "x", "b": "x"})
    assert not all_agree({"a": "x", "b": "y"})
    assert not all_agree({"a": "", "b": ""})


def _early(choices: tuple[str, ...] | None, answers: list[str]) -> tuple[str, int]:
    tally = Tally(total_voters=len(answers), choices=choices)
    for i, a in enumerate(answers):
        tally.add(a)
        if tally.decided():
            return tally.leader(), i + 1
    return tally.leader(), len(answers)


@given(vote_sequences())
def test_early_stop_is_exact_with_choices(case: tuple[tuple[str, ...] | None, list[str]]) -> None:
    choices, answers = case
    early, used = _early(choices, answers)
    assert early == majority(answers, choices)
    assert used <= len(answers)


@given(vote_sequences(free_text=True))
def test_early_stop_is_exact_with_free_text(case: tuple[tuple[str, ...] | None, list[str]]) -> None:
    choices, answers = case
    early, _ = _early(choices, answers)
    assert early == majority(answers, choices)
