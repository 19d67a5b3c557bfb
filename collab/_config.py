"""The options every collaboration mode shares (``ModeConfig``) and how a mode's config is built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from ._errors import InvalidCollaboration
from ._spec import MAX_AGENT_TOKENS, AnswerSpec, agent_field_rules


def _answer(value: object) -> AnswerSpec | None:
    if value is None or isinstance(value, AnswerSpec):
        return value
    if isinstance(value, Mapping):
        extra = sorted(set(value) - {"choices", "regex", "extract"})
        if extra:
            raise InvalidCollaboration(
                f"answer.{extra[0]}", "unknown field (use choices, regex or extract)"
            )
        choices = value.get("choices")
        if choices is not None and (
            isinstance(choices, str) or not isinstance(choices, list | tuple)
        ):
            raise InvalidCollaboration("answer.choices", "must be a list of strings")
        regex = value.get("regex")
        if regex is not None and not isinstance(regex, str):
            raise InvalidCollaboration("answer.regex", "must be a string")
        extract = value.get("extract")
        if extract is not None and not isinstance(extract, str):
            raise InvalidCollaboration("answer.extract", "must be a string")
        return AnswerSpec(choices=choices, regex=regex, extract=extract)
    if isinstance(value, list | tuple):
        return AnswerSpec(choices=tuple(value))
    raise InvalidCollaboration("answer", "must be {choices: [...]} or {regex: str}")


#: Most stop strings a collaboration takes (OpenAI's limit).
MAX_STOP_STRINGS = 4


def _stops(value: object) -> tuple[str, ...]:
    """``stop`` as a tuple: a string, or a list of up to 4 non-empty strings (None: none)."""
    if value is None:
        return ()
    stops = (value,) if isinstance(value, str) else value
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidCollaboration("stop", "must be a string or a list of non-empty strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidCollaboration("stop", f"takes at most {MAX_STOP_STRINGS} strings")
    return tuple(stops)


def int_in(low: int, high: int) -> Any:
    """An attrs validator: an integer (never a bool) in ``low..high``, or None."""

    def check(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidCollaboration(attribute.name, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise InvalidCollaboration(attribute.name, f"must be in {low}..{high}, got {value}")

    return check


def not_none(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: a value is required (``null`` is refused, naming the option)."""
    if value is None:
        raise InvalidCollaboration(attribute.name, "must be an integer, got None")


def one_of(names: tuple[str, ...]) -> Any:
    """An attrs validator: one of ``names`` (a mode option's closed set of values)."""

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in names:
            raise InvalidCollaboration(
                attribute.name, f"must be one of {', '.join(names)}, got {value!r}"
            )

    return check


def boolean(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``true`` or ``false`` (never 0, 1 or a string)."""
    if not isinstance(value, bool):
        raise InvalidCollaboration(attribute.name, f"must be true or false, got {value!r}")


@attrs.frozen(kw_only=True)
class ModeConfig:
    """Options every mode accepts. Subclass it (``@attrs.frozen(kw_only=True)``) for a mode's own.

    Attributes:
        early_stop: stop as soon as the outcome can no longer change (pruning the rest).
        rounds: rounds for iterative modes (debate, reflect); None = the mode's default.
        answer: constrain answers to fixed choices or a regex.
        max_tokens: default completion budget per agent turn.
        temperature: default sampling temperature (agents may override).
        timeout: seconds before the whole collaboration is cancelled (None = no limit).
        top_p: default nucleus sampling mass (agents may override).
        seed: makes the agents' sampling reproducible: the k-th agent the mode starts
            samples with ``seed + k`` (each agent its own stream; a rerun repeats them).
        stop: up to 4 strings that end every turn of every agent (the request's ``stop``).
    """

    early_stop: bool = attrs.field(default=True, validator=boolean)
    rounds: int | None = attrs.field(default=None, validator=int_in(1, 16))
    answer: AnswerSpec | None = attrs.field(default=None, converter=_answer)
    max_tokens: int = attrs.field(default=256, validator=[not_none, int_in(1, MAX_AGENT_TOKENS)])
    temperature: float = 0.7
    timeout: float | None = None
    top_p: float | None = None
    seed: int | None = attrs.field(default=None, validator=int_in(-(2**63), 2**63 - 1))
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stops)

    def __attrs_post_init__(self) -> None:
        reason = agent_field_rules()["temperature"].problem(self.temperature)
        if self.temperature is None:
            reason = "must be a number"

        if reason is not None:  # the same bounds as an agent's own temperature
            raise InvalidCollaboration("temperature", reason)
        reason = agent_field_rules()["top_p"].problem(self.top_p)
        if reason is not None:  # the same bounds as an agent's own top_p
            raise InvalidCollaboration("top_p", reason)
        if self.timeout is not None and not (
            isinstance(self.timeout, int | float) and self.timeout > 0
        ):
            raise InvalidCollaboration("timeout", "must be a positive number of seconds")


C = TypeVar("C", bound=ModeConfig)


def build_config(config_class: type[C], options: Mapping[str, Any]) -> C:
    """Build a mode's config from loose options, with errors that name the field."""
    fields = {f.name: f for f in attrs.fields(config_class)}
    unknown = sorted(k for k in options if k not in fields)
    if unknown:
        raise InvalidCollaboration(
            f"collaboration.{unknown[0]}",
            f"unknown option for this mode; known: {sorted(fields)}",
        )
    try:
        return config_class(**options)
    except InvalidCollaboration as exc:
        field = (
            exc.field if exc.field.startswith("collaboration.") else f"collaboration.{exc.field}"
        )
        raise InvalidCollaboration(field, exc.reason) from None
    except (TypeError, ValueError) as exc:
        raise InvalidCollaboration("collaboration", str(exc)) from None
