"""Resume journals: work run again after an engine death continues what it had.

A request lost to an engine death is run again from its start (the server's
``run_retrying``). Its engine requests come back the same (the same prompts and
sampling) for as long as their outputs are the same, so a journal, active around
both runs (``with resume_journal():``, in that task and the tasks it starts, a
collaboration's actors included), records every engine request's output as it
streams. Inside the journal, a request equal to a recorded one (the same bridge,
prompt, adapter, sampling and cache salt, matched in order of arrival):

* that had finished is answered from its record, with no engine request;
* that had generated some tokens sends its prompt with them appended, for the rest
  of its ``max_tokens``; the caller sees the recorded tokens first, then the new
  ones, and the result is the one whole generation.

The KV died with the engine; the tokens did not, and prefilling them again costs a
fraction of decoding them again (CPU: ~300 prefill tokens/s against ~26 decoded
tokens/s per sequence). A constrained generation (choices, a regex, a schema) or
one with penalties that read its own output starts over: continuing it would not
sample from the same distribution. A retained request (``retain``) that continues
is retained whole by the engine as usual; one replayed from a finished record
holds nothing in the engine, so its owner's next turn is an ordinary miss.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import attrs

from ._types import FinishReason, TokenLogprob

if TYPE_CHECKING:
    from ._bridge import EngineRequest, EngineStep

_JOURNAL: ContextVar[ResumeJournal | None] = ContextVar("microagent_resume", default=None)


@attrs.define(eq=False)
class Recorded:
    """One engine request's output so far: its tokens, text pieces, logprobs and finish."""

    token_ids: list[int] = attrs.Factory(list)
    text: list[str] = attrs.Factory(list)
    logprobs: list[TokenLogprob] = attrs.Factory(list)
    finish: FinishReason | None = None
    cached: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish in ("stop", "length")

    def clear(self) -> None:
        self.token_ids.clear()
        self.text.clear()
        self.logprobs.clear()
        self.finish = None
        self.cached = None


@attrs.define(eq=False)
class ResumeJournal:
    """The engine requests of one unit of work (a server request) across its runs.

    Attributes:
        replayed: requests answered from a finished record (no engine request).
        resumed: requests that continued a partial record.
        tokens_kept: generated tokens not generated again (both kinds together).
    """

    replayed: int = 0
    resumed: int = 0
    tokens_kept: int = 0
    _records: dict[Hashable, list[Recorded]] = attrs.field(factory=dict, init=False)
    _claimed: set[int] = attrs.field(factory=set, init=False)

    def new_run(self) -> None:
        """A run begins: every record may be claimed again (by the run's equal request)."""
        self._claimed.clear()

    def claim(self, key: Hashable) -> tuple[Recorded, bool]:
        """The record of the next request with ``key`` in this run, and whether it existed."""
        records = self._records.setdefault(key, [])
        for rec in records:
            if id(rec) not in self._claimed:
                self._claimed.add(id(rec))
                return rec, True
        rec = Recorded()
        records.append(rec)
        self._claimed.add(id(rec))
        return rec, False


@contextmanager
def resume_journal(journal: ResumeJournal | None = None) -> Iterator[ResumeJournal]:
    """Record (and resume) every engine request started inside the block."""
    journal = ResumeJournal() if journal is None else journal
    token = _JOURNAL.set(journal)
    try:
        yield journal
    finally:
        _JOURNAL.reset(token)


def current_journal() -> ResumeJournal | None:
    """The journal of the enclosing ``resume_journal`` block (None outside one)."""
    return _JOURNAL.get()


def resumable(request: EngineRequest) -> bool:
    """Whether a partial output of ``request`` may be continued rather than redone."""
    s = request.sampling
    constrained = (
        s.choices is not None
        or s.regex is not None
        or s.json_schema is not None
        or s.json_object
        or s.tagged is not None
    )
    penalised = s.presence_penalty or s.frequency_penalty or s.repetition_penalty != 1.0
    return not constrained and not penalised


def request_key(bridge_id: int, request: EngineRequest) -> Hashable:
    """What makes two engine requests the same work."""
    sampling: Hashable = request.sampling
    try:
        hash(sampling)
    except TypeError:  # an unhashable constraint: keyed by its text
        sampling = repr(request.sampling)
    prompt = request.prompt
    return (bridge_id, prompt.token_ids, prompt.adapter, sampling, request.cache_salt)


async def replay(
    rec: Recorded, step: type[EngineStep], *, finish: bool
) -> AsyncIterator[EngineStep]:
    """The recorded output as one ``step`` (with its finish reason when ``finish``)."""
    if rec.token_ids or finish:
        yield step(
            tuple(rec.token_ids),
            "".join(rec.text),
            rec.finish if finish else None,
            rec.cached,
            tuple(rec.logprobs),
        )


async def recording(
    steps: AsyncIterator[EngineStep], rec: Recorded, prompt_len: int
) -> AsyncIterator[EngineStep]:
    """``steps``, each added to ``rec``; cached counts held to the caller's prompt."""
    async for step in steps:
        if step.num_cached_tokens is not None:
            step = attrs.evolve(step, num_cached_tokens=min(step.num_cached_tokens, prompt_len))
            if rec.cached is None:
                rec.cached = step.num_cached_tokens
        rec.token_ids.extend(step.token_ids)
        rec.text.append(step.text)
        rec.logprobs.extend(step.logprobs)
        if step.finish_reason is not None:
            rec.finish = step.finish_reason
        yield step


async def chained(*parts: AsyncIterator[EngineStep]) -> AsyncIterator[EngineStep]:
    """The steps of each part in turn (each closed when done or abandoned)."""
    for part in parts:
        try:
            async for step in part:
                yield step
        finally:
            aclose = getattr(part, "aclose", None)
            if aclose is not None:
                await aclose()
