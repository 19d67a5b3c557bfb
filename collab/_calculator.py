"""The built-in calculator: an arithmetic expression evaluated in the sandbox.

A 135M model cannot add two-digit numbers reliably; it can copy them into an
expression. The calculator is the tool that closes that gap (the
``compute`` mode writes expressions for it; any agent can call it as the
``calculator`` tool). Each call checks the expression's syntax tree against the
language of ``_arith`` here (a clear error at once; nothing is evaluated in this
process, where a blow-up would stall the event loop), then evaluates it in a
fresh sandbox (``run_sandboxed``: no network, read-only files, CPU, memory and
process limits), running ``_arith``'s own source there, whose bounds refuse an
operation that would blow up before it runs. Where the sandbox
cannot be built nothing is evaluated: :class:`SandboxUnavailable` (fail closed).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Sequence

from . import _arith
from ._arith import (
    MAX_EXPRESSION_CHARS,
    MAX_NAME_CHARS,
    MAX_STEPS,
    ExpressionError,
    check_expression,
    check_step,
)
from ._code_policy import require_code
from ._errors import CollaborationError
from ._sandbox import SandboxLimits, run_sandboxed
from ._tools import Tool

#: the calculator tool's name (``collaboration.tools``, ``compute``)
CALCULATOR = "calculator"
#: wall-clock (and CPU) seconds one evaluation may take in the sandbox
CALCULATOR_TIMEOUT = 5.0
#: the sandbox of one evaluation: one process, little memory, nothing written
CALCULATOR_LIMITS = SandboxLimits(
    memory_bytes=128 << 20, file_bytes=0, tmp_bytes=1 << 20, processes=1, open_files=16
)
#: the regex an expression turn is constrained by: the language's characters and functions
#: (no comparison signs: a small model ends "3 + 5" with "= 8", which is no expression)
EXPRESSION_REGEX = (
    r"(?:[0-9]|[ .,+\-*/%()]|abs|round|min|max|sum|sqrt|floor|ceil|gcd|lcm|factorial|pi)"
    r"{1,80}"
)

#: a program step's operand: a number or a name, inside calls and parentheses
_STEP_NAME = rf"[a-z][a-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}"
_STEP_ATOM = rf"(?:(?:{_STEP_NAME})?\( ?)*-?(?:[0-9]+(?:\.[0-9]+)?|{_STEP_NAME})(?: ?\))*"
#: a program step's expression: operands joined by operators (words cannot follow a value:
#: a small model that writes "x = 3 * 4 and total ..." is held to arithmetic)
_STEP_EXPRESSION = rf"{_STEP_ATOM}(?: ?(?:\*\*|//|[-+*/%,]) ?{_STEP_ATOM}){{0,15}}"
#: the regex a program step's turn is constrained by: a lower-case name, `` = ``, then the
#: expression language with lower-case names (earlier steps' names; the check says which)
STEP_REGEX = rf"{_STEP_NAME} = {_STEP_EXPRESSION}"
#: the regex of a program's last allowed step: it must assign ``answer``
ANSWER_STEP_REGEX = rf"answer = {_STEP_EXPRESSION}"

_PROGRAM = """
{source}

import json, sys
try:
    value = evaluate_expression({expression!r})
except ExpressionError as exc:
    print(json.dumps({{"error": str(exc)}}))
else:
    print(json.dumps({{"value": value}}))
"""


_STEPS_PROGRAM = """
{source}

import json, sys
try:
    values = evaluate_program({steps!r})
except ExpressionError as exc:
    print(json.dumps({{"error": str(exc)}}))
else:
    print(json.dumps({{"values": values}}))
"""


class CalculationError(CollaborationError, ValueError):
    """The expression is not arithmetic the calculator accepts, or its value is undefined."""


async def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % **, comparisons, and abs,
    round, min, max, sum, sqrt, floor, ceil, gcd, lcm, factorial) and return its value.

    Raises:
        CalculationError: not such an expression, or no finite value (division by zero).
        SandboxUnavailable: this machine cannot sandbox the evaluation (nothing ran).
    """
    return format_value(await calculate_value(expression))


