"""From request parameters to sampling: each one honoured, or refused with a 400 naming it.

One place decides what happens to every parameter of the OpenAI request:
``check_parameters`` refuses what is not supported (``REFUSED_PARAMETERS`` and
anything undeclared), ``check_sampling`` checks the bounds of the ones honoured,
``sampling_fields`` (with ``max_tokens_of`` and ``stops_of``) maps them onto ``Sampling``.
"""

from __future__ import annotations

import json
from typing import Any

from ..collab import AgentSpec, FieldRule
from ..engine_bridge import MAX_TOP_LOGPROBS
from ._errors import bad_request
from ._openapi import MAX_METADATA_PAIRS, PLAIN_ONLY
from ._schemas import REFUSED_PARAMETERS, ChatCompletionRequest
from ._tools import check_json_schema

#: The sampling bounds a request shares with an agent (``temperature``, ``top_p``).
_AGENT_RULES = AgentSpec.field_rules()


def _check_rule(value: float | None, param: str, rule: FieldRule) -> None:
    """A 400 naming ``param`` when ``value`` breaks the agent field ``rule`` it shares."""
    reason = rule.problem(value)
    if reason is not None:
        raise bad_request(f"{param} {reason}", param)


def max_tokens_of(body: ChatCompletionRequest) -> int | None:
    """The completion budget asked for (``max_completion_tokens`` first), checked."""
    for param in ("max_tokens", "max_completion_tokens"):  # both checked, as documented
        given = getattr(body, param)
        if given is not None and given < 1:
            raise bad_request(f"{param} must be >= 1, got {given}", param)
    if body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens


def stops_of(body: ChatCompletionRequest) -> tuple[str, ...]:
    """The stop strings asked for, checked (up to 4, none empty)."""
    stop = body.stop
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 4 or any(not s for s in stops):
        raise bad_request("stop must be up to 4 non-empty strings", "stop")
    return stops


def check_sampling(body: ChatCompletionRequest, max_n: int) -> None:
    """A 400 naming the first sampling parameter out of bounds."""
    _check_rule(body.temperature, "temperature", _AGENT_RULES["temperature"])
    _check_rule(body.top_p, "top_p", _AGENT_RULES["top_p"])
    if not 1 <= body.n <= max_n:
        raise bad_request(f"n must be in 1..{max_n}, got {body.n}", "n")
    if body.seed is not None and not -(2**63) <= body.seed < 2**63:
        raise bad_request("seed must fit in 64 bits", "seed")
    max_tokens_of(body)
    stops_of(body)


def check_parameters(body: ChatCompletionRequest, *, collaboration: bool) -> None:
    """A 400 naming the first parameter this server does not honour as given."""
    for name, value in (body.model_extra or {}).items():
        if value is None:
            continue  # an explicit null is "not given", as in OpenAI's SDKs
        reason = REFUSED_PARAMETERS.get(name)
        if reason is None:
            raise bad_request(
                f"unrecognized request argument supplied: {name}", name, "unknown_parameter"
            )
        raise bad_request(f"{name}: {reason}", name, "unsupported_parameter")
    if body.store:
        raise bad_request("store: completions are not stored by this server", "store")
    if body.service_tier not in (None, "auto", "default"):
        raise bad_request('service_tier must be "auto" or "default"', "service_tier")
    if body.metadata is not None and len(body.metadata) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata takes at most {MAX_METADATA_PAIRS} pairs", "metadata")
    if body.top_logprobs is not None:
        if not body.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(
                f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {body.top_logprobs}",
                "top_logprobs",
            )
    if collaboration:
        for name in PLAIN_ONLY:
            value = getattr(body, name)
            if value is None or value is False or (name == "tools" and value == []):
                continue  # not given (an empty tools list offers none)
            raise bad_request(
                f"{name} applies to plain completions; with agents, set it on the agents "
                "or the collaboration (collaboration.answer constrains the answer)",
                name,
            )


def sampling_fields(body: ChatCompletionRequest) -> dict[str, Any]:
    """``Sampling`` keyword arguments for the plain-completion parameters that shape output."""
    fields: dict[str, Any] = {}
    for name in ("frequency_penalty", "presence_penalty", "min_p", "repetition_penalty"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = float(value)
    if body.top_k is not None:
        if body.top_k < 1 and body.top_k != -1:
            raise bad_request(f"top_k must be >= 1 (or -1 for all), got {body.top_k}", "top_k")
        if body.top_k > 0:
            fields["top_k"] = body.top_k
    if body.logprobs:
        fields["logprobs"] = body.top_logprobs or 0
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise bad_request(
                'response_format.json_schema needs type "json_schema"', "response_format.type"
            )
        return fields
    if fmt.type == "json_object":
        fields["json_object"] = True
        return fields
    spec = fmt.json_schema
    if spec is None:
        raise bad_request(
            'response_format.json_schema is required with type "json_schema"',
            "response_format.json_schema",
        )
    schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    check_json_schema(schema, "response_format.json_schema.schema")
    fields["json_schema"] = json.dumps(schema)
    return fields
