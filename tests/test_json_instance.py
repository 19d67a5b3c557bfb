"""The ScriptedEngine's JSON documents (engine_bridge/scripted/_json_instance.py) fit a schema."""

from __future__ import annotations

import random
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from microagent.engine_bridge.scripted._json_instance import example_instance

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5}}},
    {"type": "array", "items": {"type": "string", "minLength": 9}, "minItems": 2, "maxItems": 3},
    {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    {"enum": ["x", 2, None]},
    {"const": {"k": [1]}},
    {"allOf": [{"type": "object"}, {"properties": {"b": {"type": "number", "minimum": 0.5}}}]},
    {"type": ["string", "null"], "maxLength": 2},
    {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"enum": ["f"]}, "arguments": {"type": "object"}},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                },
            }
        },
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
@given(seed=st.integers(0, 2**32))
def test_example_is_valid(schema: dict[str, Any], seed: int) -> None:
    jsonschema.validate(example_instance(schema, random.Random(seed)), schema)


@pytest.mark.parametrize(
    "schema",
    [{"$ref": "#/$defs/x"}, {"type": "string", "pattern": "^a+$"}],
)
def test_unsupported_schemas_are_refused_clearly(schema: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not supported"):
        example_instance(schema, random.Random(0))
