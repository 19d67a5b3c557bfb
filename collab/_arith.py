"""Arithmetic expressions: the calculator's language, checked and evaluated.

The calculator (``_calculator``) checks an expression in process with
:func:`check_expression`, which reads its syntax tree and never evaluates, then
runs :func:`evaluate_expression` inside the sandbox, shipping this module's
source as the program, so what is checked here and what runs there are one
text. The module therefore imports nothing but the standard library and
stands alone.

The language is Python's expression syntax cut down to numbers: integer and
decimal literals, ``+ - * / // % **``, unary ``+ -``, comparisons (a bool
result), parentheses, tuples/lists as arguments, and the functions in
``FUNCTIONS``. Names, attributes, strings, subscripts, lambdas and every
other construct are refused before anything is evaluated. Every operation that
could blow up is bounded before it runs, so the evaluation refuses it at once
instead of the sandbox killing it: a power's exponent and its result's size
(``9 ** 9 ** 9``, ``(2 ** 999) ** 999``), ``factorial``'s argument, ``round``'s
digits (``round(5, -10 ** 9)`` builds a number of a billion digits), and the
digits of every integer an operation or a function returns.

A program (``compute``'s ``steps``) is a few named steps, one assignment each
(``price = 3 * 4``, ``total = price + 5``): :func:`check_step` allows a step's
expression the names of earlier steps and nothing else (no reassignment, no
dunder, ``MAX_STEPS`` steps of names at most ``MAX_NAME_CHARS`` long), and
:func:`evaluate_program` evaluates the steps in order with the same bounds.
"""

import ast
import math
import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

_OPERATOR_NODES = (ast.operator, ast.unaryop, ast.cmpop, ast.expr_context)

Number = int | float  # bool is an int: a comparison's value

#: the longest expression accepted (characters)
MAX_EXPRESSION_CHARS = 200
#: the largest exponent ``**`` may use, and the largest base magnitude it may raise past 2
MAX_EXPONENT = 1000
#: the most digits an integer result may have
MAX_DIGITS = 4000
#: the largest ``|digits|`` of ``round(x, digits)``
MAX_ROUND_DIGITS = 100
#: the largest argument of ``factorial``
MAX_FACTORIAL = 500
#: the most steps a program may have
MAX_STEPS = 6
#: the longest name a step may assign
MAX_NAME_CHARS = 24
#: a step's name: lower case, a letter first (so never a dunder)
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sum": sum,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
    "gcd": math.gcd,
    "lcm": math.lcm,
    "factorial": math.factorial,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


class ExpressionError(ValueError):
    """The expression is not in the calculator's language, or its value cannot be computed."""


def check_expression(text: str, names: Collection[str] = ()) -> ast.Expression:
    """``text``'s syntax tree, checked against the language without evaluating anything.

    Every node must be a number, a constant, an allowed operator or a call of an
    allowed function; a literal argument already out of bounds (``round(5, -10**8)``
    written out, ``factorial(1000)``) is refused here too. Bounds on computed values
    are :func:`evaluate_expression`'s, in the sandbox. ``names``: the earlier steps'
    names a program's step may read (none in a plain expression).
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an expression: {getattr(exc, 'msg', exc)}") from None
    nodes = list(ast.walk(tree.body))  # breadth first: no recursion
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        _check_node(node, id(node) in callees, names)
    return tree


def _check_node(node: ast.AST, callee: bool, names: Collection[str] = ()) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"only numbers are allowed, not {node.value!r}")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise ExpressionError(f"{type(node.op).__name__} is not allowed in an expression")
        exponent = _literal(node.right)
        if isinstance(node.op, ast.Pow) and exponent is not None and abs(exponent) > MAX_EXPONENT:
            raise ExpressionError("the power is too large to compute")
    elif isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise ExpressionError(f"{type(node.op).__name__} is not allowed in an expression")
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise ExpressionError(f"{type(op).__name__} is not allowed")
    elif isinstance(node, ast.Name):
        if node.id not in (FUNCTIONS if callee else (*CONSTANTS, *names)):
            raise ExpressionError(f"unknown name {node.id!r}")
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExpressionError(f"only these functions are allowed: {sorted(FUNCTIONS)}")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")
        _check_arguments(node.func.id, [_literal(a) for a in node.args])
    elif not isinstance(node, (ast.Tuple, ast.List, ast.Load, *_OPERATOR_NODES)):
        raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")


def _literal(node: ast.AST) -> Number | None:
    """The value of a number written out (``5``, ``-10``), else None (nothing evaluated)."""
    sign = 1
    while isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        sign = -sign if isinstance(node.op, ast.USub) else sign
        node = node.operand
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return sign * value
    return None


def _check_arguments(name: str, args: list[Number | None]) -> None:
    """The bounds of ``name``'s arguments, for those that are known (None: computed)."""
    if (
        name == "round"
        and len(args) == 2
        and args[1] is not None
        and abs(args[1]) > MAX_ROUND_DIGITS
    ):
        raise ExpressionError(f"round's digits must be within ±{MAX_ROUND_DIGITS}")
    if name == "factorial" and args and args[0] is not None and args[0] > MAX_FACTORIAL:
        raise ExpressionError(f"factorial is limited to {MAX_FACTORIAL}")


