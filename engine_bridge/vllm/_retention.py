"""The vLLM side of KV retention: a Scheduler subclass that runs inside the EngineCore process.

vLLM 0.32 has no pin API for attention blocks. What it has (read from the
installed source, and checked by the real-engine tests):

* ``scheduler_cls`` loads our ``Scheduler`` subclass in the EngineCore process;
  ``additional_config["microagent_retention"]`` carries our settings there.
* At a request's finish, ``kv_cache_manager.pop_blocks_for_free(request)``
  returns its blocks *without* freeing them: they keep ``ref_cnt > 0`` (never
  in the free queue, never evicted) and their hashes stay in the prefix-cache
  map (later requests hit them). ``block_pool.free_blocks`` gives them back.
* ``SamplingParams.extra_args`` reaches the scheduler with the request: the
  ``Retain`` mark travels there.
* ``EngineCore`` utility methods (``call_utility_async``) run on the engine
  thread between steps: release and statistics travel that way.

A running request whose next blocks do not fit takes retained blocks (any
entry, in victim order) before vLLM would preempt it: an admitted request is
never recomputed for a retention.

Every vLLM-internal name of the retention lives in this module. Only requests
that finish normally (stop, length) are retained; aborted ones free as usual.
Before each ``schedule()``, expired entries end, and when the head of the
waiting queue cannot be allocated, entries are released by the table's
admission rule (those of programs served after it, those not worth keeping,
any past the patience or when nothing runs) until it can: a retention never
makes a request wait longer than the patience, nor an idle engine wait at all.
An idle engine never schedules, so the bridge calls ``EXPIRE_UTILITY`` at each
entry's deadline.

With a KV connector (the host tier) and async scheduling (vLLM's default on a
GPU), vLLM sets ``defer_block_free``: a finished request's blocks may still be
written by a step in flight, so vLLM returns them to the pool only once that
step's output is processed. Retaining is safe then too (a retained block keeps
``ref_cnt > 0`` and is never reallocated): the blocks are retained anyway, and
whatever goes back to the pool (the partial tail now, the retained blocks when
released) waits behind the same fence in vLLM's deferred-free queue. Under
async scheduling vLLM would otherwise run our ``Scheduler`` subclass without
overlap (it only overlaps an ``AsyncScheduler``): ``RetainingScheduler``
becomes ``AsyncRetainingScheduler`` when the config asks for async scheduling.

On the CPU backend the same ``allocate_slots`` hook also keeps seeded prefills in
one piece (``_seeded_prefill``: vLLM's CPU generator cannot rewind a discarded
token, and a split seeded prefill kills the engine).
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore
from vllm.v1.kv_offload.base import OffloadKey, make_offload_key
from vllm.v1.request import Request, RequestStatus

from .._retention import Retain, RetentionTable
from .._tier_order import DEFAULT_COPY_RATE
from ._seeded_prefill import SETTING as WHOLE_SEEDED_PREFILLS
from ._seeded_prefill import WholeSeededPrefills
from ._tier_policy import SessionPolicy

#: ``SamplingParams.extra_args`` key of a request's ``Retain`` mark.
EXTRA_ARGS_KEY = "microagent_retain"
#: ``additional_config`` key of the settings: ``{"budget": fraction, "ttl": seconds | None,
#: "whole_seeded_prefills": bool}`` (the last: ``_seeded_prefill``, on the CPU backend).
CONFIG_KEY = "microagent_retention"
#: Names of the utility methods the bridge calls on the EngineCore.
RELEASE_UTILITY = "microagent_release"
STATS_UTILITY = "microagent_retention_stats"
EXPIRE_UTILITY = "microagent_expire"

_RETAINED_STATUSES = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


class RetainingScheduler(Scheduler):
    """vLLM's scheduler, plus retention of marked requests' blocks under a key."""

    #: the ``SamplingParams.extra_args`` key a request's ``Retain`` mark travels under
    retain_key: ClassVar[str] = EXTRA_ARGS_KEY

    def __new__(cls, *args: Any, **kwargs: Any) -> RetainingScheduler:
        # vLLM builds ``scheduler_cls(vllm_config=..., ...)``: under async scheduling the
        # retaining scheduler must be an ``AsyncScheduler`` too, or vLLM runs it without
        # overlapping steps
        config = kwargs.get("vllm_config", args[0] if args else None)
        scheduling = getattr(config, "scheduler_config", None)
        if cls is RetainingScheduler and getattr(scheduling, "async_scheduling", False):
            cls = AsyncRetainingScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: block id -> the step that may still write it (``defer_block_free`` only)
        self._retained_fences: dict[int, int] = {}
        extra = self.vllm_config.additional_config
        settings = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
        fraction = float(settings.get("budget", 0.5))
        ttl = settings.get("ttl")
        pool = self.kv_cache_manager.block_pool
        #: the host tier's session-driven eviction policy (None: no tier, or vLLM's LRU)
        self.tier_policy = _session_policy(self.connector)
        #: ``_in_tier``'s answers in the current scheduling step
        self._tier_step = -1
        self._tier_answers: dict[tuple[int, ...], bool] = {}
        tiered = self.tier_policy is not None
        # entries hold block ids: a retained block (ref_cnt > 0) is never reassigned
        self.retention: RetentionTable[int] = RetentionTable(
            budget=int(pool.num_gpu_blocks * fraction),
            free=self._give_back,
            default_ttl=float(ttl) if ttl is not None else None,
            block_tokens=int(self.block_size),
            prefill_rate=float(settings.get("prefill_rate", 300.0)),
            copy_rate=float(settings.get("copy_rate", DEFAULT_COPY_RATE)) if tiered else None,
            copied=self._in_tier if tiered else None,
            # a demoted session keeps its host copy held; any other end forgets it
            ended=self.tier_policy.order.ended if self.tier_policy is not None else None,
        )

        #: seeded prefills in one piece (None: the platform's generators rewind)
        self.whole_seeded = (
            WholeSeededPrefills(self.max_num_scheduled_tokens)
            if settings.get(WHOLE_SEEDED_PREFILLS)
            else None
        )

        # a running request's next blocks come before any retention: vLLM would
        # otherwise preempt (and later recompute) an admitted request while idle
        # retained blocks sit in the pool
        manager = self.kv_cache_manager
        allocate = manager.allocate_slots
        seeded = self.whole_seeded
        slots = inspect.signature(allocate)

        def allocate_for_running_first(
            request: Request, num_new_tokens: int, *args: Any, **kwargs: Any
        ) -> Any:
            # a seeded prefill that would be split gets "no room": vLLM stops admitting
            if seeded is not None:
                named = slots.bind(request, num_new_tokens, *args, **kwargs).arguments
                if seeded.holds_back(request, num_new_tokens, named):
                    return None
            blocks = allocate(request, num_new_tokens, *args, **kwargs)
            while (
                blocks is None
                and request.status == RequestStatus.RUNNING
                and self.retention.release_victim(time.monotonic())
            ):
                blocks = allocate(request, num_new_tokens, *args, **kwargs)
            return blocks

        manager.allocate_slots = allocate_for_running_first  # type: ignore[method-assign]

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        if self.whole_seeded is not None:  # seeded prefills that can never fit a step end
            self.whole_seeded.fail_unfit(self, outputs)
        return outputs

    def _give_back(self, block_ids: Sequence[int]) -> None:
        pool = self.kv_cache_manager.block_pool
        now: list[Any] = []
        later: list[Any] = []
        fence = 0
        for i in block_ids:
            seq = self._retained_fences.pop(i, None)
            if seq is not None and seq > self.processed_step_seq:
                later.append(pool.blocks[i])
                fence = max(fence, seq)
            else:
                now.append(pool.blocks[i])
        pool.free_blocks(now)
        if later:  # a step still in flight may write them: vLLM frees them after it
            self.deferred_frees.append((fence, later))

    # -- finishing: retain instead of free -------------------------------------------------
    def _free_request_blocks(self, request: Request) -> None:
        retain = _retain_of(request)
        if retain is None or request.status not in _RETAINED_STATUSES:
            super()._free_request_blocks(request)
            return
        in_flight = not self._request_blocks_can_be_freed(request)
        blocks = self.kv_cache_manager.pop_blocks_for_free(request)
        full = 0
        while full < len(blocks) and blocks[full].block_hash is not None:
            full += 1
        kept = [b.block_id for b in blocks[:full]]
        # the partial tail is never a cache hit: it goes back now, or after the step
        # that may still write it (as vLLM's own deferred free would)
        if in_flight:
            if blocks[full:]:
                self.deferred_frees.append((self.sched_step_seq, blocks[full:]))
            self._retained_fences.update(dict.fromkeys(kept, self.sched_step_seq))
        else:
            self.kv_cache_manager.block_pool.free_blocks(blocks[full:][::-1])
        now = time.monotonic()
        self.retention.retain(retain, kept, now, rank=request.priority)
        if self.tier_policy is not None:  # demoted or not, the host copy is kept for it
            ttl = retain.ttl if retain.ttl is not None else self.retention.default_ttl
            self.tier_policy.hold(
                retain.key,
                self._offload_keys(kept),
                now=now,
                next_use=retain.next_use,
                expires=None if ttl is None else now + ttl,
            )

    # -- the host tier: sessions demoted, not dropped -----------------------------------------
    def _offload_keys(self, block_ids: Sequence[int]) -> list[OffloadKey]:
        blocks = self.kv_cache_manager.block_pool.blocks
        keys = []
        for i in block_ids:
            block_hash = blocks[i].block_hash
            if block_hash is not None:
                keys.append(make_offload_key(get_block_hash(block_hash), get_group_id(block_hash)))
        return keys

    def _in_tier(self, block_ids: Sequence[int]) -> bool:
        """Whether the host tier holds every one of these blocks (losing them costs a copy).

        Asked for every entry by each pass of the admission and headroom rules: the
        answer is kept for the rest of the scheduling step (stores land between steps).
        """
        policy = self.tier_policy
        assert policy is not None
        step = self.sched_step_seq
        if self._tier_step != step:
            self._tier_step, self._tier_answers = step, {}
        held = tuple(block_ids)
        found = self._tier_answers.get(held)
        if found is None:
            keys = self._offload_keys(block_ids)
            found = len(keys) == len(block_ids) and all(
                (c := policy.get(k)) is not None and c.is_ready for k in keys
            )
            self._tier_answers[held] = found
        return found

    # -- admission: a retention never makes a request wait --------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        table = self.retention
        if len(table):
            table.expire(time.monotonic())
            head = self._waiting_head()
            pool = self.kv_cache_manager.block_pool
            # the cheap bound first: a head that fits without any hit needs no release
            if head is not None and pool.get_num_free_blocks() <= self._blocks_at_most(head):
                need = self._blocks_needed(head)
                table.admit(
                    lambda: pool.get_num_free_blocks() >= need,
                    priority=head.priority,
                    waited=time.time() - head.arrival_time,
                    now=time.monotonic(),
                    idle=not self.running,
                )
        held = self._newcomers_held_back()
        if held:  # out of the queue for this step only: a priority queue re-sorts them in
            self.waiting.remove_requests(held)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            for request in held:
                self.waiting.add_request(request)

    def _newcomers_held_back(self) -> list[Request]:
        """The waiting requests the headroom rule holds back this step
        (``RetentionTable.holds_back``): new programs' first turns that would leave fewer
        free blocks than the retained sessions' next turns need. Only under priority
        scheduling (a program's place is its priority; a FCFS queue could not be put back
        in order) and while something runs."""
        table = self.retention
        if not len(table) or not self.running or self.policy != SchedulingPolicy.PRIORITY:
            return []
        slots = self.max_num_running_reqs - len(self.running)
        candidates = list(itertools.islice(self.waiting, max(0, slots)))
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        reserve = table.reserve(time.monotonic())
        # the cheap bound first (no hit counted): when even that leaves the reserve free,
        # nothing waits, and the retained blocks' hashes need not be read this step
        if free - sum(self._blocks_at_most(r) for r in candidates) >= reserve:
            return []
        retained = self._retained_hashes()
        wall = time.time()
        held: list[Request] = []
        for request in candidates:
            hits: list[int] = []
            for h in request.block_hashes:
                if h not in retained:
                    break
                hits.append(retained[h])
            free_after = free - (self._blocks_at_most(request) - len(hits))
            if table.holds_back(
                free_after,
                reserve=reserve,
                extends=table.extended_by(hits),
                waited=wall - request.arrival_time,
            ):
                held.append(request)
            else:
                free = free_after
        return held

    def _retained_hashes(self) -> dict[Any, int]:
        """The prefix-cache hash of every retained block, and the block's id."""
        blocks = self.kv_cache_manager.block_pool.blocks
        retained: dict[Any, int] = {}
        for key in self.retention.names():
            for block_id in self.retention.blocks_of(key):
                block_hash = blocks[block_id].block_hash
                if block_hash is not None:
                    retained[get_block_hash(block_hash)] = block_id
        return retained

    def _waiting_head(self) -> Request | None:
        for queue in (self.kv_holding_waiting, self.waiting):
            if queue:
                return queue.peek_request()
        return None

    def _blocks_at_most(self, request: Request) -> int:
        """New blocks ``request`` needs if nothing of it is cached (``_blocks_needed``'s bound)."""
        return math.ceil(request.num_tokens / self.block_size) + 1

    def _blocks_needed(self, request: Request) -> int:
        """New blocks ``request`` needs beyond the retained prefix it will hit."""
        retained = self._retained_hashes()
        hits = 0
        for h in request.block_hashes:
            if h not in retained:
                break
            hits += 1
        return max(0, self._blocks_at_most(request) - 1 - hits) + 1


