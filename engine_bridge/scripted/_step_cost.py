"""A real engine's batched step, as a cost model: what the ScriptedEngine simulates load with.

A real engine runs one *step* at a time over everything in flight: each running
request decodes one token, and prompts are prefilled in chunks that share the
step's token budget (vLLM's chunked prefill, ``max_num_batched_tokens``). A step
lasts ``base + prefill_token × prefill tokens + prefill_pair × (prefill token,
earlier token) pairs + decode_seq × decoding requests + decode_context × their
context tokens`` seconds: the weights' pass, attention over the context (a
prompt's prefill grows with its square, a decode with its length), so decoding
slows as the batch and its contexts grow and a long prefill delays every decode
beside it. Per-request sleeps (the ScriptedEngine's default) model none
of that: their compute is unbounded and parallel, which makes recomputing an
evicted context look free under load.

``StepClock`` runs those steps in anyio time. It has no task of its own: the
first request to post work for the next step leads it (waits for the running
step, lets every other task post, then sleeps the step's cost), so it works
inside any caller's task group and under ``run_virtual`` costs no wall time.
"""

from __future__ import annotations

import math

import anyio
import attrs


@attrs.frozen
class StepCost:
    """What one engine step costs, in seconds, by what it computes.

    Attributes:
        base: a step's fixed cost (the weights' pass, scheduling, sampling).
        prefill_token: seconds per prompt token the step computes.
        decode_seq: seconds per request that decodes a token in the step.
        prefill_pair: seconds per (prompt token computed, token before it) pair:
            prefill attention, quadratic in a prompt's length.
        decode_context: seconds per context token of each decoding request (its
            attention over, and read of, the KV so far).
        max_batched_tokens: a step's token budget (one per decoding request,
            the rest for prefill chunks), as vLLM's ``max_num_batched_tokens``.
    """

    base: float
    prefill_token: float
    decode_seq: float
    prefill_pair: float = 0.0
    decode_context: float = 0.0
    max_batched_tokens: int = 2048

    def __attrs_post_init__(self) -> None:
        costs = (
            self.base,
            self.prefill_token,
            self.decode_seq,
            self.prefill_pair,
            self.decode_context,
        )
        if not all(math.isfinite(c) and c >= 0 for c in costs):
            raise ValueError(f"step costs must be finite and >= 0 seconds, got {costs}")
        if self.max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")

    def seconds(self, prefill: int, decode: int, *, pairs: float = 0.0, context: int = 0) -> float:
        """How long a step takes that prefills ``prefill`` tokens (``pairs`` attention pairs)
        and decodes ``decode`` requests (``context`` tokens of context among them)."""
        return (
            self.base
            + self.prefill_token * prefill
            + self.prefill_pair * pairs
            + self.decode_seq * decode
            + self.decode_context * context
        )


def prefill_pairs(start: int, tokens: int) -> float:
    """Attention pairs of prefilling ``tokens`` after ``start`` tokens of context
    (each token attends to those before it and itself)."""
    return tokens * start + tokens * (tokens + 1) / 2


@attrs.define(eq=False)
class _Post:
    """One request's work for a step: ``prefill`` tokens wanted after ``start`` tokens
    (0: one decode over ``start`` tokens of context); ``granted`` once the step closes."""

    prefill: int
    start: int
    granted: int = 0
    withdrawn: bool = False


@attrs.define(eq=False)
class _Step:
    """The work posted for one step."""

    posts: list[_Post] = attrs.Factory(list)
    closed: bool = False
    done: anyio.Event = attrs.Factory(anyio.Event)

    def post(self, prefill: int, start: int) -> _Post:
        work = _Post(prefill, start)
        self.posts.append(work)
        return work

    def withdraw(self, work: _Post) -> None:
        if not self.closed:
            work.withdrawn = True

    def close(self, cost: StepCost) -> float:
        """Grant decodes first (a token each), then prefill chunks in posting order; the
        step's seconds."""
        self.closed = True
        live = [w for w in self.posts if not w.withdrawn]
        decodes = [w for w in live if w.prefill == 0]
        left = max(0, cost.max_batched_tokens - len(decodes))
        prefill, pairs = 0, 0.0
        for work in live:
            if work.prefill <= 0:
                continue
            work.granted = min(work.prefill, left)
            left -= work.granted
            prefill += work.granted
            pairs += prefill_pairs(work.start, work.granted)
        context = sum(w.start for w in decodes)
        return cost.seconds(prefill, len(decodes), pairs=pairs, context=context)


@attrs.define(eq=False)
class StepClock:
    """Runs engine steps back to back under ``cost``; requests join the next one with their work.

    Attributes:
        cost: what a step costs.
        steps: steps run so far.
        busy: seconds spent in steps so far (the engine's busy time).
    """

    cost: StepCost
    steps: int = 0
    busy: float = 0.0
    _collecting: _Step | None = attrs.field(default=None, init=False)
    _running: _Step | None = attrs.field(default=None, init=False)

    async def prefill(self, tokens: int, start: int = 0) -> None:
        """Compute ``tokens`` prompt tokens after ``start`` cached ones, a chunk per step."""
        done = 0
        while done < tokens:
            done += await self._join(tokens - done, start + done)

    async def decode(self, context: int = 0) -> None:
        """Decode one token over ``context`` tokens: one slot in the next step."""
        await self._join(0, context)

    async def _join(self, prefill: int, start: int) -> int:
        step = self._collecting
        if step is not None:
            work = step.post(prefill, start)
            try:
                await step.done.wait()
            except BaseException:
                step.withdraw(work)  # aborted before the step closed: it computes nothing
                raise
            return work.granted
        step = self._collecting = _Step()
        work = step.post(prefill, start)
        # The leader finishes its step even when its own request is aborted meanwhile:
        # the others' work is in it, and a step takes bounded time.
        with anyio.CancelScope(shield=True):
            running = self._running
            if running is not None:
                await running.done.wait()
            await anyio.wait_all_tasks_blocked()  # every request with work in flight has posted
            self._collecting = None
            self._running = step
            seconds = step.close(self.cost)
            try:
                await anyio.sleep(seconds)
            finally:
                self.steps += 1
                self.busy += seconds
                self._running = None
                step.done.set()
        return work.granted
