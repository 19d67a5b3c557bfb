"""The one agent schema: ``AgentSpec``'s fields, their types and bounds, and ``AnswerSpec``.

Each field's rule (accepted JSON types, bounds, meaning) is attrs metadata on
``AgentSpec``. Everything else that describes an agent derives from it: graph
nodes, Markdown role files, the HTTP request's JSON schema (and with it the
OpenAPI document) and the server's checks. Change a bound here and every one
of them follows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import regex

from ._errors import InvalidCollaboration
from ._patterns import MAX_PATTERN_CHARS
from ._tally import NUMBER_PATTERN, Extractor

#: Most identical agents one spec (or one graph node) may fan out to.
MAX_AGENT_COUNT: Final = 64
#: Largest completion budget of one agent turn.
MAX_AGENT_TOKENS: Final = 32768
#: Longest agent name.
MAX_NAME_LENGTH: Final = 128
#: Most tools one agent may be given by name.
MAX_AGENT_TOOLS: Final = 32

_RULE: Final = "microagent.rule"


@attrs.frozen
class FieldRule:
    """The type, bounds and meaning of one agent field (the single definition of each).

    Attributes:
        types: accepted Python types of the JSON value (``bool`` is never an ``int`` here).
        doc: what the field means (the schema's ``description``).
        nullable: whether ``None`` (JSON ``null``) is accepted.
        minimum, maximum: numeric bounds (inclusive unless ``exclusive_minimum``).
        exclusive_minimum: the lower bound itself is refused.
        non_empty: a string must hold a non-blank character.
        max_length: longest accepted string (for a list: most items).
        items: a list field's item types (the list itself is JSON's array).
    """

    types: tuple[type, ...]
    doc: str
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    non_empty: bool = False
    max_length: int | None = None
    items: tuple[type, ...] | None = None

    @property
    def integer(self) -> bool:
        return self.types == (int,)

    def bounds(self) -> str:
        """The numeric range as written in error messages: ``1..64``, ``[0, 2]``, ``(0, 1]``."""
        low = "" if self.minimum is None else f"{self.minimum:g}"
        high = "" if self.maximum is None else f"{self.maximum:g}"
        if self.integer and not self.exclusive_minimum:
            return f"{low}..{high}" if high else f">= {low}"
        opening = "(" if self.exclusive_minimum else "["
        return f"{opening}{low}, {high}]"

    def problem(self, value: object) -> str | None:
        """Why ``value`` breaks this rule, or None when it holds."""
        if value is None:
            return None if self.nullable else "must not be null"
        if self.items is not None:
            return self._list_problem(value)
        if isinstance(value, bool) and bool not in self.types:
            return f"must be {self._type_name()}, got {value!r}"
        if not isinstance(value, self.types):
            return f"must be {self._type_name()}, got {type(value).__name__}"
        if isinstance(value, str):
            if self.non_empty and not value.strip():
                return "must be a non-empty string"
            if self.max_length is not None and len(value) > self.max_length:
                return f"must be at most {self.max_length} characters"
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                return f"must be a finite number, got {value!r}"
            low, high = self.minimum, self.maximum
            below = low is not None and (value <= low if self.exclusive_minimum else value < low)
            if below or (high is not None and value > high):
                return f"must be {self._type_name()} in {self.bounds()}, got {value!r}"
        return None

    def _list_problem(self, value: object) -> str | None:
        if not isinstance(value, list | tuple):
            return f"must be a list, got {type(value).__name__}"
        if self.max_length is not None and len(value) > self.max_length:
            return f"must have at most {self.max_length} items"
        item = FieldRule(self.items or (str,), self.doc, non_empty=True, max_length=MAX_NAME_LENGTH)
        for i, entry in enumerate(value):
            reason = item.problem(entry)
            if reason is not None:
                return f"item {i} {reason}"
        if len(set(value)) != len(value):
            return "must not repeat an item"
        return None

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema (2020-12) of the field."""
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        if self.items is not None:
            array: dict[str, Any] = {
                "type": ["array", "null"] if self.nullable else "array",
                "items": {"type": names[self.items[0]], "minLength": 1},
                "uniqueItems": True,
                "description": self.doc,
            }
            if self.max_length is not None:
                array["maxItems"] = self.max_length
            return array
        kinds = ["number"] if float in self.types else [names[t] for t in self.types]
        if self.nullable:
            kinds.append("null")
        schema: dict[str, Any] = {"type": kinds[0] if len(kinds) == 1 else kinds}
        number = int if self.integer else float
        if self.minimum is not None:
            key = "exclusiveMinimum" if self.exclusive_minimum else "minimum"
            schema[key] = number(self.minimum)
        if self.maximum is not None:
            schema["maximum"] = number(self.maximum)
        if self.non_empty:
            schema["minLength"] = 1
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        schema["description"] = self.doc
        return schema

    def _type_name(self) -> str:
        if self.integer:
            return "an integer"
        if float in self.types:
            return "a number"
        return "a string" if self.types == (str,) else " or ".join(t.__name__ for t in self.types)


