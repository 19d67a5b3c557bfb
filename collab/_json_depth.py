"""How deeply a JSON value nests: a client's schema is refused past ``MAX_SCHEMA_DEPTH``.

jsonschema's meta-schema check, the validators and the engine's grammar compiler
all walk a schema recursively; a schema nested 95 levels deep (under 4 KB) ran
Python out of stack (a ``RecursionError``: a plain-text 500 and thousands of log
lines). Every schema a client gives (``response_format``, ``tools[].function.parameters``,
a ``json_schema`` validator) is measured here first, without recursion, and refused
past the limit with an error naming its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ._errors import InvalidCollaboration

#: the deepest a client's JSON Schema may nest, counting objects and arrays (``{}`` is 1)
MAX_SCHEMA_DEPTH: Final = 32


def json_depth(value: object, limit: int) -> int:
    """The objects and arrays nested in ``value`` (``{}`` is 1, ``{"a": []}`` is 2, ``3`` is 0).

    The walk stops at ``limit + 1``: past the limit the exact depth does not matter.
    """
    deepest = 0
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping):
            children: list[object] = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        todo.extend((child, depth + 1) for child in children)
    return deepest


def check_schema_depth(schema: object, field: str) -> None:
    """An ``InvalidCollaboration`` naming ``field`` if ``schema`` nests too deep."""
    if json_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InvalidCollaboration(
            field,
            f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays; "
            "flatten it",
        )
