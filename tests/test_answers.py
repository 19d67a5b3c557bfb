"""Answer normalisation, the tie rule, and the exact early-stop test of a vote."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from microagent.collab import AnswerSpec, InvalidCollaboration, normalize_answer
from microagent.collab._tally import Tally, all_agree, majority
from strategies import vote_sequences

NUMBER = AnswerSpec(extract="number").extractor


def test_normalize_maps_to_choices() -> None:
    assert normalize_answer(" Yes. ", ["yes", "no"]) == "yes"
    assert normalize_answer("I think the answer is NO", ["yes", "no"]) == "no"
    assert normalize_answer("perhaps", ["yes", "no"]) == ""


def test_normalize_free_text() -> None:
    assert normalize_answer("Some reasoning\nAnswer: 42.") == "42"
    assert normalize_answer("  The   Cat!  ") == "the cat"
    assert normalize_answer("3.5") == "3.5"


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("3 + 1 = 4", "4"),
        ("The answer is 4.", "4"),
        ("4", "4"),
        ("12 + 1 is 13, not 14", "14"),  # the last number, as the reply ends on it
        ("-3.5 degrees", "-3.5"),
        ("about 1,000 people", "1000"),
        ("+1,000.50", "1000.5"),
        ("4.0", "4"),
        ("one", ""),  # no number: an abstention
    ],
)
def test_extract_number_reads_the_last_number_by_value(reply: str, answer: str) -> None:
    assert normalize_answer(reply, None, NUMBER) == answer


def test_extract_regex_takes_its_group_of_the_last_match() -> None:
    city = AnswerSpec(extract=r"is ([A-Z]\w+)").extractor
    assert normalize_answer("The capital of Italy is Rome.", None, city) == "rome"
    assert normalize_answer("It is Paris, not is London", None, city) == "london"
    assert normalize_answer("no city here", None, city) == ""
    whole = AnswerSpec(extract=r"[A-Z]\w+").extractor
    assert normalize_answer("see Rome", None, whole) == "rome"


@given(st.integers(-(10**9), 10**9), st.sampled_from(["{}", "It is {}.", "2 + 2 = {}", "{} !"]))
def test_extract_number_equal_values_tally_equal(value: int, template: str) -> None:
    plain = normalize_answer(template.format(value), None, NUMBER)
    grouped = normalize_answer(template.format(f"{value:,}"), None, NUMBER)
    assert plain == grouped == str(value)


def test_extract_needs_free_answers_and_a_valid_pattern() -> None:
    with pytest.raises(InvalidCollaboration, match=r"answer\.extract"):
        AnswerSpec(choices=("a", "b"), extract="number")
    with pytest.raises(InvalidCollaboration, match="regular expression"):
        AnswerSpec(extract="([")
    with pytest.raises(InvalidCollaboration, match="at most one group"):
        AnswerSpec(extract="(a)(b)")


def test_extract_pattern_that_backtracks_fails_fast_instead_of_hanging() -> None:
    slow = AnswerSpec(extract=r"(?:a|aa)+$").extractor
    t0 = time.monotonic()
    with pytest.raises(InvalidCollaboration, match="backtracking"):
        normalize_answer("a" * 64 + "!", None, slow)
    assert time.monotonic() - t0 < 5  # the timeout is 50 ms; the bound is generous


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
