"""Data passed to and from an engine bridge: sampling, deltas, results, statistics."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from ._handle import KVHandle

FinishReason = Literal["stop", "length", "abort", "error"]


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and isinstance(value, int | float) and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _strings(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _stop_strings(values: Iterable[str] | None) -> tuple[str, ...]:
    return () if values is None else tuple(values)


#: The most alternatives per token ``Sampling.logprobs`` may ask for (OpenAI's bound).
MAX_TOP_LOGPROBS = 20


def _json_schema_text(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    try:
        schema = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"{attribute.name} must be JSON text: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{attribute.name} must be a JSON object (a JSON schema)")


@attrs.frozen
class TaggedJson:
    """Free text in which every ``begin`` … ``end`` section holds JSON valid against ``schema``.

    The constraint starts when the model writes ``begin`` (vLLM's structural
    tags): until then the model writes what it likes. Tool calls in ``auto``
    mode are such sections (``<tool_call>{…}</tool_call>``).
    """

    begin: str = attrs.field(validator=attrs.validators.min_len(1))
    schema: str = attrs.field(validator=_json_schema_text)
    end: str = attrs.field(validator=attrs.validators.min_len(1))


@attrs.frozen
class TokenLogprob:
    """The log probability of one sampled token, and the most likely tokens at its position.

    ``top`` holds up to ``Sampling.logprobs`` ``(token id, logprob)`` pairs, most
    likely first; the sampled token is among them only when it was that likely.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen
class Sampling:
    """How to sample one generation (a subset of vLLM's SamplingParams that actors need).

    At most one constraint, applied with the engine's structured outputs:
    ``choices`` (one of these texts), ``regex``, ``json_schema`` (JSON text of a
    schema the output satisfies), ``json_object`` (any JSON object), or
    ``tagged`` (free text whose tagged sections are constrained JSON).
    ``logprobs`` asks for each sampled token's log probability and that many
    alternatives (0 to ``MAX_TOP_LOGPROBS``).
    ``min_p`` and the three penalties are vLLM's (OpenAI's ranges; the ScriptedEngine
    ignores them, as it ignores ``top_p`` and ``top_k``).
    ``seed`` makes a sampled request reproducible (on vLLM's CPU backend its prefill
    must fit one step: ``VLLMBridge`` refuses a longer seeded prompt, see ``cpu_seed``).
    """

    max_tokens: int = attrs.field(default=256, validator=_non_negative)
    temperature: float = attrs.field(default=0.0, validator=_non_negative)
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stop_strings)
    choices: tuple[str, ...] | None = attrs.field(default=None, converter=_strings)
    regex: str | None = None
    json_schema: str | None = attrs.field(default=None, validator=_json_schema_text)
    json_object: bool = False
    tagged: TaggedJson | None = None
    logprobs: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        given = [name for name in self.constraint_names if getattr(self, name) not in (None, False)]
        if len(given) > 1:
            raise ValueError(f"give one output constraint, not {' and '.join(given)}")
        if self.choices is not None and not self.choices:
            raise ValueError("choices must not be empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {self.logprobs}")

    #: The fields that constrain the output; at most one is set.
    constraint_names = ("choices", "regex", "json_schema", "json_object", "tagged")

    @property
    def constrained(self) -> bool:
        """Whether the engine's structured outputs shape this generation."""
        return any(getattr(self, name) not in (None, False) for name in self.constraint_names)


@attrs.frozen
class TokenDelta:
    """New tokens of a running generation (engine ``output_kind=DELTA``)."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    #: one entry per token of ``token_ids`` when the sampling asked for logprobs
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen
class Timings:
    """Wall-clock marks of one request (seconds since the bridge's clock origin)."""

    submitted: float
    first_token: float | None
    finished: float

    @property
    def queue_and_prefill(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.submitted

    @property
    def decode(self) -> float | None:
        return None if self.first_token is None else self.finished - self.first_token

    @property
    def total(self) -> float:
        return self.finished - self.submitted


@attrs.frozen
class GenerationResult:
    """The outcome of one engine request.

    ``handle`` is prompt + output tokens: a valid prefix for the next role.
    ``cache_miss`` is True when part of the prompt that the bridge knew to be
    resident (an earlier handle of this engine epoch, or an old-epoch handle)
    was not served from the prefix cache.
    """

    request_id: str
    prompt: KVHandle
    handle: KVHandle
    output_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cache_miss: bool
    expected_cached_tokens: int
    timings: Timings
    adapter: str | None = None
    priority: int = 0
    #: ``text`` as message content: no end-of-turn marker (the engine's chat format knows them).
    content: str = attrs.field(
        default=attrs.Factory(lambda self: self.text, takes_self=True), kw_only=True
    )
    #: per output token, when the sampling asked for logprobs (else ``None``)
    logprobs: tuple[TokenLogprob, ...] | None = attrs.field(default=None, kw_only=True)

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens the engine actually computed (prompt - cached)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def output(self) -> KVHandle:
        """The output segment alone, as a handle (what gets spliced into other prompts)."""
        return self.handle.segment(self.prompt)


@attrs.frozen
class EngineStats:
    """A snapshot of one engine's accounting.

    Scheduler-side numbers come from a stat logger attached to that engine
    (correct with several engines in one process and across restarts); the
    request/token counters are kept by the bridge (aborts included).
    """

    model: str
    epoch: int
    restarts: int
    # scheduler side (what the engine itself reports)
    scheduler_running: int
    scheduler_waiting: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    kv_cache_usage: float
    kv_cache_capacity_tokens: int
    block_size: int
    # bridge side
    requests_started: int
    requests_finished: int
    requests_aborted: int
    requests_failed: int
    requests_live: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cache_misses: int
    #: requests the scheduler preempted (and resumed): recompute churn
    preemptions: int = 0
    #: prompt tokens recomputed because blocks expected resident were evicted
    recomputed_tokens: int = 0
    #: cached prompt tokens served from a retained handle's blocks
    retained_hit_tokens: int = 0

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens
