"""EngineBridge: the one interface actors use to generate on an engine.

The base class owns everything that is the same for every engine — request
ids, live-request tracking, abort on cancellation, token accounting, cache-miss
detection against handles known to be resident — and leaves three hooks to the
engine: ``_engine_steps`` (stream one request), ``_abort_engine`` and
``_scheduler_snapshot``. ``VLLMBridge`` and ``ScriptedEngine`` implement them.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self

import anyio
import attrs

from . import _resume
from ._errors import EngineDied, RequestRefused, UnknownAdapter
from ._handle import AdapterRef, KVHandle
from ._programs import ProgramOrder
from ._retained_index import RetainedIndex
from ._retention import Retain, RetentionStats
from ._salt import current_cache_salt
from ._tier_stats import TierStats
from ._tool_formats import HERMES, ToolFormat
from ._types import (
    EngineStats,
    FinishReason,
    GenerationResult,
    Sampling,
    Timings,
    TokenDelta,
    TokenLogprob,
)

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from ._chat import ChatComposer

_RESIDENT_LIMIT = 8192


@attrs.frozen
class EngineRequest:
    """What a bridge hands its engine: one prompt (its adapter included), one sampling."""

    request_id: str
    prompt: KVHandle
    sampling: Sampling
    priority: int = 0
    #: keep the request's blocks resident after it finishes (``None``: ordinary LRU cache)
    retain: Retain | None = None
    #: the program it belongs to (a collaboration's id): scheduling and accounting
    group: str | None = None
    #: the tenant's cache salt (``cache_salt``): blocks are shared only within one salt
    cache_salt: str | None = None


@attrs.frozen
class EngineStep:
    """One delta from an engine: new tokens, and the finish reason on the last step.

    ``num_cached_tokens`` is reported by the engine with the first output.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None
    #: one per token of ``token_ids`` when the sampling asked for logprobs
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen
class SchedulerSnapshot:
    """What the engine's scheduler last reported (through a per-engine stat logger)."""

    running: int = 0
    waiting: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_cache_usage: float = 0.0
    kv_cache_capacity_tokens: int = 0
    preemptions: int = 0


@attrs.define
class _Counters:
    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_misses: int = 0
    recomputed_tokens: int = 0
    retained_hit_tokens: int = 0


