"""Validator tools for self-correction loops (reflect mode, graph conditions).

A validator is any callable, sync or async, taking the candidate text and
returning ``True``/``None``/``""`` when it passes, or an error message (or
``False``) when it fails. The error message is fed back to the reviser.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from ._errors import InvalidCollaboration
from ._sandbox import SandboxLimits, SandboxUnavailable, run_sandboxed, sandbox_unavailable

Validator = Callable[[str], "bool | str | Awaitable[bool | str | None] | None"]


@attrs.frozen
class Verdict:
    """The outcome of a validator: ``ok``, and the message to feed back when not."""

    ok: bool
    message: str = ""


async def run_validator(validator: Validator, text: str) -> Verdict:
    """Call a sync or async validator and normalise what it returns.

    A validator that raises counts as a failure whose message is the exception.
    """
    try:
        result: Any = validator(text)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # a validator's bug is a failed validation, reported
        return Verdict(False, f"validator raised {type(exc).__name__}: {exc}")
    if result is None or result is True or result == "":
        return Verdict(True)
    if result is False:
        return Verdict(False, "the answer did not pass validation")
    if isinstance(result, Verdict):
        return result
    return Verdict(False, str(result))


def fenced_block(text: str, language: str) -> str:
    """The body of the first fenced block of ``text`` (``language`` tag dropped), else ``text``."""
    parts = text.split("```")
    if len(parts) < 3:
        return text
    body = parts[1]
    head = body.lstrip()
    if head.lower().startswith(language):
        return head[len(language) :]
    return body


def extract_json(text: str) -> str:
    """The JSON part of a model answer (inside ``` fences or from the first brace)."""
    body = fenced_block(text.strip(), "json")
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if starts:
        body = body[min(starts) :]
        end = max(body.rfind("}"), body.rfind("]"))
        if end >= 0:
            body = body[: end + 1]
    return body.strip()


def json_schema_validator(schema: Mapping[str, Any]) -> Callable[[str], str | None]:
    """A validator that requires the answer to hold JSON valid against ``schema``."""
    import jsonschema

    checker = jsonschema.Draft202012Validator(dict(schema))

    def validate(text: str) -> str | None:
        try:
            data = json.loads(extract_json(text))
        except json.JSONDecodeError as exc:
            where = f"{exc.msg} at position {exc.pos}"
            return f"the answer is not valid JSON ({where}); reply with JSON only"
        errors = sorted(checker.iter_errors(data), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.path) or "the top level"
            return f"JSON schema violation at {where}: {first.message}"
        return None

    return validate


def python_tests_validator(
    tests: str, *, timeout: float = 10.0, limits: SandboxLimits | None = None
) -> Callable[[str], Awaitable[str | None]]:
    """A validator that runs ``tests`` (Python asserts) on the answer's code in a sandbox.

    The candidate's fenced ``python`` block (or the whole answer) and the tests run
    together in :func:`run_sandboxed`: no network, no new processes, a read-only
    file system but for a private ``/tmp``, capped CPU, memory and output, killed
    after ``timeout`` seconds.

    Raises:
        SandboxUnavailable: this machine cannot build the sandbox (raised here, before
            any answer is checked, so a collaboration never starts without one).
    """
    reason = sandbox_unavailable()
    if reason is not None:
        raise SandboxUnavailable(f"python_tests validators need a sandbox: {reason}")

    async def validate(text: str) -> str | None:
        code = fenced_block(text, "python")
        result = await run_sandboxed(code + "\n\n" + tests + "\n", timeout=timeout, limits=limits)
        if result.timed_out:
            return f"the tests did not finish within {timeout} s"
        if result.ok:
            return None
        err = result.stderr.decode(errors="replace").strip().splitlines()
        return "tests failed: " + (err[-1] if err else f"exit code {result.returncode}")

    return validate


def validator_from_spec(spec: Any) -> Validator:
    """Build a validator from an HTTP request's JSON: ``{"type": "json_schema", "schema": {...}}``,
    ``{"type": "json"}`` or ``{"type": "python_tests", "tests": "...", "timeout": 10}``."""
    if callable(spec):
        return spec  # type: ignore[no-any-return]
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise InvalidCollaboration("collaboration.validator", "must be an object with a 'type'")
    kind = spec["type"]
    if kind == "json":
        return json_schema_validator({})
    if kind == "json_schema":
        schema = spec.get("schema")
        if not isinstance(schema, Mapping):
            raise InvalidCollaboration(
                "collaboration.validator.schema", "must be a JSON schema object"
            )
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(dict(schema))
        except jsonschema.SchemaError as exc:
            raise InvalidCollaboration(
                "collaboration.validator.schema", f"invalid schema: {exc.message}"
            ) from None
        return json_schema_validator(schema)
    if kind == "python_tests":
        tests = spec.get("tests")
        if not isinstance(tests, str) or not tests.strip():
            raise InvalidCollaboration(
                "collaboration.validator.tests", "must be Python source with asserts"
            )
        timeout = spec.get("timeout", 10.0)
        if not isinstance(timeout, int | float) or not 0 < timeout <= 60:
            raise InvalidCollaboration(
                "collaboration.validator.timeout", "must be in (0, 60] seconds"
            )
        try:
            return python_tests_validator(tests, timeout=float(timeout))
        except SandboxUnavailable as exc:
            raise InvalidCollaboration("collaboration.validator.type", str(exc)) from None
    raise InvalidCollaboration(
        "collaboration.validator.type",
        f"unknown validator type {kind!r}; use json, json_schema or python_tests",
    )
