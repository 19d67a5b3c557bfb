"""A small valid instance of a JSON schema: what the ScriptedEngine writes under a JSON constraint.

The test double cannot run a grammar, so under ``json_schema`` it writes the
simplest document that the schema admits (enough of JSON Schema for tool
parameters and response formats: types, properties, required, enum, const,
items, anyOf/oneOf/allOf, numeric and length bounds). A random generator picks
among enum values and union branches, so seeded runs vary like samples do.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

_MAX_DEPTH = 16


def example_instance(schema: Mapping[str, object], rng: random.Random) -> JsonValue:
    """A value valid against ``schema`` (``$ref`` and patterns unsupported: a ``ValueError``)."""
    return _instance(schema, rng, 0)


def _instance(schema: Mapping[str, object], rng: random.Random, depth: int) -> JsonValue:
    if depth > _MAX_DEPTH:
        raise ValueError("schema nests too deep for an example")
    if "$ref" in schema:
        raise ValueError("schemas with $ref are not supported by the ScriptedEngine")
    if "const" in schema:
        return schema["const"]  # type: ignore[return-value]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[rng.randrange(len(enum))]  # type: ignore[no-any-return]
    for union in ("anyOf", "oneOf"):
        branches = schema.get(union)
        if isinstance(branches, list) and branches:
            return _instance(branches[rng.randrange(len(branches))], rng, depth + 1)
    merged: dict[str, object] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema.get("allOf", ()) or ():  # type: ignore[attr-defined]
        merged.update(part)
    kind = merged.get("type", "object" if "properties" in merged else "string")
    if isinstance(kind, list):
        kind = kind[0] if kind else "null"
    if kind == "object":
        props = merged.get("properties") or {}
        assert isinstance(props, Mapping)
        return {str(k): _instance(v, rng, depth + 1) for k, v in props.items()}
    if kind == "array":
        items = merged.get("items") or {}
        assert isinstance(items, Mapping)
        count = max(1, int(merged.get("minItems", 1)))  # type: ignore[call-overload]
        if "maxItems" in merged:
            count = min(count, int(merged["maxItems"]))  # type: ignore[call-overload]
        return [_instance(items, rng, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = merged.get("minimum", merged.get("exclusiveMinimum", -1))
        return int(low) + 1 + rng.randrange(3)  # type: ignore[call-overload,no-any-return]
    if kind == "number":
        low = merged.get("minimum", merged.get("exclusiveMinimum", -1))
        return float(low) + 1.5  # type: ignore[arg-type]
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if "pattern" in merged:
        raise ValueError("string patterns are not supported by the ScriptedEngine")
    words = ("alpha", "beta", "gamma", "delta")
    text = words[rng.randrange(len(words))]
    low_len = int(merged.get("minLength", 0))  # type: ignore[call-overload]
    if len(text) < low_len:
        text = text + "x" * (low_len - len(text))
    if "maxLength" in merged:
        text = text[: int(merged["maxLength"])]  # type: ignore[call-overload]
    return text
