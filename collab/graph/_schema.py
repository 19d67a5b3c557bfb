"""The JSON Schema of a graph's dict form (nodes take their fields' rules from ``AgentSpec``)."""

from __future__ import annotations

from typing import Any

from .._patterns import MAX_PATTERN_CHARS
from .._spec import agent_json_schema
from .._validators import validator_json_schema
from ._ir import MAX_GRAPH_EDGES, MAX_GRAPH_NODES, MAX_LOOP_ITERATIONS, NODE_AGENT_FIELDS


def graph_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of a graph's dict form, for the server's OpenAPI document."""
    condition = {
        "type": "object",
        "description": "A predicate on the source node's output text.",
        "oneOf": [
            {
                "required": ["contains"],
                "properties": {"contains": {"type": "string", "minLength": 1}},
                "additionalProperties": False,
            },
            {
                "required": ["not_contains"],
                "properties": {"not_contains": {"type": "string", "minLength": 1}},
                "additionalProperties": False,
            },
            {
                "required": ["regex"],
                "properties": {"regex": {"type": "string", "maxLength": MAX_PATTERN_CHARS}},
                "additionalProperties": False,
            },
            {
                "required": ["validator"],
                "properties": {"validator": validator_json_schema()},
                "additionalProperties": False,
            },
        ],
    }
    node = agent_json_schema(NODE_AGENT_FIELDS)
    node["properties"]["join"] = {
        "type": "boolean",
        "default": False,
        "description": "The node receives several unconditional predecessors (AND-join).",
    }
    edge = {
        "type": "object",
        "required": ["from", "to"],
        "additionalProperties": False,
        "properties": {
            "from": {"type": "string"},
            "to": {"type": "string"},
            "when": condition,
            "max_iterations": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LOOP_ITERATIONS,
            },
        },
    }
    names = {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "CollaborationGraph",
        "type": "object",
        "properties": {
            "nodes": {
                "type": "array",
                "items": {"oneOf": [{"type": "string"}, node]},
                "maxItems": MAX_GRAPH_NODES,
            },
            "edges": {"type": "array", "items": edge, "maxItems": MAX_GRAPH_EDGES},
            "entry": names,
            "output": {"type": "string"},
        },
        "additionalProperties": False,
    }
