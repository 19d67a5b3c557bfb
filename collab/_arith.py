"""Arithmetic expressions: the calculator's language, checked and evaluated.

The calculator (``_calculator``) runs :func:`evaluate_expression` inside the
sandbox, shipping this module's source as the program, so what is checked
here and what runs there are one text. The module therefore imports nothing
but the standard library and stands alone.

The language is Python's expression syntax cut down to numbers: integer and
decimal literals, ``+ - * / // % **``, unary ``+ -``, comparisons (a bool
result), parentheses, tuples/lists as arguments, and the functions in
``FUNCTIONS``. Names, attributes, strings, subscripts, lambdas and every
other construct are refused before anything is evaluated, and powers are
bounded so a check can refuse ``9 ** 9 ** 9`` instead of the sandbox killing it.
"""

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

Number = int | float  # bool is an int: a comparison's value

#: the longest expression accepted (characters)
MAX_EXPRESSION_CHARS = 200
#: the largest exponent ``**`` may use, and the largest base magnitude it may raise past 2
MAX_EXPONENT = 1000
#: the most digits an integer result may have
MAX_DIGITS = 4000

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


def evaluate_expression(text: str) -> Number:
    """The value of ``text``; an :class:`ExpressionError` says what is wrong with it."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not an expression: {exc.msg}") from None
    try:
        value = _value(tree.body)
    except ExpressionError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc}") from None
    if isinstance(value, (tuple, list)):
        raise ExpressionError("the value is a list of numbers, not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError("the value is not finite")
    return value


def _value(node: ast.AST) -> Number | tuple[Number, ...]:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _number(node.left), _number(node.right)
        if isinstance(node.op, ast.Pow) and (
            abs(right) > MAX_EXPONENT or (abs(left) > 2 and abs(right) * _digits(left) > MAX_DIGITS)
        ):
            raise ExpressionError("the power is too large to compute")
        result: Number = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and _digits(result) > MAX_DIGITS:
            raise ExpressionError("the value has too many digits")
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        signed: Number = _UNARY[type(node.op)](_number(node.operand))
        return signed
    if isinstance(node, ast.Compare):
        left = _number(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _COMPARE:
                raise ExpressionError(f"{type(op).__name__} is not allowed")
            right = _number(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_number(e) for e in node.elts)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ExpressionError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExpressionError(f"only these functions are allowed: {sorted(FUNCTIONS)}")
        if node.keywords:
            raise ExpressionError("keyword arguments are not allowed")
        args = [_value(a) for a in node.args]
        if node.func.id == "factorial" and args and _number_of(args[0]) > 500:
            raise ExpressionError("factorial is limited to 500")
        called: Number = FUNCTIONS[node.func.id](*args)
        return called
    raise ExpressionError(f"{type(node).__name__} is not allowed in an expression")


def _number(node: ast.AST) -> Number:
    value = _value(node)
    return _number_of(value)


def _number_of(value: object) -> Number:
    if isinstance(value, (tuple, list)):
        raise ExpressionError("a list of numbers is allowed only as a function's argument")
    assert isinstance(value, (int, float))
    return value


def _digits(value: Number) -> int:
    return len(str(int(abs(value)))) if math.isfinite(value) else MAX_DIGITS + 1
