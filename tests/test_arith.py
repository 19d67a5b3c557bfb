"""The calculator's language (``collab/_arith.py``), checked and evaluated in process.

The sandboxed evaluation of the same text is ``test_compute.py``'s.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.collab._arith import (
    MAX_STEPS,
    ExpressionError,
    check_step,
    evaluate_expression,
    evaluate_program,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("17 * 23 + 4", 395),
        ("(12 + 30) / 7", 6.0),
        ("7 // 2 + 7 % 2", 4),
        ("2 ** 10", 1024),
        ("-3 + +5", 2),
        ("max(18, 31) - min([4, 9])", 27),
        ("round(2.675, 1) + abs(-1)", round(2.675, 1) + 1),
        ("sqrt(16) + floor(2.7) + ceil(2.1)", 9.0),
        ("gcd(12, 18) * lcm(4, 6)", 72),
        ("sum((1, 2, 3)) + factorial(5)", 126),
        ("3 < 5 <= 5", True),
        ("48 > 37 == 2", False),
        ("2 * pi", 2 * 3.141592653589793),
    ],
)
def test_the_calculator_language_evaluates_arithmetic(text: str, value: object) -> None:
    assert evaluate_expression(text) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os').system('id')", "only these functions"),
        ("().__class__", "Attribute is not allowed"),
        ("'a' * 3", "only numbers"),
        ("x + 1", "unknown name 'x'"),
        ("lambda: 1", "Lambda is not allowed"),
        ("[1, 2][0]", "Subscript is not allowed"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 5000", "too large"),
        ("factorial(100000)", "limited to 500"),
        ("1 / 0", "ZeroDivisionError"),
        ("sqrt(-1)", "ValueError"),
        ("max(1, key=abs)", "keyword"),
        ("(1, 2)", "list of numbers"),
        ("1 +", "not an expression"),
        ("1" * 201, "longer than 200"),
        ("True + 1", "only numbers"),
    ],
)
def test_the_calculator_language_refuses_everything_else(text: str, reason: str) -> None:
    with pytest.raises(ExpressionError, match=re.escape(reason)):
        evaluate_expression(text)


# --- programs of named steps ------------------------------------------------------------


def test_a_program_evaluates_its_steps_in_order_with_earlier_names() -> None:
    program = ["price = 3 * 4", "total = price + 5", "answer = total * 2 - max(price, 1)"]
    assert evaluate_program(program) == [12, 17, 22]
    assert check_step("total = price + 5", ["price"])[0] == "total"


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        (["total = price + 5"], "step 1: unknown name 'price'"),
        (["a = 1", "a = a + 1"], "step 2: 'a' is already assigned"),
        ([f"s{i} = {i}" for i in range(MAX_STEPS + 1)], f"at most {MAX_STEPS} steps"),
        (["a = 9 ** 9 ** 9"], "too large"),
        (["a = 100", "b = 2 ** 999", "c = b ** a"], "step 3: the power is too large"),
        (["__class__ = 1"], "lower-case letters"),
        (["a = 1", "b = a.__class__"], "step 2: Attribute is not allowed"),
        (["a = __import__('os')"], "only these functions"),
        (["Total = 1"], "lower-case letters"),
        ([f"{'n' * 25} = 1"], "at most 24 characters"),
        (["sqrt = 4"], "the calculator's own name"),
        (["pi = 3"], "the calculator's own name"),
        (["a == 1"], "one name: name = expression"),
        (["3 * 4"], "one name: name = expression"),
        (["a = b = 1"], "not an expression"),
        (["a, b = 1"], "lower-case letters"),
        (["a = 1; import os"], "not an expression"),
        (["a = 1", "b = a(2)"], "only these functions"),
    ],
)
def test_a_program_refuses_hostile_steps(steps: list[str], reason: str) -> None:
    with pytest.raises(ExpressionError, match=re.escape(reason)):
        evaluate_program(steps)


_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}


@st.composite
def integer_expressions(draw: st.DrawFn, depth: int = 3) -> tuple[str, int]:
    """A random expression over small integers with its value (computed apart from ast)."""
    if depth == 0 or draw(st.booleans()):
        n = draw(st.integers(0, 999))
        return str(n), n
    left, a = draw(integer_expressions(depth - 1))
    right, b = draw(integer_expressions(depth - 1))
    op = draw(st.sampled_from(sorted(_OPS)))
    return f"({left} {op} {right})", _OPS[op](a, b)


@settings(max_examples=200, deadline=None)
@given(integer_expressions())
def test_random_integer_arithmetic_evaluates_to_its_value(case: tuple[str, int]) -> None:
    text, value = case
    assert evaluate_expression(text) == value
    ast.parse(text, mode="eval")  # the generator writes Python