class Generation:
    """One streaming engine request, used as ``async with bridge.stream(...) as gen``.

    Iterate it for ``TokenDelta`` items; ``result`` is set when it finishes.
    Leaving the block early — a ``break``, an exception, a cancelled task —
    aborts the engine request, so no request outlives its consumer.
    """

    def __init__(self, bridge: EngineBridge, request: EngineRequest) -> None:
        self._bridge = bridge
        self.request = request
        self.result: GenerationResult | None = None
        self._steps: AsyncIterator[EngineStep] | None = None
        self._output: list[int] = []
        self._text: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        self._cached: int | None = None
        self._submitted = 0.0
        self._first_token: float | None = None
        self._entered = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def output_ids(self) -> tuple[int, ...]:
        """Tokens generated so far."""
        return tuple(self._output)

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("a Generation can be entered once")
        self._entered = True
        self._bridge._register(self)
        self._submitted = self._bridge.clock()
        self._steps = self._journaled_steps()
        return self

    def _journaled_steps(self) -> AsyncIterator[EngineStep]:
        """The engine's steps; inside a resume journal, recorded, or replayed and
        continued from an earlier run's record (``_resume``)."""
        bridge, request = self._bridge, self.request
        journal = _resume.current_journal()
        if journal is None or bridge.remote:  # a remote endpoint gets text, not token ids
            return bridge._engine_steps(request)
        rec, seen = journal.claim(_resume.request_key(id(bridge), request))
        n = len(request.prompt)
        if seen and rec.finished:
            journal.replayed += 1
            journal.tokens_kept += len(rec.token_ids)
            return _resume.replay(rec, EngineStep, finish=True)
        if not seen or not rec.token_ids or not _resume.resumable(request):
            rec.clear()
            return _resume.recording(bridge._engine_steps(request), rec, n)
        journal.resumed += 1
        journal.tokens_kept += len(rec.token_ids)
        prompt = request.prompt
        rest = attrs.evolve(
            request,
            prompt=attrs.evolve(prompt, token_ids=prompt.token_ids + tuple(rec.token_ids)),
            sampling=attrs.evolve(
                request.sampling, max_tokens=request.sampling.max_tokens - len(rec.token_ids)
            ),
        )
        return _resume.chained(
            _resume.replay(rec, EngineStep, finish=False),
            _resume.recording(bridge._engine_steps(rest), rec, n),
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            try:
                if self.result is None:
                    if exc is not None and isinstance(exc, EngineDied):
                        self._finish("error")
                    else:
                        await self._bridge._abort_engine(self.request_id)
                        self._finish("abort")
            finally:
                steps, self._steps = self._steps, None
                if steps is not None and hasattr(steps, "aclose"):
                    with contextlib.suppress(Exception):  # engine generator teardown
                        await steps.aclose()
                self._bridge._unregister(self)

    def __aiter__(self) -> AsyncIterator[TokenDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenDelta]:
        if self._steps is None:
            raise RuntimeError("iterate a Generation inside `async with bridge.stream(...)`")
        if self.result is not None:
            return
        try:
            async for step in self._steps:
                if self._cached is None and step.num_cached_tokens is not None:
                    self._cached = step.num_cached_tokens
                if step.token_ids:
                    if self._first_token is None:
                        self._first_token = self._bridge.clock()
                    self._output.extend(step.token_ids)
                    self._text.append(step.text)
                    self._logprobs.extend(step.logprobs)
                    yield TokenDelta(
                        self.request_id, tuple(step.token_ids), step.text, step.logprobs
                    )
                if step.finish_reason is not None:
                    self._finish(step.finish_reason)
                    return
        except EngineDied:
            # counted as failed wherever the caller catches it (inside or outside the block)
            self._finish("error")
            raise
        if self.result is None:  # the engine stream ended without a finish reason
            self._finish("abort")

    async def wait(self) -> GenerationResult:
        """Consume the rest of the stream and return the result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    def _finish(self, reason: FinishReason) -> None:
        if self.result is not None:
            return
        self.result = self._bridge._account(self, reason)


class EngineBridge(abc.ABC):
    """One served model: generation, handles, adapters, accounting.

    Use it as an async context manager (``async with VLLMBridge(...) as bridge``).
    Every method that talks to the engine is safe to call from many tasks at
    once: requests are multiplexed on the one engine.
    """

    #: Token-level chat composition with this model's template (set by each engine).
    chat: ChatComposer
    #: whether the model runs behind a network endpoint (text crosses, no KV is shared)
    remote = False
    #: how this model writes tool calls (``serve --tool-call-parser``); Hermes by default
    tool_format: ToolFormat = HERMES

    def __init__(self, model: str, *, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self.epoch = 0
        self.restarts = 0
        #: engines of this bridge that died (a death whose restart failed counts too)
        self.deaths = 0
        self._dead_epoch = -1
        self._ids = itertools.count()
        self._id_prefix = f"{model}-{id(self):x}"
        self._live: dict[str, Generation] = {}
        self._counters = _Counters()
        # retention key -> (cache salt, the handle whose blocks were retained), this epoch
        self._retained = RetainedIndex(block_size)
        # resident handle key (a hash, not the token ids: the tokens of 8 192 long
        # prompts would stay alive here) -> how many of its tokens the engine computed
        self._resident: OrderedDict[int, int] = OrderedDict()
        self._adapters: dict[str, AdapterRef] = {}
        # the programs of requests that name no priority (their order and observed gaps)
        self._programs = ProgramOrder()
        self._clock_origin = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()

    @abc.abstractmethod
    async def open(self) -> None:
        """Start the engine (idempotent)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Abort live requests and stop the engine (idempotent)."""

    def clock(self) -> float:
        """Seconds since the bridge was made (the time base of ``Timings``)."""
        return time.monotonic() - self._clock_origin

    # -- tokens and handles ----------------------------------------------------------
    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""

    @abc.abstractmethod
    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens kept)."""

    def tokenizer_fingerprint(self) -> str:
        """Identity of this bridge's tokenizer: bridges with equal fingerprints share token ids.

        Crossing models re-tokenizes text unless the fingerprints match (engines
        override this with a digest of their vocabulary).
        """
        return f"{type(self).__name__}:{self.model}"

    async def atokenize(self, text: str) -> list[int]:
        """``tokenize`` off the event loop, for long texts."""
        if len(text) < 2048:
            return self.tokenize(text)
        return await anyio.to_thread.run_sync(self.tokenize, text)

    def handle(
        self, token_ids: Iterable[int], *, adapter: str | AdapterRef | None = None
    ) -> KVHandle:
        """A handle of this model and epoch over ``token_ids`` (decodes lazily)."""
        return KVHandle(
            tuple(token_ids),
            model=self.model,
            adapter=self.resolve_adapter(adapter),
            epoch=self.epoch,
            decoder=self.detokenize,
        )

    # -- adapters --------------------------------------------------------------------
    def register_adapter(self, name: str, path: str) -> AdapterRef:
        """Make a LoRA adapter usable by name; re-registering the same path is a no-op."""
        ref = AdapterRef(name, str(path))
        old = self._adapters.get(name)
        if old is not None and old != ref:
            raise ValueError(f"adapter {name!r} is already registered with path {old.path!r}")
        self._adapters[name] = ref
        return ref

    @property
    def adapters(self) -> dict[str, AdapterRef]:
        return dict(self._adapters)

    def resolve_adapter(self, adapter: str | AdapterRef | None) -> AdapterRef | None:
        if adapter is None or isinstance(adapter, AdapterRef):
            if isinstance(adapter, AdapterRef) and adapter.name not in self._adapters:
                raise UnknownAdapter(adapter.name, tuple(self._adapters))
            return adapter
        try:
            return self._adapters[adapter]
        except KeyError:
            raise UnknownAdapter(adapter, tuple(self._adapters)) from None

    # -- generation ------------------------------------------------------------------
    def check_request(self, prompt: KVHandle, sampling: Sampling) -> None:
        """Refuse requests the engine cannot serve safely (override to add rules).

        Raises:
            RequestRefused: naming the field at fault.
        """
        if prompt.model != self.model:
            raise RequestRefused(
                "prompt", f"handle of model {prompt.model!r} sent to {self.model!r}"
            )
        if not prompt.token_ids:
            raise RequestRefused("prompt", "empty prompt")

    def stream(
        self,
        prompt: KVHandle,
        sampling: Sampling,
        *,
        adapter: str | AdapterRef | None = None,
        priority: int | None = None,
        request_id: str | None = None,
        retain: Retain | None = None,
        group: str | None = None,
    ) -> Generation:
        """Start one generation; use as ``async with bridge.stream(...) as gen``.

        Args:
            prompt: the prompt handle (its adapter is used unless ``adapter`` is given).
            sampling: how to sample.
            adapter: run under this registered LoRA adapter.
            priority: engine priority; lower runs first (vLLM convention). None: the
                bridge schedules the request as part of a program, first come first
                served (a program is a retention key: see ``ProgramOrder``), and a
                ``retain`` without ``next_use`` expects the gap its program's turns showed.
            request_id: an id of your own (unique among live requests).
            retain: keep the result's KV blocks resident under ``retain.key`` until
                ``release``d (on a bridge without retention: ordinary LRU cache).
            group: the program (collaboration) the request belongs to.
        """
        if adapter is not None:
            prompt = prompt.with_adapter(self.resolve_adapter(adapter))
        elif prompt.adapter is not None:
            self.resolve_adapter(prompt.adapter)
        self.check_request(prompt, sampling)
        rid = request_id or f"{self._id_prefix}-{next(self._ids)}"
        if rid in self._live:
            raise RequestRefused("request_id", f"{rid!r} is already running")
        if retain is not None and not self.retention_enabled:
            retain = None  # documented: a hint this bridge serves from its LRU cache
        salt = current_cache_salt()
        if priority is None:
            priority, retain = self._program_defaults(prompt, retain, salt)
        request = EngineRequest(rid, prompt, sampling, priority, retain, group, salt)
        return Generation(self, request)

    def _program_defaults(
        self, prompt: KVHandle, retain: Retain | None, salt: str | None
    ) -> tuple[int, Retain | None]:
        """The priority of a request that names none (its program's place), and its
        retention with the next use its program's gaps predict when it names none."""
        key = None if retain is None else retain.key
        parent = None if key in self._programs else self._extended_key(prompt, salt)
        priority, next_use = self._programs.plan(key, parent, _now())
        if retain is not None and retain.next_use is None:
            retain = attrs.evolve(retain, next_use=next_use)
        return priority, retain

    def _extended_key(self, prompt: KVHandle, salt: str | None) -> str | None:
        """The key of the longest retained handle whose whole blocks ``prompt`` extends."""
        return self._retained.extended_key(prompt, salt)

    async def generate(
        self,
        prompt: KVHandle,
        sampling: Sampling,
        *,
        adapter: str | AdapterRef | None = None,
        priority: int | None = None,
        request_id: str | None = None,
        on_delta: Callable[[TokenDelta], Awaitable[None] | None] | None = None,
        retain: Retain | None = None,
        group: str | None = None,
    ) -> GenerationResult:
        """Run one generation to the end and return its result (deltas to ``on_delta``)."""
        async with self.stream(
            prompt,
            sampling,
            adapter=adapter,
            priority=priority,
            request_id=request_id,
            retain=retain,
            group=group,
        ) as gen:
            async for delta in gen:
                if on_delta is not None:
                    maybe = on_delta(delta)
                    if maybe is not None:
                        await maybe
            assert gen.result is not None
            return gen.result

    async def warm(
        self, handle: KVHandle, *, priority: int | None = None, group: str | None = None
    ) -> GenerationResult:
        """Prefill ``handle`` into the prefix cache (a one-token generation).

        Use it for forks that start at different times, or after a miss: forks
        that start together already share one prefill inside vLLM. ``group`` is
        the program it belongs to, as in ``stream``.
        """
        return await self.generate(handle, Sampling(max_tokens=1), priority=priority, group=group)

    async def abort(self, request_id: str) -> bool:
        """Abort a live request; returns whether it was live. Its consumer sees ``abort``."""
        gen = self._live.get(request_id)
        await self._abort_engine(request_id)
        if gen is None:
            return False
        gen._finish("abort")
        return True

    def live_requests(self) -> frozenset[str]:
        """Ids of the requests this bridge started that have not finished."""
        return frozenset(self._live)

    # -- retention -------------------------------------------------------------------------
    @property
    def retention_enabled(self) -> bool:
        """Whether ``retain=`` keeps blocks resident here (see ``Retain``)."""
        return False

    async def release(self, *keys: str, prefix: str | None = None) -> int:
        """End retentions by key (and every key starting with ``prefix``); returns how many.

        The released blocks become ordinary LRU cache: still hits until evicted.
        """
        for key in [
            *keys,
            *(k for k in self._retained if prefix is not None and k.startswith(prefix)),
        ]:
            self._retained.pop(key)
        self._programs.forget(keys, prefix=prefix)
        if not self.retention_enabled or (not keys and prefix is None):
            return 0
        return await self._release_engine(list(keys), prefix)

    async def retention_stats(self) -> RetentionStats:
        """The engine's retention accounting (entries, blocks held, releases by cause)."""
        if not self.retention_enabled:
            return RetentionStats()
        return await self._retention_stats()

    async def tier_stats(self) -> TierStats:
        """What the KV tiers below the engine's cache hold and have moved
        (``enabled=False``: the engine runs none)."""
        return TierStats()

    def _on_retained(self) -> None:  # noqa: B027 - a hook, empty unless an engine needs it
        """A request's blocks were retained (an engine may schedule their expiry)."""

    async def _release_engine(self, keys: list[str], prefix: str | None) -> int:
        """End retentions in the engine (engines with retention override it)."""
        return 0

    async def _retention_stats(self) -> RetentionStats:
        """The engine's retention statistics (engines with retention override it)."""
        return RetentionStats()

    def prometheus_collector(self) -> Collector | None:
        """The engine's own Prometheus series (vLLM's ``vllm:*``), None for engines without.

        ``/metrics`` exposes them next to the server's own, so a vLLM dashboard
        works unchanged; each engine keeps its own (several models, restarts).
        """
        return None

    def stats(self) -> EngineStats:
        snap = self._scheduler_snapshot()
        c = self._counters
        return EngineStats(
            model=self.model,
            epoch=self.epoch,
            restarts=self.restarts,
            scheduler_running=snap.running,
            scheduler_waiting=snap.waiting,
            prefix_cache_queries=snap.prefix_cache_queries,
            prefix_cache_hits=snap.prefix_cache_hits,
            kv_cache_usage=snap.kv_cache_usage,
            kv_cache_capacity_tokens=snap.kv_cache_capacity_tokens,
            block_size=self.block_size,
            requests_started=c.started,
            requests_finished=c.finished,
            requests_aborted=c.aborted,
            requests_failed=c.failed,
            requests_live=len(self._live),
            prompt_tokens=c.prompt_tokens,
            cached_tokens=c.cached_tokens,
            completion_tokens=c.completion_tokens,
            cache_misses=c.cache_misses,
            preemptions=snap.preemptions,
            recomputed_tokens=c.recomputed_tokens,
            retained_hit_tokens=c.retained_hit_tokens,
        )

    async def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is live here *and* the scheduler reports none running."""
        with anyio.move_on_after(timeout):
            # the scheduler's state arrives from the engine process (stat logger):
            # there is no event to wait on, so poll it
            while self._live or self._scheduler_snapshot().running:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            return True
        return False

    def expected_cached_tokens(self, prompt: KVHandle, salt: str | None = None) -> tuple[int, bool]:
        """How many prompt tokens should come from cache, and whether a miss is certain.

        A prompt extending a handle this engine epoch produced (or warmed) should
        hit every full block of that handle (the last prompt token is always
        recomputed). A handle of an older epoch was resident before a restart:
        its first use recomputes and counts as a miss; once it has been used (or
        warmed) again, it is resident in the new epoch and hits like any other.
        """
        block = self.block_size
        limit = (len(prompt) - 1) // block * block
        for node in prompt.lineage():
            if node.adapter != prompt.adapter:  # other adapters never share blocks
                continue
            # the same tokens, known resident in *this* epoch (an old-epoch handle
            # that was re-warmed, or any handle of this epoch)
            key = self._key(node.with_epoch(self.epoch), salt)
            computed = self._resident.get(key)
            if computed is not None:
                self._resident.move_to_end(key)
                return min(computed // block * block, limit), False
            if node.epoch != self.epoch and len(node) >= block:
                # resident before a restart, not since: this use recomputes it
                return min(len(node) // block * block, limit), True
        return 0, False

    def retained_prefix(self, prompt: KVHandle, salt: str | None = None) -> int:
        """Tokens of ``prompt`` (whole blocks, last token excluded) covered by a retained handle."""
        return self._retained.covered(prompt, salt)

    def _engine_died(self) -> None:
        """The engine of this epoch died: counted once, however many requests saw it."""
        if self._dead_epoch != self.epoch:
            self._dead_epoch = self.epoch
            self.deaths += 1

    def _new_epoch(self) -> None:
        """The engine restarted: a new epoch, an empty cache, no retention."""
        self._engine_died()  # a restart follows a death (a double's kill restarts at once)
        self.epoch += 1
        self.restarts += 1
        self._retained.clear()

    # -- engine hooks ------------------------------------------------------------------
    @abc.abstractmethod
    def _engine_steps(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        """Submit ``request`` and yield its deltas; raise ``EngineDied`` if the engine dies."""

    @abc.abstractmethod
    async def _abort_engine(self, request_id: str) -> None:
        """Abort ``request_id`` in the engine (a no-op when it is not running)."""

    @abc.abstractmethod
    def _scheduler_snapshot(self) -> SchedulerSnapshot:
        """The engine's scheduler stats as last reported for the current engine."""

    # -- bookkeeping (used by Generation) ----------------------------------------------
    @staticmethod
    def _key(handle: KVHandle, salt: str | None = None) -> int:
        """A resident handle's key: a collision only miscounts an expected cache hit."""
        return hash((handle.token_ids, handle.adapter, handle.epoch, salt))

    def _register(self, gen: Generation) -> None:
        self._live[gen.request_id] = gen
        self._counters.started += 1

    def _unregister(self, gen: Generation) -> None:
        self._live.pop(gen.request_id, None)

    def _remember_resident(
        self, handle: KVHandle, computed: int | None = None, salt: str | None = None
    ) -> None:
        key = self._key(handle, salt)
        self._resident[key] = len(handle) if computed is None else computed
        self._resident.move_to_end(key)
        while len(self._resident) > _RESIDENT_LIMIT:
            self._resident.popitem(last=False)

    def _output_handle(self, prompt: KVHandle, output_ids: tuple[int, ...], text: str) -> KVHandle:
        """The result's handle: ``prompt`` followed by what was generated.

        A bridge whose handles carry chat messages (the remote one) overrides it to
        write ``text`` into the prompt's open assistant turn.
        """
        return prompt.extend(output_ids)

    def _account(self, gen: Generation, reason: FinishReason) -> GenerationResult:
        request = gen.request
        prompt = request.prompt
        out = tuple(gen._output)
        salt = request.cache_salt
        expected, certain_miss = self.expected_cached_tokens(prompt, salt)
        cached = gen._cached or 0
        miss = certain_miss or cached < expected
        c = self._counters
        if reason == "abort":
            c.aborted += 1
        elif reason == "error":
            c.failed += 1
        else:
            c.finished += 1
        c.prompt_tokens += len(prompt)
        c.cached_tokens += cached
        c.completion_tokens += len(out)
        if miss:
            c.cache_misses += 1
            c.recomputed_tokens += max(0, expected - cached)
        if self._retained and cached:
            c.retained_hit_tokens += min(cached, self.retained_prefix(prompt, salt))
        text = "".join(gen._text)
        handle = attrs.evolve(self._output_handle(prompt, out, text), epoch=self.epoch)
        if request.retain is not None:
            if reason in ("stop", "length"):
                self._retained.put(request.retain.key, salt, handle)
                self._programs.finished(request.retain.key, _now())
                self._on_retained()
            else:
                self._retained.pop(request.retain.key)
        if reason in ("stop", "length"):
            # the prompt's ancestors are its prefixes, as resident as it is: a later prompt
            # that branches off one (a shared transcript after the context) expects a hit
            # (all their tokens were computed for this prompt, under its adapter)
            for node in prompt.lineage()[1:]:
                if len(node) >= self.block_size:
                    resident = attrs.evolve(node, epoch=self.epoch, adapter=prompt.adapter)
                    self._remember_resident(resident, salt=salt)
            self._remember_resident(attrs.evolve(prompt, epoch=self.epoch), salt=salt)
            # the last sampled token is never fed back: its KV is not computed
            self._remember_resident(handle, len(handle) - 1 if out else len(handle), salt)
        now = self.clock()
        return GenerationResult(
            request_id=request.request_id,
            prompt=prompt,
            handle=handle,
            output_ids=out,
            text=text,
            content=self.chat.content(text),
            finish_reason=reason,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            completion_tokens=len(out),
            cache_miss=miss,
            expected_cached_tokens=expected,
            timings=Timings(gen._submitted, gen._first_token, now),
            adapter=prompt.adapter.name if prompt.adapter else None,
            priority=request.priority,
            logprobs=tuple(gen._logprobs) if request.sampling.logprobs is not None else None,
        )


def _now() -> float:
    """The event loop's clock (virtual under a mock clock), or the monotonic one outside."""
    try:
        return anyio.current_time()
    except anyio.NoEventLoopError:
        return time.monotonic()
