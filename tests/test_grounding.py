"""The check that a program uses only the question's numbers (``collab/_grounding.py``)."""

from __future__ import annotations

import re

import pytest
from microagent.collab._grounding import (
    MAX_GROUNDED_OPERANDS,
    SMALL_CONSTANTS,
    grounded_expression_regex,
    grounding_failure,
    literals,
    stated_numbers,
    ungrounded_numbers,
)


def test_a_question_states_numbers_in_digits_and_in_words() -> None:
    question = "A dozen eggs cost $3.50; Ana buys three boxes of 1,250 grams at 15% off."
    assert stated_numbers(question) == {12.0, 3.5, 3.0, 1250.0, 15.0}


def test_literals_are_read_from_expressions_and_steps_without_evaluating() -> None:
    assert literals("price = 3 * 4.5") == [3.0, 4.5]
    assert literals("-(2 ** 3) <= 7") == [2.0, 3.0, 7.0]
    assert literals("answer = total") == []


@pytest.mark.parametrize(
    ("question", "program", "missing"),
    [
        ("Ana buys 3 pens at 4 dollars each and a 5 dollar pad.", ["p = 3 * 4", "a = p + 5"], []),
        ("How many minutes are in 3 hours?", ["3 * 60"], []),  # 60: a small constant
        ("Twice 21 plus a dozen?", ["answer = 2 * 21 + 12"], []),
        ("Half of 90 is what?", ["90 / 2"], []),
        ("What is 15% of 80?", ["80 * 15 / 100"], []),
        ("How many centimetres are in 3.5 metres?", ["3.5 * 100"], []),
        ("What is 37 + 48?", ["37 + 47"], [47.0]),  # a misread digit
        ("How many grams are in 4 pounds?", ["4 * 453.6"], [453.6]),  # an unstated factor
        ("Ana has 12 apples and eats 5.", ["a = 12 - 5", "answer = a * 3 + 9"], [3.0, 9.0]),
    ],
)
def test_a_program_is_grounded_only_in_the_numbers_the_question_states(
    question: str, program: list[str], missing: list[float]
) -> None:
    assert ungrounded_numbers(question, program) == missing
    failure = grounding_failure(question, program)
    if missing:
        assert failure is not None and "does not state" in failure
        assert f"{missing[0]:g}" in failure
    else:
        assert failure is None


def test_the_small_constants_are_the_documented_ones() -> None:
    assert {0, 1, 2, 7, 10, 12, 24, 60, 100, 1000} == SMALL_CONSTANTS
    assert ungrounded_numbers("What is 7 times 8?", ["7 * 8 * 3"]) == [3.0]


def test_a_program_that_does_not_parse_is_not_grounded() -> None:
    assert grounding_failure("What is 1 + 1?", ["1 +"]) == "the program does not parse"


def test_a_value_an_earlier_step_computed_counts_as_stated() -> None:
    question = "Ana buys 3 pens at 4 dollars each and a 5 dollar pad."
    program = ["p = 3 * 4 + 5", "answer = 17 * 3"]
    assert ungrounded_numbers(question, program) == [17.0]
    assert ungrounded_numbers(question, program, derived=[17, 51]) == []
    assert grounding_failure(question, program, [17]) is None


def test_a_grounded_expression_combines_only_the_questions_numbers() -> None:
    regex = grounded_expression_regex("A tray holds 15 eggs. How many eggs are in 9 trays?")
    assert regex is not None
    for good in ("15 * 9", "(15 + 9) * 9", "9*15", "15 * 9 - 9"):
        assert re.fullmatch(regex, good), good
    # a list, an invented number, words after a value, a number split by a space
    # (and a constant: with two stated numbers the model would pick 10 or 2 over them)
    for bad in ("1. 1. 1.", "15 * 3", "15 * 9 eggs", "1 5 * 9", "15 ** 9", "15 * 9 + 1", ""):
        assert not re.fullmatch(regex, bad), bad
    assert re.fullmatch(grounded_expression_regex("Half of 3.5 plus 1,250?") or "", "3.5 * 1250")
    # one stated number: the known conversions join it
    one = grounded_expression_regex("How many minutes are in 6 hours?") or ""
    assert re.fullmatch(one, "6 * 60") and not re.fullmatch(one, "6 * 61")


def test_a_number_too_long_for_a_float_is_no_operand() -> None:
    regex = grounded_expression_regex("What is " + "9" * 5000 + " times 3.25 and 4?") or ""
    assert "inf" not in regex and re.fullmatch(regex, "3.25 * 4")


def test_a_question_with_too_many_numbers_keeps_the_plain_language() -> None:
    many = " ".join(str(1000 + i) for i in range(MAX_GROUNDED_OPERANDS + 1))
    assert grounded_expression_regex(many) is None
