"""Validators: python_tests runs the candidate in the sandbox and explains each failure."""

from __future__ import annotations

import pytest
from microagent.collab import InvalidCollaboration, python_tests_validator
from microagent.collab._sandbox import SandboxUnavailable
from microagent.collab._validators import run_validator, validator_from_spec

pytestmark = pytest.mark.anyio

ANSWER = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"


async def test_passing_tests_pass() -> None:
    verdict = await run_validator(python_tests_validator("assert add(2, 3) == 5"), ANSWER)
    assert verdict.ok


async def test_a_failing_test_names_its_assertion() -> None:
    check = python_tests_validator("assert add(2, 2) == 5, 'add(2, 2) should be 5'")
    verdict = await run_validator(check, ANSWER)
    assert not verdict.ok
    assert verdict.message == "tests failed: AssertionError (tests line 1): add(2, 2) should be 5"


async def test_a_candidate_that_never_ends_is_reported_as_a_timeout() -> None:
    looping = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    verdict = await run_validator(python_tests_validator("add(1, 2)", timeout=1.0), looping)
    assert verdict.message == "the tests did not finish within 1.0 s"


async def test_the_candidate_cannot_reach_the_network() -> None:
    tests = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)"
    verdict = await run_validator(python_tests_validator(tests), ANSWER)
    assert not verdict.ok and verdict.message.startswith("tests failed: OSError")


def test_without_a_sandbox_no_validator_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("microagent.collab._validators.sandbox_unavailable", lambda: "no unshare")
    with pytest.raises(SandboxUnavailable, match="no unshare"):
        python_tests_validator("assert True")
    spec = {"type": "python_tests", "tests": "assert True"}
    with pytest.raises(InvalidCollaboration) as info:
        validator_from_spec(spec)
    assert info.value.field == "collaboration.validator.type"
    assert "no unshare" in info.value.reason


async def test_a_failure_returns_the_verdict_never_the_programs_output() -> None:
    """Whatever the code prints to stderr (here a 'secret' and a long traceback), the
    message is the verdict alone: the exception's kind and its own message, bounded."""
    answer = (
        "```python\nimport sys\nsys.stderr.write('SECRET-LINE\\n' * 50)\n"
        "def add(a, b):\n    return a - b\n```"
    )
    verdict = await run_validator(python_tests_validator("assert add(2, 2) == 4"), answer)
    assert not verdict.ok
    assert verdict.message == "tests failed: AssertionError (tests line 1)"
    assert "SECRET" not in verdict.message


async def test_a_long_message_is_cut_and_an_exception_names_its_kind() -> None:
    tests = "raise ValueError('x' * 10000)"
    verdict = await run_validator(python_tests_validator(tests), ANSWER)
    assert verdict.message.startswith("tests failed: ValueError (tests line 1): xxx")
    assert len(verdict.message) <= len("tests failed: ") + 300 and verdict.message.endswith("…")


async def test_an_answer_that_exits_early_does_not_pass() -> None:
    """``sys.exit(0)`` in the answer used to skip the tests and pass."""
    answer = "```python\nimport sys\nsys.exit(0)\n```"
    verdict = await run_validator(python_tests_validator("assert False"), answer)
    assert not verdict.ok
    assert verdict.message == "tests failed: the program exited before the tests finished"
