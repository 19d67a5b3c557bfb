"""OpenAI-style API errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse


class ApiError(Exception):
    """An error answered to the client with an HTTP status and an OpenAI error body.

    Args:
        status: the HTTP status.
        message: what is wrong, naming the input at fault.
        param: the request field at fault (dotted path), if any.
        code: a short machine-readable code.
        type: the OpenAI error type.
        headers: extra response headers (``Retry-After`` on overload).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _default_type(status)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status in (429, 503):
        return "overloaded_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message, param=param, code=code, type="invalid_request_error")


def invalid_collaboration(field: str, reason: str) -> ApiError:
    """The 400 of a collaboration's ``InvalidCollaboration``, named by its body path (a
    mode option's field lives under ``collaboration``), whether found planning or running."""
    if not field.startswith(("collaboration", "agents")):
        field = f"collaboration.{field}"
    return bad_request(f"{field}: {reason}", field)


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the errors a route answers (one error body schema)."""
    what = {
        400: "Bad input: the message names the field (``error.param``)",
        401: "Missing or wrong API key",
        404: "The request's ``model`` is not served here (``code`` ``model_not_found``; "
        "``GET /v1/models`` lists what is)",
        413: "The body is larger than the server accepts",
        422: "The request ran but its own setup left no answer (``code`` ``no_answer``: "
        "a graph whose conditions pruned its output node; ``param`` names "
        "``collaboration.output``)",
        429: "Too many requests or collaborations at once (see Retry-After)",
        500: "An internal error",
        503: "The engine is restarting or its queue is full (see Retry-After)",
        504: "The collaboration ran past ``collaboration.timeout`` (the server's limit by "
        "default; ``type`` ``timeout_error``, ``code`` ``collaboration_timeout``); "
        "everything it started was cancelled",
    }
    return {
        status: {
            "description": what[status],
            "content": {"application/json": {"schema": _ERROR_SCHEMA}},
        }
        for status in statuses
    }
