"""Prefill accounting that treats every system alike: what was recomputed after eviction.

Each engine request is recorded as (submitted, finished, prompt ids, output
ids, cached prompt tokens), from microagent's bridge or from vLLM's server
(``return_token_ids`` and ``prompt_tokens_details``). A prompt *could* have
been served from cache up to the longest prefix it shares with what requests
that finished before it was submitted had computed (their prompts and
outputs), in whole blocks and never its last token; whatever of that the
engine computed again was evicted in between. Requests running at the same
time are not counted against each other: a prefix two cold requests compute
in the same step is duplicated work, but not eviction (it shows in the
computed total).
The same function scores microagent and the client, so their ratio is fair:
neither system's own bookkeeping is trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from _collab_tasks import common_prefix

BLOCK = 128


@dataclass(frozen=True)
class RequestRecord:
    """One engine request as a system saw it."""

    submitted: float
    finished: float
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    cached: int


@dataclass(frozen=True)
class Prefill:
    """A run's prefill: prompt tokens, computed, could have been cached, recomputed."""

    prompt_tokens: int
    computed_tokens: int
    reusable_tokens: int
    recomputed_tokens: int


def prefill(records: Sequence[RequestRecord], block: int = BLOCK) -> Prefill:
    """Score a run's requests (see the module docstring); order of ``records`` is irrelevant."""
    ordered = sorted(records, key=lambda r: r.submitted)
    prompt_tokens = computed = reusable = recomputed = 0
    for i, r in enumerate(ordered):
        done = [e for e in ordered[:i] if e.finished <= r.submitted]
        seen: list[Sequence[int]] = [e.prompt for e in done]
        seen += [(*e.prompt, *e.output[:-1]) for e in done]
        shared = max((common_prefix(r.prompt, s) for s in seen), default=0)
        could = min(shared, len(r.prompt) - 1) // block * block if r.prompt else 0
        prompt_tokens += len(r.prompt)
        computed += len(r.prompt) - r.cached
        reusable += could
        recomputed += max(0, could - r.cached)
    return Prefill(prompt_tokens, computed, reusable, recomputed)
