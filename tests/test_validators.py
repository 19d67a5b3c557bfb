"""Validators: python_tests runs the candidate in the sandbox and explains each failure."""

from __future__ import annotations

import pytest
from microagent.collab import (
    InvalidCollaboration,
    SandboxUnavailable,
    python_tests_validator,
    run_validator,
    validator_from_spec,
)

pytestmark = pytest.mark.anyio

ANSWER = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"


async def test_passing_tests_pass() -> None:
    verdict = await run_validator(python_tests_validator("assert add(2, 3) == 5"), ANSWER)
    assert verdict.ok


async def test_a_failing_test_names_its_assertion() -> None:
    check = python_tests_validator("assert add(2, 2) == 5, 'add(2, 2) should be 5'")
    verdict = await run_validator(check, ANSWER)
    assert not verdict.ok
    assert verdict.message == "tests failed: AssertionError: add(2, 2) should be 5"


async def test_a_candidate_that_never_ends_is_reported_as_a_timeout() -> None:
    looping = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    verdict = await run_validator(python_tests_validator("add(1, 2)", timeout=1.0), looping)
    assert verdict.message == "the tests did not finish within 1.0 s"


async def test_the_candidate_cannot_reach_the_network() -> None:
    tests = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)"
    verdict = await run_validator(python_tests_validator(tests), ANSWER)
    assert not verdict.ok and "unreachable" in verdict.message


def test_without_a_sandbox_no_validator_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("microagent.collab._validators.sandbox_unavailable", lambda: "no unshare")
    with pytest.raises(SandboxUnavailable, match="no unshare"):
        python_tests_validator("assert True")
    spec = {"type": "python_tests", "tests": "assert True"}
    with pytest.raises(InvalidCollaboration) as info:
        validator_from_spec(spec)
    assert info.value.field == "collaboration.validator.type"
    assert "no unshare" in info.value.reason