async def calculate_value(expression: str) -> int | float | bool:
    """The value of ``expression``, evaluated in the sandbox (see :func:`calculate`)."""
    require_code("calculator", "tools")  # the gate holds where it runs, too
    _checked(lambda: check_expression(expression))
    program = _PROGRAM.format(source=_SOURCE, expression=expression)
    value = (await _run(program))["value"]
    if not isinstance(value, (int, float)):  # bool is an int
        raise CalculationError(f"the evaluation returned {value!r}")
    return value


async def calculate_program(steps: Sequence[str]) -> list[int | float | bool]:
    """Each value of a program of named steps (``_arith.evaluate_program``), in the sandbox.

    Every step is checked here first (its syntax tree: one new name, an expression
    reading only earlier names; at most ``MAX_STEPS``); nothing is evaluated in
    this process. A fresh sandbox holds no state between calls, so the whole
    program so far is what one call evaluates (``compute`` calls it once per step,
    the step's value being needed before the model writes the next).

    Raises:
        CalculationError: a step is not in the language, or has no finite value.
        SandboxUnavailable: this machine cannot sandbox the evaluation (nothing ran).
    """
    require_code("calculator", "tools")
    if len(steps) > MAX_STEPS:
        raise CalculationError(f"a program has at most {MAX_STEPS} steps")

    def check_all() -> None:
        names: list[str] = []
        for i, step in enumerate(steps, 1):
            try:
                names.append(check_step(step, names)[0])
            except ExpressionError as exc:
                raise ExpressionError(f"step {i}: {exc}") from None

    _checked(check_all)
    program = _STEPS_PROGRAM.format(source=_SOURCE, steps=list(steps))
    values = (await _run(program))["values"]
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
        raise CalculationError(f"the evaluation returned {values!r}")
    return values


def _checked(check: Callable[[], object]) -> None:
    """Run a syntax check in process, its failure as a :class:`CalculationError`."""
    try:
        check()
    except ExpressionError as exc:
        raise CalculationError(str(exc)) from None
    except RecursionError:
        raise CalculationError("the expression is nested too deeply") from None


async def _run(program: str) -> dict[str, object]:
    """The JSON reply of ``program`` run in a fresh sandbox (an ``error`` raised)."""
    result = await run_sandboxed(program, timeout=CALCULATOR_TIMEOUT, limits=CALCULATOR_LIMITS)
    if result.timed_out:
        raise CalculationError(f"the evaluation ran past {CALCULATOR_TIMEOUT:g} s")
    try:
        reply = json.loads(result.stdout.decode())
    except ValueError:
        detail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise CalculationError(f"the evaluation failed: {detail[0]}") from None
    if not isinstance(reply, dict):
        raise CalculationError(f"the evaluation returned {reply!r}")
    if "error" in reply:
        raise CalculationError(str(reply["error"]))
    return reply


def format_value(value: int | float | bool) -> str:
    """``value`` as an answer: ``True``/``False``, an integer, or a decimal without noise
    (``0.1 + 0.2`` is ``0.3``; 12 significant digits)."""
    if isinstance(value, int):  # bool too: True, False
        return str(value)
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"


def calculator_tool() -> Tool:
    """The calculator as a tool agents may call (``serve --calculator`` offers it)."""
    return Tool(
        name=CALCULATOR,
        fn=calculate,
        description=(
            "Evaluate an arithmetic expression exactly, e.g. 17 * 23 + 4 or max(3, 7) / 2. "
            "Use it for any arithmetic, comparison or conversion of numbers."
        ),
        parameters={
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "maxLength": MAX_EXPRESSION_CHARS,
                    "description": "the arithmetic expression, e.g. (12 + 30) / 7",
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
        timeout=CALCULATOR_TIMEOUT + 5.0,
    )


#: the program the sandbox runs: ``_arith``'s source, then one evaluation
_SOURCE = inspect.getsource(_arith)
