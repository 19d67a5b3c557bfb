"""The OpenAPI document: every rule of a request that JSON Schema can express.

``request_rules`` is the ``ChatCompletionRequest`` schema's own part (bounds,
what a collaboration does not take, what needs what); ``served_rules`` adds what
is known only at run time (the served models, registered modes and adapters,
the server's tools and limits); ``openapi`` builds the document and rebuilds it
when one of those changes. Rules JSON Schema cannot express are named in their
field's description (``tests/test_schemathesis.py`` lists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from fastapi import FastAPI

from ..collab import AgentSpec, collaboration_modes, get_mode
from ..engine_bridge import MAX_TOP_LOGPROBS
from ._state import ServerState

#: The most ``metadata`` pairs a request may carry.
MAX_METADATA_PAIRS = 16
#: The most function tools a plain completion may offer.
MAX_TOOLS = 128
#: Parameters a collaboration does not take (its agents' own fields say how they sample).
PLAIN_ONLY = (
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
)

#: A request with ``agents`` or ``collaboration`` (an explicit null is "not given").
_COLLABORATION = {
    "anyOf": [
        {"required": ["agents"], "properties": {"agents": {"type": "array"}}},
        {"required": ["collaboration"], "properties": {"collaboration": {"type": "object"}}},
    ]
}


#: Some message carries text: a non-blank content, a tool result or an assistant's calls.
_SOME_TEXT = {
    "anyOf": [
        {"properties": {"role": {"const": "tool"}}},
        {
            "required": ["tool_calls"],
            "properties": {"tool_calls": {"type": "array", "minItems": 1}},
        },
        {
            "required": ["content"],
            "properties": {
                "content": {
                    "anyOf": [
                        {"type": "string", "pattern": "\\S"},
                        {
                            "type": "array",
                            "contains": {
                                "required": ["text"],
                                "properties": {"text": {"type": "string", "pattern": "\\S"}},
                            },
                        },
                    ]
                }
            },
        },
    ]
}


def _bounds(param: str) -> dict[str, Any]:
    """The JSON Schema bounds of a sampling field a request shares with an agent."""
    rule = AgentSpec.field_rules()[param].json_schema()
    return {k: v for k, v in rule.items() if k in ("minimum", "maximum", "exclusiveMinimum")}


def request_rules(schema: dict[str, Any]) -> None:
    """Document every rule of a request that JSON Schema can express (``_params`` enforces them).

    Undeclared parameters are refused (extra fields are kept to name them); bounds,
    the parameters a collaboration does not take, and what needs what are ``if``/``then``.
    """
    schema["additionalProperties"] = False
    props = schema["properties"]
    for name in ("temperature", "top_p"):
        props[name].update(_bounds(name))
    props["n"]["minimum"] = 1
    for name in ("frequency_penalty", "presence_penalty"):  # Sampling's bounds
        props[name].update(minimum=-2, maximum=2)
    props["min_p"].update(minimum=0, maximum=1)
    props["repetition_penalty"].update(exclusiveMinimum=0, maximum=2)
    props["seed"].update(minimum=-(2**63), maximum=2**63 - 1)
    for name in ("max_tokens", "max_completion_tokens"):
        props[name]["minimum"] = 1
        props[name]["description"] = (
            "At least 1; the prompt plus this budget must fit the model's context and the "
            "server's KV pool (a rule JSON Schema cannot express: it depends on the prompt)."
        )
    props["top_logprobs"].update(minimum=0, maximum=MAX_TOP_LOGPROBS)
    props["metadata"]["maxProperties"] = MAX_METADATA_PAIRS
    props["store"] = {"enum": [False, None], "description": "Completions are not stored."}
    props["service_tier"] = {"enum": ["auto", "default", None]}
    props["stop"] = {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
            {"type": "null"},
        ]
    }
    props["top_k"] = {
        "anyOf": [{"type": "integer", "minimum": 1}, {"const": -1}, {"type": "null"}],
        "description": "vLLM: sample from the k most likely (-1: all)",
    }
    props["tool_choice"] = {
        "anyOf": [
            {"enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
            {"type": "null"},
        ],
        "description": "Needs tools (unless none). A named function must be one of tools "
        "(a rule JSON Schema cannot express).",
    }
    props["tools"]["maxItems"] = MAX_TOOLS
    props["tools"]["description"] = (
        "Function tools of a plain completion: at least one (with agents, only an empty list, "
        "meaning none). Their names must be unique and each parameters a JSON Schema without "
        "$ref (rules JSON Schema cannot express)."
    )
    props["messages"]["contains"] = _SOME_TEXT
    props["messages"]["description"] = (
        "The conversation; some message carries text. A tool message must answer a call of "
        "an earlier assistant message (a rule JSON Schema cannot express)."
    )
    plain_only = {
        name: {"enum": [None, False]} if name != "tools" else {"maxItems": 0} for name in PLAIN_ONLY
    }
    agent_tokens = {"maximum": AgentSpec.field_rules()["max_tokens"].maximum}
    tools_active = {
        "required": ["tools"],
        "properties": {
            "tools": {"type": "array", "minItems": 1},
            "tool_choice": {"not": {"const": "none"}},
        },
    }
    json_format = {
        "required": ["response_format"],
        "properties": {
            "response_format": {
                "type": "object",
                "properties": {"type": {"enum": ["json_object", "json_schema"]}},
            }
        },
    }
    schema["allOf"] = [
        {
            "if": _COLLABORATION,
            "then": {
                "properties": {
                    "n": {"const": 1},
                    "max_tokens": agent_tokens,
                    "max_completion_tokens": agent_tokens,
                    **plain_only,
                }
            },
            "else": {
                "properties": {"tools": {"minItems": 1}},
                "allOf": [
                    {
                        "if": {
                            "required": ["tool_choice"],
                            "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}},
                        },
                        "then": {
                            "required": ["tools"],
                            "properties": {"tools": {"type": "array"}},
                        },
                    },
                    {"not": {"allOf": [tools_active, json_format]}},
                ],
            },
        },
        {
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer"}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        },
    ]


def served_rules(
    document: dict[str, Any],
    *,
    models: Sequence[str],
    adapters: Sequence[str],
    modes: Sequence[str],
    server_tools: Sequence[str],
    max_n: int,
    max_agents_per_spec: int,
    max_total_agents: int,
) -> None:
    """Add to the OpenAPI ``document`` the rules that depend on this server, as it runs.

    The served models, the registered modes and adapters, the server's tools and its
    limits are known only at run time; the document is rebuilt when they change.
    """
    schemas = document["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]["properties"]
    request["model"] = {
        "enum": [*models, None],
        "description": 'A served model ("default" or null: the first served).',
    }
    request["n"]["maximum"] = max_n
    agents = request["agents"]["anyOf"][0]
    agents["maxItems"] = max_total_agents
    agents["description"] = (
        f"At most {max_total_agents} agents in all (the counts' sum), names unique, each "
        "adapter registered on its agent's model (rules JSON Schema cannot express)."
    )
    agent = agents["items"]["properties"]
    agent["count"]["maximum"] = min(
        agent["count"].get("maximum", max_agents_per_spec), max_agents_per_spec
    )
    agent["model"] = {**agent["model"], "enum": [*models, None]}
    agent["adapter"] = {**agent["adapter"], "enum": [*adapters, None]}
    collaboration = schemas["CollaborationModel"]["properties"]
    collaboration["mode"] = {
        "enum": list(modes),
        "description": "A registered collaboration mode (built-in or register_mode's); "
        "its options are its config's fields, checked by its own code too (value rules "
        "JSON Schema cannot express).",
    }
    schemas["CollaborationModel"]["allOf"] = [_mode_rules(name) for name in modes]
    collaboration["tools"] = {
        "anyOf": [
            {"type": "array", "items": {"enum": list(server_tools)}},
            {"type": "null"},
        ],
        "description": collaboration["tools"].get("description", ""),
    }


def _mode_rules(name: str) -> dict[str, Any]:
    """The options mode ``name`` takes: its config's fields (rounds only if it has rounds)."""
    op = get_mode(name)
    options = {f.name for f in attrs.fields(op.Config)} | {"mode", "tools", "tool_choice"}
    then: dict[str, Any] = {"propertyNames": {"enum": sorted(options)}}
    if not op.uses_rounds:
        then["properties"] = {"rounds": {"type": "null"}}
    return {"if": {"properties": {"mode": {"const": name}}}, "then": then}


def openapi(app: FastAPI, state: ServerState) -> dict[str, Any]:
    """FastAPI's document without its validation 422s, plus this server's own rules.

    Validation errors are answered 400. The served models, registered modes and
    adapters and the server's tools are listed as they are now: the document is
    rebuilt when one of them changes (``register_mode`` after startup, say).
    """
    models = sorted({*state.engines, *(b.model for b in state.engines.values()), "default"})
    adapters = sorted({a for b in state.engines.values() for a in b.adapters})
    served = (tuple(models), tuple(adapters), tuple(collaboration_modes()), tuple(state.tools))
    if app.openapi_schema is None or state.openapi_for != served:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                responses = operation.get("responses", {})
                if "HTTPValidationError" in str(responses.get("422")):  # FastAPI's, not ours
                    responses.pop("422")
        components = schema.get("components", {}).get("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        served_rules(
            schema,
            models=models,
            adapters=adapters,
            modes=served[2],
            server_tools=served[3],
            max_n=state.limits.max_n,
            max_agents_per_spec=state.limits.max_agents_per_spec,
            max_total_agents=state.limits.max_total_agents,
        )
        app.openapi_schema = schema
        state.openapi_for = served
    return app.openapi_schema
