"""The one gate for client code: may this spec run code on this machine?

Three things in a collaboration spec run code that a client (or its model) wrote:
a ``python_tests`` validator (wherever one can appear: the top level, a graph edge's
``when``, ``reflect``, ``best_of``, ``auto``), the calculator (``compute``,
``auto``'s ``calculator`` option, the ``calculator`` tool) and nothing else. Each
place that builds one, and each place that runs one, calls :func:`require_code`,
which reads the :class:`CodePolicy` in force (a context variable: the server sets
its own for every request, from ``--allow-code-validators`` and ``--calculator``).

In a Python program the caller is the operator: everything is allowed unless a
policy says otherwise (``with code_policy(CodePolicy.deny_all()):``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Literal

import attrs

from ._errors import InvalidCollaboration

#: what can run client code: the ``python_tests`` validator, and the calculator
CodeKind = Literal["python_tests", "calculator"]


@attrs.frozen(kw_only=True)
class CodePolicy:
    """Which kinds of client code may run, and how an operator turns each on.

    Attributes:
        python_tests: ``python_tests`` validators may run (in the sandbox).
        calculator: the calculator may evaluate model-written arithmetic (in the sandbox).
        enable_hint: what a refusal tells the client, per kind (e.g. the server's flag).
    """

    python_tests: bool = True
    calculator: bool = True
    enable_hint: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    def deny_all(cls) -> CodePolicy:
        """Nothing runs client code."""
        return cls(python_tests=False, calculator=False)

    def allows(self, kind: CodeKind) -> bool:
        return self.python_tests if kind == "python_tests" else self.calculator


_DESCRIBE = {
    "python_tests": "python_tests runs client code on the server",
    "calculator": "the calculator evaluates model-written arithmetic on the server",
}

#: in a Python program, the caller is the operator
_TRUSTED = CodePolicy()
_policy: ContextVar[CodePolicy | None] = ContextVar("microagent_code_policy", default=None)


def current_code_policy() -> CodePolicy:
    """The policy in force here."""
    return _policy.get() or _TRUSTED


@contextlib.contextmanager
def code_policy(policy: CodePolicy) -> Iterator[CodePolicy]:
    """Hold ``policy`` for the code in this block and every task it starts."""
    token = _policy.set(policy)  # reset below: the policy ends with the block
    try:
        yield policy
    finally:
        _policy.reset(token)


def require_code(kind: CodeKind, field: str) -> None:
    """Refuse ``kind`` of client code unless the policy in force allows it.

    Raises:
        InvalidCollaboration: naming ``field``, saying how to allow it.
    """
    policy = current_code_policy()
    if policy.allows(kind):
        return
    hint = policy.enable_hint.get(kind, "")
    raise InvalidCollaboration(
        field, f"{_DESCRIBE[kind]} and is disabled" + (f"; {hint}" if hint else "")
    )
