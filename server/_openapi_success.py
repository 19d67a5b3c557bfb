"""What the routes answer on success, for the OpenAPI document (errors: ``_errors``).

A chat completion answers a ``chat.completion`` object, or, with ``stream``,
an SSE stream of ``chat.completion.chunk`` events (``text/event-stream``); both
are documented, so a client (or schemathesis) can check every 200 against them.
"""

from __future__ import annotations

from typing import Any

_USAGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {
            "type": "object",
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
            "required": ["cached_tokens"],
        },
        "saved_completion_tokens": {"type": "integer", "minimum": 0},
        "by_model": {
            "type": "object",
            "description": "With agents: each served model's tokens (its own tokenizer's "
            "counts; a remote's as its endpoint reported them)",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer", "minimum": 0},
                    "cached_tokens": {"type": "integer", "minimum": 0},
                    "completion_tokens": {"type": "integer", "minimum": 0},
                    "requests": {"type": "integer", "minimum": 0},
                    "remote": {"type": "boolean"},
                },
                "required": [
                    "prompt_tokens",
                    "cached_tokens",
                    "completion_tokens",
                    "requests",
                    "remote",
                ],
            },
        },
    },
    "required": ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"],
}

_CHOICE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "message": {
            "type": "object",
            "properties": {
                "role": {"type": "string", "enum": ["assistant"]},
                "content": {"type": ["string", "null"]},
                "tool_calls": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["role", "content"],
        },
        "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"]},
    },
    "required": ["index", "message", "finish_reason"],
}

COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["chat.completion"]},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": _CHOICE, "minItems": 1},
        "usage": _USAGE,
        "collaboration": {
            "type": "object",
            "description": "With agents: per-agent outputs, votes, pruned agents, rounds",
        },
    },
    "required": ["id", "object", "created", "model", "choices", "usage"],
}


def _sse_event(description: str, event: dict[str, Any]) -> dict[str, Any]:
    """One SSE event of a stream (Open API before 3.2: ``schema`` describes each event):
    ``[DONE]``, an ``event`` as JSON, or an error before ``[DONE]``."""
    return {
        "type": "object",
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "type": "object",
                            "description": description,
                            "anyOf": [event, {"required": ["error"]}],
                        },
                    },
                ]
            }
        },
        "required": ["data"],
    }


_EVENT = _sse_event(
    "a chat.completion.chunk, or an error before [DONE]",
    {
        "properties": {
            "object": {"const": "chat.completion.chunk"},
            "choices": {"type": "array"},
        },
        "required": ["id", "object", "model", "choices"],
    },
)


def _ok(description: str, body: dict[str, Any], event: dict[str, Any]) -> dict[int | str, Any]:
    """A route's ``200``: a JSON ``body``, or (``stream: true``) an SSE stream of ``event``s."""
    return {
        200: {
            "description": description,
            "content": {
                "application/json": {"schema": body},
                "text/event-stream": {"schema": event},
            },
        }
    }


def completion_responses() -> dict[int | str, dict[str, Any]]:
    """The ``200`` entry of ``POST /v1/chat/completions``: JSON, or an SSE stream."""
    return _ok(
        "A chat.completion object; with stream: true, an SSE stream of "
        "chat.completion.chunk events ending with `data: [DONE]` (an `error` event "
        "before it if the request failed after the stream started)",
        COMPLETION_SCHEMA,
        _EVENT,
    )


def health_responses() -> dict[int | str, dict[str, Any]]:
    """``GET /health``: ok; degraded (still 200) while an MCP server is down and being
    restarted; 503 while the server drains for a shutdown."""
    body = {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["ok", "degraded", "draining"]},
            "models": {"type": "array", "items": {"type": "string"}},
            "mcp_down": {
                "type": "array",
                "items": {"type": "string"},
                "description": "MCP servers down now (restarted with backoff; their tools "
                "fail meanwhile)",
            },
        },
        "required": ["status", "models"],
    }
    return {
        200: {
            "description": "Serving (degraded: an MCP server is down, the models serve)",
            "content": {"application/json": {"schema": body}},
        },
        503: {
            "description": "Shutting down: new requests get 503 (see Retry-After)",
            "content": {"application/json": {"schema": body}},
        },
    }


#: A ``response`` object of ``POST /v1/responses`` (the fields every reply carries).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "in_progress"]},
        "model": {"type": "string"},
        "output": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"enum": ["message", "function_call"]}},
                "required": ["type", "id"],
            },
        },
        "usage": {
            "type": ["object", "null"],
            "properties": {
                "input_tokens": {"type": "integer", "minimum": 0},
                "output_tokens": {"type": "integer", "minimum": 0},
                "total_tokens": {"type": "integer", "minimum": 0},
                "input_tokens_details": {
                    "type": "object",
                    "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
                },
            },
        },
    },
    "required": ["id", "object", "created_at", "status", "model", "output"],
}

#: One event of a streamed response: a typed, numbered event, an error, or ``[DONE]``.
_RESPONSE_EVENT = _sse_event(
    "a response.* event, or an error before [DONE]",
    {"required": ["type", "sequence_number"]},
)


def response_responses() -> dict[int | str, dict[str, Any]]:
    """The ``200`` entry of ``POST /v1/responses``: a ``response`` object, or its events."""
    return _ok(
        "A response object; with stream: true, an SSE stream of response.* events "
        "(response.created … response.completed), ending with `data: [DONE]` (an `error` "
        "event before it if the request failed)",
        RESPONSE_SCHEMA,
        _RESPONSE_EVENT,
    )


#: A ``text_completion`` object of ``POST /v1/completions``.
TEXT_COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "text_completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "text": {"type": "string"},
                    "logprobs": {"type": "null"},
                    "finish_reason": {"enum": ["stop", "length"]},
                },
                "required": ["index", "text", "finish_reason"],
            },
        },
        "usage": _USAGE,
    },
    "required": ["id", "object", "created", "model", "choices", "usage"],
}

_TEXT_EVENT = _sse_event(
    "a text_completion chunk, or an error before [DONE]",
    {
        "properties": {"object": {"const": "text_completion"}, "choices": {"type": "array"}},
        "required": ["id", "object", "model", "choices"],
    },
)


def text_completion_responses() -> dict[int | str, dict[str, Any]]:
    """The ``200`` entry of ``POST /v1/completions``: JSON, or an SSE stream."""
    return _ok(
        "A text_completion object; with stream: true, an SSE stream of text_completion "
        "chunks (each choice's next text) ending with `data: [DONE]`",
        TEXT_COMPLETION_SCHEMA,
        _TEXT_EVENT,
    )
