"""ScriptedEngine: a deterministic in-process engine with vLLM's prefix-caching rules.

It is the test double of the engine bridge, and a product feature: users test
their own actors and collaborations against it, on any anyio backend, with no
model and (under trio's ``MockClock(autojump_threshold=0)``) no wall time.

Cache rules (those of vLLM v1's prefix cache, which these follow block for block):

* The KV pool has ``num_blocks`` blocks of ``block_size`` tokens.
* Only FULL blocks are cached, keyed by a chained hash
  ``hash(parent hash, block tokens, adapter name + path)``: a block hits only
  when the whole prefix before it hits, and different adapters never share.
* The last prompt token is always recomputed: at most
  ``(len(prompt) - 1) // block_size`` blocks of a prompt are served from cache.
* Blocks computed while decoding are cached too. The last sampled token is
  never fed back, so a finished request leaves the full blocks of its
  ``prompt + output[:-1]`` tokens in the cache.
* Blocks of finished requests stay cached, unreferenced, in LRU order (a
  request's tail blocks before its head blocks); a request that needs a block
  takes an empty one first, else evicts the least recently used.
* A request's blocks are registered when its prefill completes; a request that
  arrives while another is prefilling the same prefix waits for it and counts
  those blocks as cached (vLLM shares a prefix between concurrent cold requests
  the same way). Requests wait (``scheduler_waiting``) while ``max_num_seqs``
  are running or the pool cannot hold their prompt, and are admitted in
  priority order (lower value first, then arrival: vLLM's ``priority``
  policy); the head of the line blocks those behind it. A decoding request that
  needs a block takes one from a retention (in victim order) before the pool
  counts as full, as vLLM's does; the double never preempts: when the pool is
  exhausted, the blocks that do not fit are simply not cached.
* ``num_cached_tokens`` comes with a request's first output step.

Host tier (``host_tier_blocks > 0``; vLLM's offloading connector under the retaining
scheduler, ``vllm._tier``): every full block is written through to a host store of
``host_tier_blocks`` blocks when it is computed (prompt and output blocks). A prompt's
blocks that miss the device cache but are in the store, from the first miss on, are
loaded into fresh device blocks: they count as cached tokens (as vLLM's connector
reports them) and cost no prefill, only a copy (``tier_copy_rate``) when the engine
models time. A full store evicts by ``TierSessions.choose`` (``_tier_order``), the same
choice vLLM's ``SessionPolicy`` makes: cold blocks least recently used first, then the
blocks of held sessions, the one due back last first (``tier_policy="sessions"``), or
plain LRU (``"lru"``); a block being loaded is never evicted, and a store that finds
nothing to evict is skipped (the store never exceeds its blocks). With ``"sessions"``,
retention reckons losing a session's device blocks as a copy (``RetentionTable``'s
``copy_rate`` / ``copied``) and a demoted session keeps its host blocks held, as the
retaining scheduler does. An engine restart loses the store (it lives in the engine).

Outputs are scripted (``script``) or seeded pseudo-random words, end with the
end-of-turn token on ``"stop"`` (as vLLM's token ids do) and respect
``max_tokens`` (``"length"``, no end-of-turn token), ``choices`` and ``stop``
strings; under a JSON constraint (``json_schema``, ``json_object``, ``tagged``)
an unscripted reply is a small valid document (``example_instance``); ``logprobs``
are made up but well formed (the sampled token most likely, probabilities
summing below 1); ``regex``, ``top_p`` and ``top_k`` are ignored. Latency is anyio
sleeps (``prefill_time_per_token``, ``decode_time_per_token``), or batched engine
steps under a ``StepCost`` (``cost``).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import json
import math
import random
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Literal

import anyio
import attrs

from .._bridge import EngineBridge, EngineRequest, EngineStep, SchedulerSnapshot
from .._chat import ChatComposer, ChatTemplate
from .._chat_template import jinja_renderer
from .._errors import EngineDied, EngineUnavailable, RequestRefused
from .._handle import AdapterRef, KVHandle
from .._retention import RetentionStats, RetentionTable
from .._tier_order import DEFAULT_COPY_RATE, TierSessions
from .._tier_stats import TierStats
from .._tokenizer import IM_END, SPECIAL_TOKENS, ToyTokenizer
from .._tool_template import JinjaRenderer
from .._types import FinishReason, Sampling, TokenLogprob
from ._json_instance import example_instance
from ._step_cost import StepClock, StepCost

ScriptReply = str | Sequence[int] | None
_CHAT_ROLES = ("system", "user", "assistant")
ScriptFn = Callable[[tuple[int, ...], EngineRequest], ScriptReply]
Script = ScriptFn | Sequence[str] | Mapping[str, str]

WORDS: tuple[str, ...] = (
    "the", "agent", "answer", "is", "yes", "no", "maybe", "because", "we", "think",
    "it", "works", "cache", "token", "block", "plan", "review", "vote", "fine", "so",
    "first", "then", "check", "result", "correct", "wrong", "step", "one", "two", "three",
)  # fmt: skip


class _Aborted(Exception):
    """Internal: the request was aborted while waiting."""


@attrs.frozen
class HostBlock:
    """What the ScriptedEngine's host tier holds for one block: its content.

    ``_block_hash(parent, tokens, adapter)`` is the block's key, so a reader can check
    that an entry is the block it claims to be (the tier's "right KV" check).
    """

    parent: int | None
    tokens: tuple[int, ...]
    adapter: AdapterRef | None


def _block_hash(parent: int | None, tokens: tuple[int, ...], adapter: AdapterRef | None) -> int:
    return hash((parent, tokens, None if adapter is None else (adapter.name, adapter.path)))


def _salt_root(salt: str | None) -> int | None:
    """The parent of the first block: like vLLM, a salt enters the first block's hash."""
    return None if salt is None else hash(("cache_salt", salt))


@attrs.define(eq=False)
class _Request:
    request: EngineRequest
    epoch: int
    seq: int = 0  # arrival order: the tie-break among equal priorities
    turn: anyio.Event | None = None  # set when it becomes the head of the waiting line
    state: Literal["waiting", "running", "done"] = "waiting"
    blocks: list[int | None] = attrs.Factory(list)  # per block: its hash once cached, else None
    hashes: list[int] = attrs.Factory(list)  # chained hashes of the full computed blocks
    full: list[int] = attrs.Factory(list)  # chained hashes of the prompt's full blocks
    pending: list[int] = attrs.Factory(list)  # hashes this request is prefilling
    cache_full: bool = False
    cached: int | None = None
    loads: list[int] = attrs.Factory(list)  # hashes it loads from the host tier (pinned there)
    finished: bool = False  # ran to stop/length (only such requests are retained)
    scope: anyio.CancelScope | None = None
    aborted: bool = False
    died: tuple[BaseException | str, int] | None = None


class ScriptedEngine(EngineBridge):
    """A deterministic in-process engine with vLLM's prefix-caching semantics.

    Use it like any bridge: ``async with ScriptedEngine() as engine: ...``.

    Args:
        model: the served model name handles carry.
        script: where outputs come from, given the prompt ids and the request:
            a callable returning text, token ids, or None (seeded output); a
            sequence of canned replies (used in request order, cycling); or a
            mapping from a substring of the decoded prompt to the reply (first
            match wins, no match: seeded output).
        seed: seeds the pseudo-random outputs (with the prompt ids, and the
            request's own seed, or a per-request counter when temperature > 0).
        block_size: tokens per KV block.
        num_blocks: KV blocks in the pool.
        max_num_seqs: requests running at once; others wait.
        prefill_time_per_token: virtual seconds per computed prompt token.
        decode_time_per_token: virtual seconds per generated token.
        cost: run prefill and decode in batched engine steps whose time is this
            ``StepCost`` (chunked prefill sharing a token budget, decode slowing
            with the batch), as a real engine does, instead of the per-request
            sleeps above (which must then be 0): the model ``bench/agents_sim.py``
            simulates load with.
        reply_words: (min, max) words of a seeded reply.
        retention_budget: the fraction of ``num_blocks`` that ``retain=`` may hold
            (0 disables retention), with vLLM's rules (see ``Retain``).
        retention_ttl: seconds a retention lives unless it names its own ttl.
        history_limit: keep only this many of the latest requests in ``history``
            (None: all of them, for tests; a long-running server needs a bound).
        host_tier_blocks: blocks of the host KV tier below the pool (0: no tier).
        tier_policy: which host blocks go first: ``"sessions"`` (cold blocks, then
            the held session due back last) or ``"lru"`` (vLLM's stock policy, and
            retention as without a tier).
        tier_copy_rate: tokens per second the tier copies back: the load time when the
            engine models time, and what retention reckons losing a session costs.
        chat_template: a Jinja chat template (vLLM's ``--chat-template``) that renders
            the chat instead of ChatML; its turns end with ``<|im_end|>``, the toy
            tokenizer's end of turn. A template that does not compile or splice is a
            ``ValueError``.
    """

    def __init__(
        self,
        model: str = "scripted",
        *,
        script: Script | None = None,
        seed: int = 0,
        block_size: int = 16,
        num_blocks: int = 1024,
        max_num_seqs: int = 256,
        prefill_time_per_token: float = 0.0,
        decode_time_per_token: float = 0.0,
        cost: StepCost | None = None,
        reply_words: tuple[int, int] = (4, 24),
        retention_budget: float = 0.5,
        retention_ttl: float | None = None,
        history_limit: int | None = None,
        host_tier_blocks: int = 0,
        tier_policy: Literal["sessions", "lru"] = "sessions",
        tier_copy_rate: float = DEFAULT_COPY_RATE,
        chat_template: str | None = None,
    ) -> None:
        super().__init__(model, block_size=block_size)
        if block_size < 1 or num_blocks < 1 or max_num_seqs < 1:
            raise ValueError("block_size, num_blocks and max_num_seqs must be >= 1")
        self.script = script
        self.seed = seed
        self.num_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        if min(prefill_time_per_token, decode_time_per_token) < 0:
            raise ValueError("prefill and decode times must be >= 0 seconds")
        if cost is not None and (prefill_time_per_token or decode_time_per_token):
            raise ValueError("give either a step cost or per-token times, not both")
        #: the batched step model (None: per-request sleeps)
        self.steps = None if cost is None else StepClock(cost)
        self.prefill_time_per_token = prefill_time_per_token
        self.decode_time_per_token = decode_time_per_token
        self.reply_words = reply_words
        if not 0.0 <= retention_budget <= 1.0:
            raise ValueError(f"retention_budget must be in [0, 1], got {retention_budget}")
        self.retention_budget = retention_budget
        self.retention_ttl = retention_ttl
        self.tokenizer = ToyTokenizer(words=[f" {w}" for w in WORDS] + [*WORDS, "."])
        self.eot_token_id = self.tokenizer.token_id(IM_END)
        roles = (*_CHAT_ROLES, "tool")
        if chat_template is None:
            template = ChatTemplate.chatml(self.tokenize, self.eot_token_id, roles)
        else:  # fragments derived by rendering, as a real model's template's are
            render = jinja_renderer(chat_template, eos_token=IM_END)

            def derive(roles: tuple[str, ...]) -> ChatTemplate:
                return ChatTemplate.from_renderer(
                    render,
                    self.tokenize,
                    eot_token_id=self.eot_token_id,
                    eot_text=IM_END,
                    roles=roles,
                    markers=SPECIAL_TOKENS,
                )

            try:  # tool results get a turn of their own where the template renders one
                template = derive(roles)
            except ValueError:
                template = derive(_CHAT_ROLES)
        # rendered whole (tools included) where the template has a tool format
        renderer = None if chat_template is None else JinjaRenderer(chat_template, eos_token=IM_END)
        self.chat = ChatComposer(template, self, renderer)
        #: every request started, oldest first (the latest ``history_limit`` when set)
        self.history: list[EngineRequest] = []
        self.history_limit = history_limit
        self._open = False
        self._fail_next: BaseException | str | None = None
        self._requests: dict[str, _Request] = {}
        self._sampled = itertools.count()
        self._arrivals = itertools.count()
        self._line: list[tuple[int, int, _Request]] = []  # heap of waiting requests
        self._canned = itertools.count()
        self._pool_changed: anyio.Event | None = None
        per_token = prefill_time_per_token if cost is None else cost.prefill_token
        if host_tier_blocks < 0:
            raise ValueError(f"host_tier_blocks must be >= 0, got {host_tier_blocks}")
        if tier_policy not in ("sessions", "lru"):
            raise ValueError(f"tier_policy must be 'sessions' or 'lru', got {tier_policy!r}")
        if not tier_copy_rate > 0:
            raise ValueError(f"tier_copy_rate must be > 0 tokens/s, got {tier_copy_rate}")
        self.host_tier_blocks = host_tier_blocks
        self.tier_policy = tier_policy
        self.tier_copy_rate = tier_copy_rate
        #: the sessions the host tier keeps blocks for, and its eviction choice
        self.tier_sessions: TierSessions[int] = TierSessions()
        self._host: OrderedDict[int, HostBlock] = OrderedDict()  # least recently used first
        self._loading: Counter[int] = Counter()  # host blocks being loaded: never evicted
        self._tier_counts: Counter[str] = Counter()
        self._timed = cost is not None or prefill_time_per_token > 0
        tiered = self._held_by_sessions
        self._retention: RetentionTable[int] = RetentionTable(
            budget=int(num_blocks * retention_budget),
            free=self._give_back,
            default_ttl=retention_ttl,
            # what recomputing an entry costs here, as the vLLM scheduler reckons it
            block_tokens=block_size,
            # with the session-driven tier, losing an entry whose blocks the host holds
            # costs a copy, and a demoted session keeps its host blocks (vllm._retention)
            copy_rate=tier_copy_rate if tiered else None,
            copied=self._in_host if tiered else None,
            ended=self.tier_sessions.ended if tiered else None,
        )
        if per_token > 0:
            self._retention.prefill_rate = 1.0 / per_token
        self._reset_pool()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        """Start the engine (idempotent)."""
        self._open = True

    async def close(self) -> None:
        """Abort live requests and stop the engine (idempotent)."""
        for rid in list(self._live):
            await self.abort(rid)
        for rid in list(self._requests):
            await self._abort_engine(rid)
        self._open = False

    def kill(self, cause: BaseException | str = "killed") -> None:
        """Simulate the engine dying, then restart it at once.

        Every in-flight request raises ``EngineDied(cause, old_epoch)`` in its
        consumer; the new engine has ``epoch + 1`` and an empty cache, so old
        handles still work and their first use is a miss.
        """
        old = self.epoch
        for st in self._requests.values():
            if st.died is None and st.state != "done":
                st.died = (cause, old)
                if st.scope is not None:
                    st.scope.cancel()
        self._new_epoch()
        self._reset_pool()

    def fail_next(self, cause: BaseException | str = "scripted failure") -> None:
        """Make the next request kill the engine (like vLLM's seeded chunked-prefill crash)."""
        self._fail_next = cause

    # -- tokens ------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the toy tokenizer (reversible, special tokens parsed)."""
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens kept)."""
        return self.tokenizer.decode(token_ids)

    # -- requests ----------------------------------------------------------------------
    def check_request(self, prompt: KVHandle, sampling: Sampling) -> None:
        """Refuse what the engine could never run: closed engine, prompt larger than the pool."""
        super().check_request(prompt, sampling)
        if not self._open:
            raise EngineUnavailable(
                "the ScriptedEngine is not open; use `async with ScriptedEngine()`"
            )
        bs = self.block_size
        if -(-len(prompt) // bs) > self.num_blocks:
            raise RequestRefused(
                "prompt",
                f"{len(prompt)} tokens exceed the KV pool ({self.num_blocks} blocks of {bs})",
            )
        if -(-(len(prompt) + sampling.max_tokens) // bs) > self.num_blocks:
            raise RequestRefused(
                "max_tokens",
                f"prompt ({len(prompt)}) + max_tokens ({sampling.max_tokens}) exceed the KV pool "
                f"({self.num_blocks} blocks of {bs} tokens)",
            )

    def resident_tokens(self, handle: KVHandle) -> int:
        """How many leading tokens of ``handle`` are in the cache now (full blocks, no limit)."""
        if handle.epoch != self.epoch:
            return 0
        n = 0
        for h in self._hashes(handle.token_ids, handle.adapter, len(handle) // self.block_size):
            if h not in self._refs:
                break
            n += self.block_size
        return n

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a cached (hashed) prefix, referenced or not."""
        return len(self._refs)

    # -- engine hooks ------------------------------------------------------------------
    async def _engine_steps(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        st = _Request(request, self.epoch, next(self._arrivals))
        self._requests[request.request_id] = st
        self.history.append(request)
        if self.history_limit is not None and len(self.history) > 2 * self.history_limit:
            del self.history[: -self.history_limit]  # amortized: trimmed once per limit
        if self._fail_next is not None:
            cause, self._fail_next = self._fail_next, None
            self.kill(cause)
        try:
            try:
                await self._admit(st)
                await self._prefill(st)
                ids, finish = self._plan(request)
                n = len(request.prompt)
                for k, tok in enumerate(ids):
                    if k:
                        await self._decode(st, n + k - 1, request.prompt.token_ids + ids[:k])
                    last = k == len(ids) - 1
                    st.finished = last  # the consumer may stop reading at the final step
                    top = request.sampling.logprobs
                    yield EngineStep(
                        (tok,),
                        # like vLLM (skip_special_tokens): the end-of-turn token has no text
                        "" if tok == self.eot_token_id else self.detokenize((tok,)),
                        finish if last else None,
                        st.cached if k == 0 else None,
                        () if top is None else (self._logprobs(request, tok, top),),
                    )
                    self._interrupted(st)
            except _Aborted:
                yield EngineStep((), "", "abort", st.cached)
        finally:
            self._retire(st)
            self._requests.pop(request.request_id, None)

    async def _abort_engine(self, request_id: str) -> None:
        st = self._requests.get(request_id)
        if st is None or st.state == "done":
            return
        st.aborted = True
        if st.scope is not None:
            st.scope.cancel()
        self._retire(st)

    @property
    def retention_enabled(self) -> bool:
        return self.retention_budget > 0

    async def _release_engine(self, keys: list[str], prefix: str | None) -> int:
        ended = self._retention.release(keys, prefix=prefix)
        self.tier_sessions.forget(keys, prefix=prefix)  # demoted ones are not in the table
        return ended

    async def _retention_stats(self) -> RetentionStats:
        # an idle engine never schedules: entries past their TTL end when read too
        now = anyio.current_time()
        self.tier_sessions.expire(now)
        if self._retention.expire(now):
            self._notify()
        return self._retention.stats()

    async def tier_stats(self) -> TierStats:
        """The host tier's numbers (the double has no bytes: block counts only)."""
        if not self.host_tier_blocks:
            return TierStats()
        self.tier_sessions.expire(anyio.current_time())
        counts, order = self._tier_counts, self.tier_sessions
        return TierStats(
            enabled=True,
            capacity_blocks=self.host_tier_blocks,
            entries=len(self._host),
            peak_entries=counts["peak"],
            stored_blocks=counts["stored"],
            loaded_blocks=counts["loaded"],
            evicted_blocks=order.cold_evictions + order.held_evictions,
            load_seconds=counts["loaded"] * self.block_size / self.tier_copy_rate
            if self._timed
            else 0.0,
            policy=self.tier_policy,
            held_sessions=order.sessions,
            held_blocks=order.held_keys,
            cold_evicted_blocks=order.cold_evictions,
            held_evicted_blocks=order.held_evictions,
        )

    def host_blocks(self) -> dict[int, HostBlock]:
        """What the host tier holds now, by block hash, least recently used first
        (a copy: a test's view of the store)."""
        return dict(self._host)

    def host_tokens(self, handle: KVHandle) -> int:
        """How many leading tokens of ``handle`` the device cache or the host tier hold
        (full blocks, no limit): what a request on it could get without computing."""
        if handle.epoch != self.epoch:
            return 0
        n = 0
        for h in self._hashes(handle.token_ids, handle.adapter, len(handle) // self.block_size):
            if h not in self._refs and h not in self._host:
                break
            n += self.block_size
        return n

    def retained_blocks(self) -> int:
        """Distinct blocks retentions hold now (a test's view of the pool)."""
        return self._retention.held_blocks

    def _scheduler_snapshot(self) -> SchedulerSnapshot:
        current = [st for st in self._requests.values() if st.epoch == self.epoch]
        return SchedulerSnapshot(
            running=sum(st.state == "running" for st in current),
            waiting=sum(st.state == "waiting" for st in current),
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            kv_cache_usage=(self.num_blocks - self._empty - len(self._lru)) / self.num_blocks,
            kv_cache_capacity_tokens=self.num_blocks * self.block_size,
        )

    # -- scheduling --------------------------------------------------------------------
    async def _admit(self, st: _Request) -> None:
        prompt = st.request.prompt
        n, bs = len(prompt), self.block_size
        hashes = self._hashes(prompt.token_ids, prompt.adapter, n // bs, st.request.cache_salt)
        limit = (n - 1) // bs
        heapq.heappush(self._line, (st.request.priority, st.seq, st))
        queued = anyio.current_time()
        while True:
            self._interrupted(st)
            if self._head() is not st:  # admitted in priority order: wait for its turn
                st.turn = anyio.Event()
                await self._pause(st, event=st.turn)
                continue
            hits = 0
            while hits < limit and hashes[hits] in self._refs:
                hits += 1
            # from the first miss on, what the host tier holds is loaded (not what another
            # request is computing or loading now: that one is waited for, as in vLLM)
            loads = 0
            while (
                hits + loads < limit
                and hashes[hits + loads] in self._host
                and hashes[hits + loads] not in self._pending
            ):
                loads += 1
            if hits + loads < limit and hashes[hits + loads] in self._pending:
                await self._pause(st, event=self._pending[hashes[hits + loads]])
                continue
            need = -(-n // bs) - hits
            running = self._running()
            fits = self._fits(hashes[:hits], need)
            if (
                running < self.max_num_seqs
                and fits
                and not self._held_back(hashes[:hits], need, queued, running)
            ):
                break
            if not fits and self._make_room(
                hashes[:hits], need, st.request.priority, anyio.current_time() - queued, running
            ):
                continue  # retentions were released to admit it (never waits forever for one)
            await self._pause(st, event=self._pool_event())
        st.state = "running"
        for h in hashes[:hits]:
            self._ref(h)
            st.blocks.append(h)
        for _ in range(need):
            self._take()
            st.blocks.append(None)
        for h in hashes[hits:]:
            if h not in self._refs and h not in self._pending:
                self._pending[h] = anyio.Event()
                st.pending.append(h)
        st.hashes = hashes[:hits]
        st.cached = (hits + loads) * bs
        st.loads = hashes[hits : hits + loads]
        self._loading.update(st.loads)
        self._touch_host(hashes[: hits + loads])
        self._wake_head()  # the next in line may go now
        self._queries += n
        self._hits += hits * bs  # the device's prefix cache (vLLM counts the tier's apart)
        st.full = hashes

    async def _prefill(self, st: _Request) -> None:
        full, bs = st.full, self.block_size
        computed = len(st.request.prompt) - (st.cached or 0)
        if st.loads and self._timed:  # the host tier copies them in before the step
            await self._pause(st, seconds=len(st.loads) * bs / self.tier_copy_rate)
        if self.steps is not None:
            work = functools.partial(self.steps.prefill, computed, st.cached or 0)
            await self._pause(st, work=work)
        else:
            await self._pause(st, seconds=computed * self.prefill_time_per_token)
        self._unpin_loads(st, loaded=True)
        for i in range(len(st.hashes), len(full)):
            self._cache_block(st, i, full[i], st.request.prompt.token_ids[i * bs : (i + 1) * bs])
        self._resolve_pending(st)

    async def _decode(self, st: _Request, pos: int, tokens: tuple[int, ...]) -> None:
        """Compute the token at ``pos`` (the one sampled last step): allocate, cache full blocks."""
        if self.steps is not None:
            await self._pause(st, work=functools.partial(self.steps.decode, pos))
        else:
            await self._pause(st, seconds=self.decode_time_per_token)
        bs = self.block_size
        if st.cache_full:
            return
        if pos % bs == 0:
            # as the vLLM scheduler does: a running request's next block comes before any
            # retention (one victim at a time), and only then does the pool count as full
            while self._empty + len(self._lru) == 0 and self._retention.release_victim(
                anyio.current_time()
            ):
                pass
            if self._empty + len(self._lru) == 0:
                st.cache_full = True
                return
            self._take()
            st.blocks.append(None)
        if (pos + 1) % bs == 0:
            parent = st.hashes[-1] if st.hashes else _salt_root(st.request.cache_salt)
            block = pos // bs
            content = tuple(tokens[block * bs : pos + 1])
            self._cache_block(
                st, block, _block_hash(parent, content, st.request.prompt.adapter), content
            )

    def _plan(self, request: EngineRequest) -> tuple[tuple[int, ...], FinishReason]:
        """The whole output of ``request`` (ids) and how it ends."""
        s = request.sampling
        raw = self._scripted(request)
        if raw is None and (s.json_schema is not None or s.json_object or s.tagged is not None):
            raw = self._json_reply(request)
        if s.choices is not None:
            if raw is None:
                text = s.choices[self._rng(request).randrange(len(s.choices))]
            else:
                text = raw if isinstance(raw, str) else self.detokenize(raw)
                if text not in s.choices:
                    raise ValueError(f"script reply {text!r} is not one of the choices {s.choices}")
            ids = tuple(self.tokenize(text))
        elif raw is None:
            rng = self._rng(request)
            lo, hi = self.reply_words
            words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
            ids = tuple(self.tokenize(" ".join(words) + "."))
        elif isinstance(raw, str):
            ids = tuple(self.tokenize(raw))
        else:
            ids = tuple(int(t) for t in raw)
        stopped = False
        if s.stop:
            for i in range(len(ids)):
                if any(stop in self.detokenize(ids[: i + 1]) for stop in s.stop):
                    ids, stopped = ids[: i + 1], True
                    break
        if not stopped and (not ids or ids[-1] != self.eot_token_id):
            ids = (*ids, self.eot_token_id)
        if len(ids) > s.max_tokens:
            return ids[: s.max_tokens], "length"
        return ids, "stop"

    def _json_reply(self, request: EngineRequest) -> str:
        """A reply valid under the request's JSON constraint (a tagged one: one section)."""
        s = request.sampling
        rng = self._rng(request)
        if s.json_object:
            return json.dumps({"answer": rng.choice(WORDS)})
        tagged = s.tagged
        text = tagged.schema if tagged is not None else s.json_schema
        assert text is not None
        schema = json.loads(text)
        try:
            value = json.dumps(example_instance(schema, rng))
        except ValueError as exc:
            raise RequestRefused("sampling", str(exc)) from None
        return value if tagged is None else f"{tagged.begin}{value}{tagged.end}"

    def _logprobs(self, request: EngineRequest, token_id: int, k: int) -> TokenLogprob:
        """A made-up distribution at one position: the sampled token most likely, sum < 1."""
        rng = _seeded(self.seed, request.request_id, token_id, k)
        p = 0.5 + 0.45 * rng.random()
        top = [(token_id, math.log(p))]
        rest = 1.0 - p
        vocab = self.tokenizer.vocab_size
        others = [t for t in rng.sample(range(vocab), min(vocab, k + 1)) if t != token_id]
        for t in others[: max(0, k - 1)]:
            rest /= 2
            top.append((t, math.log(rest)))
        return TokenLogprob(token_id, top[0][1], tuple(top[:k]))

    def _scripted(self, request: EngineRequest) -> ScriptReply:
        script = self.script
        prompt = request.prompt.token_ids
        if script is None:
            return None
        if callable(script):
            return script(prompt, request)
        if isinstance(script, Mapping):
            decoded = self.detokenize(prompt)
            for key, reply in script.items():
                if key in decoded:
                    return reply
            return None
        if not script:
            return None
        return script[next(self._canned) % len(script)]

    def _rng(self, request: EngineRequest) -> random.Random:
        s = request.sampling
        salt: object = (
            s.seed if s.seed is not None else (next(self._sampled) if s.temperature > 0 else None)
        )
        return _seeded(self.seed, request.prompt.token_ids, salt)

    # -- the block pool ----------------------------------------------------------------
    def _reset_pool(self) -> None:
        pending = getattr(self, "_pending", {})
        for event in pending.values():
            event.set()
        self._empty = self.num_blocks
        self._refs: dict[int, int] = {}  # cached block hash -> running requests using it
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, LRU first
        self._pending: dict[int, anyio.Event] = {}
        self._queries = 0
        self._hits = 0
        self._retention.clear("restart", free=False)  # the old pool is gone with them
        self._host.clear()  # the host tier lives in the engine: gone with it
        self._loading.clear()
        self.tier_sessions.clear()
        self._notify()
        self._wake_head()

    def _hashes(
        self,
        tokens: Sequence[int],
        adapter: AdapterRef | None,
        count: int,
        salt: str | None = None,
    ) -> list[int]:
        out: list[int] = []
        # like vLLM, the salt enters the first block's hash, so every block's
        parent = _salt_root(salt)
        bs = self.block_size
        for i in range(count):
            parent = _block_hash(parent, tuple(tokens[i * bs : (i + 1) * bs]), adapter)
            out.append(parent)
        return out

    def _head(self) -> _Request | None:
        """The head of the waiting line: lowest priority value, then earliest arrival."""
        line = self._line
        while line and (line[0][2].state != "waiting" or line[0][2].epoch != self.epoch):
            heapq.heappop(line)
        return line[0][2] if line else None

    def _wake_head(self) -> None:
        head = self._head()
        if head is not None and head.turn is not None:
            head.turn.set()

    def _running(self) -> int:
        """Requests of this engine epoch running now (the batch of a step)."""
        return sum(s.state == "running" and s.epoch == self.epoch for s in self._requests.values())

    def _make_room(
        self, hits: Sequence[int], need: int, priority: int, waited: float, running: int
    ) -> bool:
        """Release retentions by the admission rule until ``need`` blocks fit."""
        table = self._retention
        if not len(table):
            return False
        now = anyio.current_time()
        self.tier_sessions.expire(now)
        ended = table.expire(now)
        ended += table.admit(
            lambda: self._fits(hits, need),
            priority=priority,
            waited=waited,
            now=now,
            idle=running == 0,
        )
        return ended > 0

    def _held_back(self, hits: Sequence[int], need: int, queued: float, running: int) -> bool:
        """Whether the admission rule holds a new program's first turn back for the headroom
        of sessions about to come back (``RetentionTable.holds_back``)."""
        table = self._retention
        if not len(table):
            return False
        now = anyio.current_time()
        return table.holds_back(
            self._free_beside(hits) - need,
            reserve=table.reserve(now),
            extends=table.extended_by(hits),
            waited=now - queued,
            idle=running == 0,
        )

    def _fits(self, hits: Sequence[int], need: int) -> bool:
        """Whether ``need`` new blocks fit beside ``hits``."""
        return self._free_beside(hits) >= need

    def _free_beside(self, hits: Sequence[int]) -> int:
        """Blocks a request could take beside its cached ``hits`` (hits idle in the LRU are
        not free: taking them would evict the request's own prefix)."""
        in_lru = sum(self._refs.get(h) == 0 for h in hits)
        return self._empty + len(self._lru) - in_lru

    def _give_back(self, blocks: Sequence[int]) -> None:
        """A retention ended: its references go (blocks at zero become LRU cache)."""
        for h in blocks:
            if h not in self._refs:
                continue  # the pool was reset under it
            self._refs[h] -= 1
            if self._refs[h] == 0:
                self._lru[h] = None
        self._notify()

    def _ref(self, h: int) -> None:
        if self._refs[h] == 0:
            del self._lru[h]
        self._refs[h] += 1

    def _take(self) -> None:
        """Take a block for a request: an empty one, else evict the least recently used."""
        if self._empty:
            self._empty -= 1
            return
        h, _ = self._lru.popitem(last=False)
        del self._refs[h]

    def _cache_block(self, st: _Request, index: int, h: int, tokens: Sequence[int]) -> None:
        """Block ``index`` of ``st`` is full and computed: cache it (unless a twin is cached),
        and write it through to the host tier."""
        parent = st.hashes[-1] if st.hashes else _salt_root(st.request.cache_salt)
        st.hashes.append(h)
        if h not in self._refs:
            self._refs[h] = 1
            st.blocks[index] = h
        if self.host_tier_blocks:
            self._store(h, HostBlock(parent, tuple(tokens), st.request.prompt.adapter))

    # -- the host tier -----------------------------------------------------------------
    @property
    def _held_by_sessions(self) -> bool:
        """Whether retained (and demoted) sessions are held in the host tier."""
        return self.host_tier_blocks > 0 and self.tier_policy == "sessions"

    def _in_host(self, blocks: Sequence[int]) -> bool:
        """Whether the host tier holds every one of ``blocks`` (losing them costs a copy)."""
        return all(h in self._host for h in blocks)

    def _touch_host(self, hashes: Sequence[int]) -> None:
        """A request used these blocks: most recent in the host tier, its head last
        (vLLM's LRU policy touches a request's keys tail to head)."""
        for h in reversed(hashes):
            if h in self._host:
                self._host.move_to_end(h)

    def _store(self, h: int, block: HostBlock) -> None:
        """Write a computed block through to the host tier (evicting by the policy's
        choice; skipped when every entry is being loaded, as vLLM skips a store)."""
        if h in self._host:
            self._host.move_to_end(h)
            return
        if len(self._host) >= self.host_tier_blocks:
            now = anyio.current_time()
            self.tier_sessions.expire(now)
            chosen = self.tier_sessions.choose(
                len(self._host) - self.host_tier_blocks + 1, iter(self._host), self._loading, now
            )
            if chosen is None:
                self._tier_counts["skipped"] += 1
                return
            for gone in chosen:
                self._evict_host(gone)
        self._host[h] = block
        self._tier_counts["stored"] += 1
        self._tier_counts["peak"] = max(self._tier_counts["peak"], len(self._host))

    def _evict_host(self, h: int) -> None:
        """Drop one host block the policy chose (a hook a test may watch)."""
        del self._host[h]

    def _unpin_loads(self, st: _Request, *, loaded: bool) -> None:
        """``st``'s loads are done (``loaded``) or abandoned: its host blocks may go again."""
        if not st.loads:
            return
        if loaded:
            self._tier_counts["loaded"] += len(st.loads)
        self._loading.subtract(st.loads)
        for h in st.loads:
            if self._loading[h] <= 0:
                del self._loading[h]
        st.loads = []

    def _resolve_pending(self, st: _Request) -> None:
        for h in st.pending:
            event = self._pending.pop(h, None)
            if event is not None:
                event.set()
        st.pending.clear()

    def _retire(self, st: _Request) -> None:
        """Release a finished/aborted request's blocks (tail first into the LRU)."""
        if st.state == "done":
            return
        st.state = "done"
        self._wake_head()  # it may have headed the line
        if st.epoch != self.epoch:
            return
        self._resolve_pending(st)
        self._unpin_loads(st, loaded=False)
        self._touch_host(st.hashes)
        retain = st.request.retain
        if retain is not None and st.finished and not st.aborted:
            lead = 0
            while lead < len(st.blocks) and st.blocks[lead] is not None:
                lead += 1
            kept = [h for h in st.blocks[:lead] if h is not None]
            del st.blocks[:lead]  # the retention now holds these references
            now = anyio.current_time()
            self._retention.retain(retain, kept, now, rank=st.request.priority)
            if self._held_by_sessions:  # demoted or not, the host copy is kept for it
                ttl = retain.ttl if retain.ttl is not None else self._retention.default_ttl
                self.tier_sessions.hold(
                    retain.key,
                    kept,
                    now=now,
                    next_use=retain.next_use,
                    expires=None if ttl is None else now + ttl,
                )
        for h in reversed(st.blocks):
            if h is None:
                self._empty += 1
                continue
            self._refs[h] -= 1
            if self._refs[h] == 0:
                self._lru[h] = None
        st.blocks.clear()
        self._notify()

    def _pool_event(self) -> anyio.Event:
        if self._pool_changed is None:
            self._pool_changed = anyio.Event()
        return self._pool_changed

    def _notify(self) -> None:
        event, self._pool_changed = self._pool_changed, None
        if event is not None:
            event.set()

    # -- interruption ------------------------------------------------------------------
    async def _pause(
        self,
        st: _Request,
        *,
        seconds: float = 0.0,
        event: anyio.Event | None = None,
        work: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Sleep, wait or compute in engine steps, woken early by an abort or the engine dying."""
        with anyio.CancelScope() as scope:
            st.scope = scope
            if st.aborted or st.died is not None:
                scope.cancel()
            if event is not None:
                await event.wait()
            elif work is not None:
                await work()
            else:
                await anyio.sleep(seconds)
        st.scope = None
        self._interrupted(st)

    def _interrupted(self, st: _Request) -> None:
        if st.died is not None:
            cause, epoch = st.died
            raise EngineDied(cause, epoch)
        if st.aborted:
            raise _Aborted


def _seeded(*parts: object) -> random.Random:
    """A generator seeded by ``parts`` alike in every process (``hash()`` of a str is not)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))
