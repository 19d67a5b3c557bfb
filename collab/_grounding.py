"""The question's numbers and a program's agree: ``compute``'s check before it answers.

A small model that writes arithmetic can invent a number (a factor the question
does not state, a digit misread) and the calculator evaluates it faithfully.
:func:`ungrounded_numbers` reads the number literals of an expression or a
program's steps from their syntax trees (nothing is evaluated) and returns
those the question does not state. A number counts as stated when it is
written in the question as digits (``12``, ``1,250``, ``3.5``, ``15%``) or
as a word (``three``, ``dozen``, ``twice``, ``half``), or when it is one of
``SMALL_CONSTANTS``: the identities and the conversions everyone knows, or
when an earlier step of the program computed it. It cannot tell a wrong use
of stated numbers (or of a small constant) from a right one.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Sequence

#: numbers a program may use without the question stating them, and why:
#: 0 and 1 (identities, "one more"), 2 (doubling, halving, pairs), 7 (days a week),
#: 10, 100 and 1000 (decimal scales, percent, metric prefixes), 12 (months, a dozen),
#: 24 (hours a day), 60 (minutes an hour, seconds a minute)
SMALL_CONSTANTS: frozenset[float] = frozenset({0, 1, 2, 7, 10, 12, 24, 60, 100, 1000})
#: number words a question may state a number with
_UNITS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
)  # fmt: skip
_TENS = ["thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
NUMBER_WORDS: dict[str, float] = {
    **{w: float(i) for i, w in enumerate(_UNITS)},
    **{w: float(10 * i) for i, w in enumerate(_TENS, 3)},
    "hundred": 100.0,
    "thousand": 1000.0,
    "dozen": 12.0,
    "half": 2.0,
    "twice": 2.0,
    "double": 2.0,
    "triple": 3.0,
    "thrice": 3.0,
    "quarter": 4.0,
}
#: a number in the question: thousands commas read, decimals kept
_DIGITS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+")
_WORD = re.compile(r"[a-z]+")


def stated_numbers(question: str) -> frozenset[float]:
    """The numbers ``question`` states, as digits or as number words."""
    found = {float(m.replace(",", "")) for m in _DIGITS.findall(question)}
    found.update(NUMBER_WORDS[w] for w in _WORD.findall(question.lower()) if w in NUMBER_WORDS)
    return frozenset(found)


def literals(text: str) -> list[float]:
    """The number literals of an expression or of a step ``name = expression`` (signs dropped).

    Raises:
        SyntaxError: ``text`` does not parse (the calculator's check says more).
    """
    tree = ast.parse(text.strip(), mode="exec")  # an expression or an assignment
    found = [
        ((node.lineno, node.col_offset), float(node.value))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ]
    return [value for _, value in sorted(found)]  # as written (the walk is breadth first)


def ungrounded_numbers(
    question: str, program: Sequence[str], derived: Iterable[float] = ()
) -> list[float]:
    """The literals of ``program`` (its expressions or steps) that ``question`` does not state.

    ``derived``: the values the program's steps computed, which a later step may write
    out (``answer = 17`` after a step shown ``# = 17``): they count as stated.

    Raises:
        SyntaxError: a step does not parse.
    """
    allowed = stated_numbers(question) | SMALL_CONSTANTS | {float(v) for v in derived}
    out: list[float] = []
    for text in program:
        out.extend(v for v in literals(text) if v not in allowed and v not in out)
    return out


def grounding_failure(
    question: str, program: Sequence[str], derived: Iterable[float] = ()
) -> str | None:
    """Why ``program`` is not grounded in ``question`` (None: every number is stated)."""
    try:
        missing = ungrounded_numbers(question, program, derived)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "the program does not parse"
    if not missing:
        return None
    shown = ", ".join(f"{v:g}" for v in missing)
    return f"uses numbers the question does not state: {shown}"


#: most distinct numbers a grounded expression regex lists (a longer question keeps the
#: plain language, and the check after the turn still applies)
MAX_GROUNDED_OPERANDS = 48
#: operators a grounded expression joins its operands with
_OPERATOR = r" ?[-+*/] ?"


def _written(value: float) -> str:
    """A number as an expression writes it: digits, no exponent, no trailing ``.0``."""
    number = float(value)
    if number.is_integer():
        return str(int(number))
    return format(number, "f").rstrip("0")


def grounded_expression_regex(question: str, max_operands: int = 8) -> str | None:
    """The regex of an expression whose every number the question states, joined by
    operators, with parentheses: the check moved into decoding. Where the question states
    fewer than two numbers, ``SMALL_CONSTANTS`` are allowed too.

    A small model asked for an expression often writes a list ("1. 1. 1.") or copies
    numbers from nowhere ("15 * 2 + 10"); held to this language it can only combine the
    question's own numbers, so the check after the turn no longer has to reject it.
    None when the question states more than ``MAX_GROUNDED_OPERANDS`` numbers.
    """
    stated = stated_numbers(question)
    # the constants only where the question states fewer than two numbers (a conversion
    # whose factor everyone knows): offered beside stated ones, a small model picks them
    # ("10 + 2 * 3") over the question's own
    usable = stated if len(stated) >= 2 else stated | SMALL_CONSTANTS
    # a number too long for a float reads as inf, which the calculator has no name for
    numbers = sorted({_written(v) for v in usable if math.isfinite(v)})
    if len(numbers) > MAX_GROUNDED_OPERANDS:
        return None
    number = "(?:" + "|".join(re.escape(n) for n in sorted(numbers, key=len, reverse=True)) + ")"
    atom = rf"\(?{number}\)?"
    return rf"\(?{atom}(?:{_OPERATOR}\(?{atom}\)?){{0,{max_operands - 1}}}\)?"
