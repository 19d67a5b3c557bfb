"""Validator tools for self-correction loops (reflect mode, graph conditions).

A validator is any callable, sync or async, taking the candidate text and
returning ``True``/``None``/``""`` when it passes, or an error message (or
``False``) when it fails. The error message is fed back to the reviser.
"""

from __future__ import annotations

import inspect
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from ._code_policy import require_code
from ._errors import InvalidCollaboration
from ._json_depth import check_schema_depth
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


#: the longest verdict message a python_tests validator returns (the client reads it)
VERDICT_CHARS = 300

# The program a python_tests validator runs in the sandbox: the answer's code, then the tests,
# in one namespace; whatever happens, its last stderr line is one verdict, JSON after a nonce
# marker: "pass", or the failure's kind and its own message. The validator reads that line
# only, so nothing else the program writes (a traceback, a file's content) reaches the client.
_HARNESS = """
import json, sys, traceback
def _verdict(text):
    sys.stderr.write("\\n" + {marker!r} + json.dumps(text) + "\\n")
    sys.stderr.flush()
def _where(exc, name):
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == name]
    return " (%s line %d)" % (name.strip("<>"), lines[-1]) if lines else ""
_g = {{"__name__": "__main__"}}
_step = "<answer>"
try:
    exec(compile({code!r}, "<answer>", "exec"), _g)
    _step = "<tests>"
    exec(compile({tests!r}, "<tests>", "exec"), _g)
except AssertionError as exc:
    _verdict("AssertionError" + _where(exc, "<tests>") + (": %s" % exc if str(exc) else ""))
    raise SystemExit(1)
except SyntaxError as exc:
    _verdict("SyntaxError in the %s, line %s: %s" % (_step.strip("<>"), exc.lineno, exc.msg))
    raise SystemExit(1)
except SystemExit:
    _verdict("the program exited before the tests finished")
    raise SystemExit(1)
except BaseException as exc:
    _verdict(type(exc).__name__ + _where(exc, _step) + (": %s" % exc if str(exc) else ""))
    raise SystemExit(1)
_verdict({passed!r})
"""


def _verdict_of(stderr: bytes, marker: str) -> str | None:
    """The harness's last verdict in ``stderr``, printable and cut to ``VERDICT_CHARS``."""
    for line in reversed(stderr.decode(errors="replace").splitlines()):
        if line.startswith(marker):
            try:
                text = json.loads(line[len(marker) :])
            except json.JSONDecodeError:
                return None
            if not isinstance(text, str):
                return None
            clean = "".join(c if c.isprintable() else " " for c in text)
            return clean if len(clean) <= VERDICT_CHARS else clean[: VERDICT_CHARS - 1] + "…"
    return None


def python_tests_validator(
    tests: str, *, timeout: float = 10.0, limits: SandboxLimits | None = None
) -> Callable[[str], Awaitable[str | None]]:
    """A validator that runs ``tests`` (Python asserts) on the answer's code in a sandbox.

    The candidate's fenced ``python`` block (or the whole answer) and then the tests run
    in one namespace in :func:`run_sandboxed`: no host files, no network, no new
    processes, a private ``/tmp``, capped CPU, memory and output, killed after
    ``timeout`` seconds. The failure message is the verdict alone (the assertion's or
    exception's own message, cut to ``VERDICT_CHARS``), never the program's output.

    Raises:
        SandboxUnavailable: this machine cannot build the sandbox (raised here, before
            any answer is checked, so a collaboration never starts without one).
    """
    reason = sandbox_unavailable()
    if reason is not None:
        raise SandboxUnavailable(f"python_tests validators need a sandbox: {reason}")

    async def validate(text: str) -> str | None:
        require_code("python_tests", "collaboration.validator.type")  # and where it runs
        marker = f"@@verdict-{secrets.token_hex(8)}@@"
        passed = "pass-" + secrets.token_hex(8)
        program = _HARNESS.format(
            marker=marker, code=fenced_block(text, "python"), tests=tests, passed=passed
        )
        result = await run_sandboxed(program, timeout=timeout, limits=limits)
        if result.timed_out:
            return f"the tests did not finish within {timeout} s"
        verdict = _verdict_of(result.stderr, marker)
        if result.ok and verdict == passed:
            return None
        if verdict is not None and verdict != passed:
            return "tests failed: " + verdict
        if result.returncode is not None and result.returncode < 0:
            return f"tests failed: killed by signal {-result.returncode} (a resource limit)"
        return f"tests failed: exit code {result.returncode}"

    return validate


def validator_json_schema() -> dict[str, Any]:
    """JSON Schema of a validator's JSON form (``validator_from_spec``), for the OpenAPI
    document: wherever a validator can appear, it is described by this one schema."""
    return {
        "type": "object",
        "description": "A check of the answer: json, json_schema, or python_tests (runs "
        "client code, in the sandbox; only on a server started with --allow-code-validators).",
        "oneOf": [
            {
                "required": ["type"],
                "properties": {"type": {"const": "json"}},
                "additionalProperties": False,
            },
            {
                "required": ["type", "schema"],
                "properties": {"type": {"const": "json_schema"}, "schema": {"type": "object"}},
                "additionalProperties": False,
            },
            {
                "required": ["type", "tests"],
                "properties": {
                    "type": {"const": "python_tests"},
                    "tests": {"type": "string", "minLength": 1},
                    "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 60},
                },
                "additionalProperties": False,
            },
        ],
    }


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
        check_schema_depth(schema, "collaboration.validator.schema")  # before any recursion
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(dict(schema))
        except jsonschema.SchemaError as exc:
            raise InvalidCollaboration(
                "collaboration.validator.schema", f"invalid schema: {exc.message}"
            ) from None
        return json_schema_validator(schema)
    if kind == "python_tests":
        require_code("python_tests", "collaboration.validator.type")
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
