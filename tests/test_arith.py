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
from microagent.collab._arith import ExpressionError, evaluate_expression


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