class AsyncRetainingScheduler(RetainingScheduler, AsyncScheduler):
    """``RetainingScheduler`` over vLLM's ``AsyncScheduler`` (async scheduling is on)."""


def _retain_of(request: Request) -> Retain | None:
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not isinstance(extra, dict):
        return None
    return Retain.from_wire(extra.get(EXTRA_ARGS_KEY))


def _session_policy(connector: object) -> SessionPolicy | None:
    """The host tier's ``SessionPolicy`` behind vLLM's connector, if it runs one."""
    scheduler_side = getattr(connector, "connector_scheduler", None)
    manager = getattr(scheduler_side, "manager", None)
    policy = getattr(manager, "_policy", None)
    return policy if isinstance(policy, SessionPolicy) else None


def _release(core: EngineCore, keys: list[str], prefix: str | None) -> int:
    scheduler = core.scheduler
    if not isinstance(scheduler, RetainingScheduler):
        return 0
    ended = scheduler.retention.release(keys, prefix=prefix)
    if scheduler.tier_policy is not None:  # demoted sessions are no longer in the table
        scheduler.tier_policy.forget(keys, prefix=prefix)
    return ended


def _expire(core: EngineCore) -> float | None:
    """End the entries past their TTL (an idle engine never schedules); the next deadline."""
    scheduler = core.scheduler
    if not isinstance(scheduler, RetainingScheduler):
        return None
    table = scheduler.retention
    now = time.monotonic()
    table.expire(now)
    if scheduler.tier_policy is not None:
        scheduler.tier_policy.expire(now)
    due = table.next_expiry()
    return None if due is None else max(0.0, due - now)


def _stats(core: EngineCore) -> dict[str, object]:
    scheduler = core.scheduler
    if not isinstance(scheduler, RetainingScheduler):
        return {}
    return scheduler.retention.stats().to_dict()


# The utility methods travel by name (``getattr(EngineCore, name)`` in the core process);
# importing this module there (to load the scheduler class) installs them.
setattr(EngineCore, RELEASE_UTILITY, _release)
setattr(EngineCore, STATS_UTILITY, _stats)
setattr(EngineCore, EXPIRE_UTILITY, _expire)