def _check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    rule: FieldRule = attribute.metadata[_RULE]
    reason = rule.problem(value)
    if reason is not None:
        raise InvalidCollaboration(attribute.name, reason)


def _names(value: object) -> object:
    """A list of names as a tuple (anything else is left for the rule to refuse)."""
    return tuple(value) if isinstance(value, list) else value


def _field(rule: FieldRule, default: object = attrs.NOTHING) -> Any:
    return attrs.field(default=default, validator=_check, metadata={_RULE: rule})


@attrs.frozen
class AgentSpec:
    """One role of a collaboration (``count`` > 1 makes that many identical agents).

    Agents of a spec are named ``name`` (count 1) or ``name-1`` … ``name-N``.
    ``model`` picks another served model (cascade); ``adapter`` a LoRA adapter.
    """

    name: str = _field(
        FieldRule(
            (str,),
            "The agent's name (instances are name-1 … name-N).",
            non_empty=True,
            max_length=MAX_NAME_LENGTH,
        )
    )
    count: int = _field(
        FieldRule(
            (int,), "How many identical agents this spec makes.", minimum=1, maximum=MAX_AGENT_COUNT
        ),
        1,
    )
    instructions: str = _field(
        FieldRule((str,), "What the role does (the last part of its prompt)."), ""
    )
    adapter: str | None = _field(
        FieldRule((str,), "A registered LoRA adapter to run the role with.", nullable=True), None
    )
    model: str | None = _field(
        FieldRule((str,), "Another served model to run the role on.", nullable=True), None
    )
    temperature: float | None = _field(
        FieldRule(
            (int, float),
            "Sampling temperature (default: the collaboration's).",
            nullable=True,
            minimum=0,
            maximum=2,
        ),
        None,
    )
    max_tokens: int | None = _field(
        FieldRule(
            (int,),
            "Completion budget of each of its turns.",
            nullable=True,
            minimum=1,
            maximum=MAX_AGENT_TOKENS,
        ),
        None,
    )
    top_p: float | None = _field(
        FieldRule(
            (int, float),
            "Nucleus sampling mass.",
            nullable=True,
            minimum=0,
            maximum=1,
            exclusive_minimum=True,
        ),
        None,
    )
    role: str | None = _field(
        FieldRule((str,), "The role it plays in the mode (voter, aggregator…).", nullable=True),
        None,
    )
    tools: tuple[str, ...] | None = attrs.field(
        default=None,
        converter=_names,
        validator=_check,
        metadata={
            _RULE: FieldRule(
                (list, tuple),
                "The collaboration's tools this agent may call (default: all of them).",
                nullable=True,
                max_length=MAX_AGENT_TOOLS,
                items=(str,),
            )
        },
    )

    def agent_names(self) -> list[str]:
        if self.count == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(1, self.count + 1)]

    @classmethod
    def field_rules(cls) -> dict[str, FieldRule]:
        """Every field's rule (type, bounds, meaning), in declaration order: what role
        files, graph nodes and the server's parameter checks read."""
        return agent_field_rules()

    @classmethod
    def json_schema(cls, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """JSON Schema (2020-12) of an agent object (``fields``: only those; default all)."""
        return agent_json_schema(fields)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AgentSpec:
        """Build from a JSON object, with errors that name the field (``agents.<field>``)."""
        if not isinstance(data, Mapping):
            raise InvalidCollaboration("agents", "each agent must be an object")
        rules = agent_field_rules()
        unknown = sorted(set(data) - set(rules))
        if unknown:
            raise InvalidCollaboration(f"agents.{unknown[0]}", "unknown field")
        if "name" not in data:
            raise InvalidCollaboration("agents.name", "is required")
        try:
            return cls(**data)  # type: ignore[arg-type]
        except InvalidCollaboration as exc:
            raise InvalidCollaboration(f"agents.{exc.field}", exc.reason) from None


#: An agent as callers give it: a spec, or its JSON form.
AgentInput = AgentSpec | Mapping[str, object]


def agent_field_rules() -> dict[str, FieldRule]:
    """Every ``AgentSpec`` field's rule, in declaration order."""
    return {f.name: f.metadata[_RULE] for f in attrs.fields(AgentSpec)}


def check_agent_field(name: str, value: object) -> str | None:
    """Why ``value`` is not a valid ``AgentSpec.<name>``, or None when it is."""
    return agent_field_rules()[name].problem(value)


def agent_json_schema(fields: Iterable[str] | None = None) -> dict[str, Any]:
    """JSON Schema (2020-12) of an agent object (``fields``: only those; default all)."""
    rules = agent_field_rules()
    names = list(rules) if fields is None else list(fields)
    properties = {name: rules[name].json_schema() for name in names}
    defaults = {
        f.name: f.default for f in attrs.fields(AgentSpec) if f.default is not attrs.NOTHING
    }
    for name, prop in properties.items():
        if name in defaults:
            prop["default"] = defaults[name]
    return {
        "type": "object",
        "required": [n for n in names if n not in defaults],
        "additionalProperties": False,
        "properties": properties,
    }


def _choices(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


#: ``answer.extract`` presets: name -> the pattern whose last match is the answer
EXTRACT_PRESETS: dict[str, str] = {"number": NUMBER_PATTERN}


@attrs.frozen
class AnswerSpec:
    """How answers are constrained (fixed ``choices``, a ``regex``, or free text) and read.

    ``extract`` says which part of a free answer is compared when answers are
    tallied: a preset (``number``: the last number in the reply) or a regular
    expression whose last match (its first group, if it has one) is the answer.
    "3 + 1 = 4" and "The answer is 4." then both count as "4"; numbers compare by
    value ("1,000" is "1000"); a reply with no match abstains. With ``choices``
    the answer is already the choice it names.
    """

    choices: tuple[str, ...] | None = attrs.field(default=None, converter=_choices)
    regex: str | None = None
    extract: str | None = None
    #: the compiled ``extract`` pattern (a preset resolved), or None: compiled once, here
    extractor: Extractor | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.choices is not None and self.regex is not None:
            raise InvalidCollaboration("answer", "give choices or regex, not both")
        if self.extract is not None:
            if self.choices is not None:
                raise InvalidCollaboration(
                    "answer.extract", "reads free answers; with choices an answer is its choice"
                )
            source = EXTRACT_PRESETS.get(self.extract, self.extract)
            if len(source) > MAX_PATTERN_CHARS:  # a client's pattern: bounded like the others
                raise InvalidCollaboration(
                    "answer.extract",
                    f"the pattern is {len(source)} characters; the limit is {MAX_PATTERN_CHARS}",
                )
            try:
                pattern = regex.compile(source)
            except regex.error as exc:
                raise InvalidCollaboration(
                    "answer.extract",
                    f"must be {' or '.join(EXTRACT_PRESETS)} or a regular expression: {exc}",
                ) from None
            if pattern.groups > 1:
                raise InvalidCollaboration(
                    "answer.extract", "a regular expression with at most one group"
                )
            object.__setattr__(self, "extractor", pattern)
        if self.choices is not None:
            if not self.choices or not all(isinstance(c, str) and c.strip() for c in self.choices):
                raise InvalidCollaboration(
                    "answer.choices", "must be a non-empty list of non-empty strings"
                )
            if len(set(self.choices)) != len(self.choices):
                raise InvalidCollaboration("answer.choices", "must not repeat a choice")
        if self.regex is not None:
            if len(self.regex) > MAX_PATTERN_CHARS:  # compiled into the engine's grammar
                raise InvalidCollaboration(
                    "answer.regex",
                    f"the pattern is {len(self.regex)} characters; the limit is "
                    f"{MAX_PATTERN_CHARS}",
                )
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise InvalidCollaboration(
                    "answer.regex", f"invalid regular expression: {exc}"
                ) from None

    @property
    def constrained(self) -> bool:
        return self.choices is not None or self.regex is not None