def evaluate_expression(text: str) -> Number:
    """The value of ``text``; an :class:`ExpressionError` says what is wrong with it."""
    return _evaluate(check_expression(text), {})


def check_step(text: str, names: Collection[str] = ()) -> tuple[str, ast.Expression]:
    """A program step's name and its expression's checked tree (nothing evaluated).

    A step is one assignment ``name = expression``: a new lower-case name (not an
    earlier step's, not a function or constant of the language), and an expression
    of the language that may read ``names``, the earlier steps' names.
    """
    if len(names) >= MAX_STEPS:
        raise ExpressionError(f"a program has at most {MAX_STEPS} steps")
    name, sign, expression = text.strip().partition("=")
    name = name.strip()
    if not sign or expression.lstrip().startswith("="):
        raise ExpressionError("a step assigns one name: name = expression")
    if not NAME_PATTERN.fullmatch(name):
        raise ExpressionError(
            f"a step's name is lower-case letters, digits and _, a letter first: {name[:40]!r}"
        )
    if len(name) > MAX_NAME_CHARS:
        raise ExpressionError(f"a step's name has at most {MAX_NAME_CHARS} characters")
    if name in FUNCTIONS or name in CONSTANTS:
        raise ExpressionError(f"{name!r} is the calculator's own name")
    if name in names:
        raise ExpressionError(f"{name!r} is already assigned (a step names a new value)")
    return name, check_expression(expression, names)


def evaluate_program(steps: Sequence[str]) -> list[Number]:
    """Each step's value, in order: every step checked, then evaluated with the earlier values."""
    env: dict[str, Number] = {}
    values: list[Number] = []
    for i, text in enumerate(steps, 1):
        try:
            name, tree = check_step(text, env)
            value = _evaluate(tree, env)
        except ExpressionError as exc:
            raise ExpressionError(f"step {i}: {exc}") from None
        env[name] = value
        values.append(value)
    return values


def _evaluate(tree: ast.Expression, env: Mapping[str, Number]) -> Number:
    """The value of a checked tree, names read from ``env``."""
    try:
        value = _value(tree.body, env)
    except ExpressionError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc}") from None
    if isinstance(value, (tuple, list)):
        raise ExpressionError("the value is a list of numbers, not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("the value is not finite")
    return value


def _value(node: ast.AST, env: Mapping[str, Number]) -> Number | tuple[Number, ...]:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _number(node.left, env), _number(node.right, env)
        if isinstance(node.op, ast.Pow) and (
            abs(right) > MAX_EXPONENT or (abs(left) > 2 and abs(right) * _digits(left) > MAX_DIGITS)
        ):
            raise ExpressionError("the power is too large to compute")
        result: Number = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and _digits(result) > MAX_DIGITS:
            raise ExpressionError("the value has too many digits")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        signed: Number = _UNARY[type(node.op)](_number(node.operand, env))
        return signed
    if isinstance(node, ast.Compare):
        left = _number(node.left, env)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _COMPARE:
                raise ExpressionError(f"{type(op).__name__} is not allowed")
            right = _number(right_node, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_number(e, env) for e in node.elts)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in env:
            return env[node.id]
        raise ExpressionError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExpressionError(f"only these functions are allowed: {sorted(FUNCTIONS)}")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")
        args = [_value(a, env) for a in node.args]
        numbers = [a if isinstance(a, (int, float)) else None for a in args]
        _check_arguments(node.func.id, numbers)  # the computed ones, now known
        called: Number = FUNCTIONS[node.func.id](*args)
        if isinstance(called, int) and _digits(called) > MAX_DIGITS:
            raise ExpressionError("the value has too many digits")
        return called
    raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")


def _number(node: ast.AST, env: Mapping[str, Number]) -> Number:
    value = _value(node, env)
    return _number_of(value)


def _number_of(value: object) -> Number:
    if isinstance(value, (tuple, list)):
        raise ExpressionError("a list of numbers is allowed only as a function's argument")
    assert isinstance(value, (int, float))
    return value


def _digits(value: Number) -> int:
    """At least the decimal digits of ``value``'s integer part (from its bits: no string)."""
    if isinstance(value, float) and not math.isfinite(value):  # an int may pass any float
        return MAX_DIGITS + 1
    return int(int(abs(value)).bit_length() * 0.30103) + 1
