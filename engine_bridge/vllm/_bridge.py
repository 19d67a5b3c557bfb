"""VLLMBridge: the bridge on one in-process vLLM ``AsyncLLM``.

Exactly one engine per bridge; its EngineCore runs in a spawned child process
(scripts need an ``if __name__ == "__main__":`` guard). Every engine argument
passes through; CPU defaults that work on a small machine are filled in. A
per-engine stat logger feeds the scheduler-side numbers of ``stats()``. A dead
engine fails its in-flight requests with ``EngineDied``, is restarted (bounded
attempts, backoff) and the bridge's epoch is bumped. Version quirks of vLLM and
transformers live in ``_compat``.

The bridge is asyncio-only (vLLM's client is): from trio or another thread,
run it inside an asyncio blocking portal (see ``tests/_engine.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import attrs
from prometheus_client import CollectorRegistry

from .._bridge import EngineBridge, EngineRequest, EngineStep, SchedulerSnapshot
from .._errors import EngineBridgeError, EngineDied, EngineUnavailable, RequestRefused
from .._handle import AdapterRef, KVHandle
from .._retention import RetentionStats
from .._tier_stats import TierStats
from .._types import Sampling
from . import _compat as compat
from ._models import DEFAULT_MODEL_NAME, model_home, resolve_model

if TYPE_CHECKING:
    from .._chat import ChatComposer

log = logging.getLogger(__name__)

_CPU_BLOCK_SIZE = 128
#: what the CPU backend runs at when the caller names no size (measured on 2 cores;
#: a GPU gets vLLM's own defaults for its memory and usage context)
CPU_MAX_NUM_SEQS = 16
CPU_MAX_NUM_BATCHED_TOKENS = 2048
CPU_MAX_MODEL_LEN = 4096


class VLLMBridge(EngineBridge):
    """One served model on one in-process vLLM ``AsyncLLM``.

    Args:
        model: ``"default"`` (the embedded SmolLM2-135M-Instruct), a local HF
            model directory, or a hub id.
        served_name: the model name handles and the API carry (default: the
            model dir's name, or the hub id).
        max_num_batched_tokens: the scheduler's token budget per step. None
            (default): the CPU pin, 2048, on the CPU backend; vLLM's default for
            the device elsewhere.
        max_num_seqs: most requests running at once. None (default): the CPU
            pin, 16 (measured on this project's 2-core machines), on the CPU
            backend; vLLM's default for the device elsewhere.
        max_model_len: prompt + output limit; longer requests are refused. None
            (default): on the CPU backend 4096, or the model's own length when
            that is smaller (a long context costs a small machine its batch);
            elsewhere the model's own length, as vLLM chooses it.
        enable_lora: serve LoRA adapters (default: on when ``adapters`` are given).
        max_lora_rank: largest adapter rank accepted.
        max_loras: adapters resident in one batch.
        adapters: name -> path of LoRA adapters to register up front.
        scheduling_policy: ``"priority"`` (lower ``priority`` runs first; the
            critical path of a collaboration is given priority) or ``"fcfs"``.
        engine_args: any other ``AsyncEngineArgs`` field, passed through
            (``tensor_parallel_size``, ``data_parallel_size``,
            ``distributed_executor_backend``, ``num_gpu_blocks_override``…);
            these win over the bridge's defaults.
        data_parallel_rank: with ``data_parallel_size > 1``, send every request
            of this bridge to this rank so they share one prefix cache.
            Untested here: data parallel cannot run on a 2-core CPU machine.
        max_restarts: restart attempts after the engine dies before giving up.
        restart_backoff: seconds before the second attempt (doubles after).
        cpu_seed: what to do with a per-request ``seed`` on vLLM's CPU backend,
            where a seeded request whose prefill is split into chunks kills the
            engine (``CPU Generator does not use offset``). ``"whole"`` (default):
            serve it, the retaining scheduler computing its prefill in one step
            (``_seeded_prefill``); a seeded prompt longer than
            ``max_num_batched_tokens`` is refused (``RequestRefused("seed")``),
            and so is every seed with ``retention=0`` (vLLM's own scheduler).
            ``"refuse"``: refuse every seeded request; ``"ignore"``: serve it
            unseeded. Elsewhere a seed is always served.
        retention: the fraction of the KV cache that ``retain=`` may hold resident
            (default 0.95; 0 or None: no retention, vLLM's own scheduler). It loads
            our scheduler class into the EngineCore (``scheduler_cls``). Waiting
            requests take retained blocks by the admission rule (see ``Retain``),
            so a large budget never starves a new program past the patience.
        retention_ttl: seconds a retention lives unless its ``Retain`` says
            otherwise (default 600; None: until released). Expiry happens on an
            idle engine too.
        prefill_rate: prompt tokens per second the engine computes, for the
            retention's cost rule (default: 300 on CPU, 20 000 elsewhere).
        host_tier_bytes: RAM budget in bytes of a KV tier below the engine's
            cache (default 0: off, nothing changes). Every full block is copied
            there as it is computed (keyed by vLLM's block hash, so by LoRA
            adapter and ``cache_salt`` too); a request whose prefix left the
            device cache reloads it from there instead of recomputing it. The
            store is allocated once, in whole blocks within the budget, and
            drops its least recently used block when full. It is vLLM's
            ``OffloadingConnector`` with our spec (``_tier``), so it takes the
            place of ``kv_transfer_config`` / ``kv_offloading_size`` in
            ``engine_args``: giving both is a ``ValueError``. See
            ``docs/tiers.md``; ``tier_stats()`` reports what it holds and moved.
        disk_tier_bytes: disk budget in bytes of a file tier under the host tier
            (default 0: off; needs ``host_tier_bytes``). Every block stored in
            the host tier is written to a file too (write-through), under
            ``<home>/kv/<directory key>/``, where the key covers the model,
            ``revision``, KV dtype, block size, vLLM version and prefix hash, so
            another model or layout misses. Each file carries a blake2b digest
            checked on read: a bad file is a miss and is deleted. The files
            outlive the EngineCore: after a restart, a session's prefix loads
            from them. It needs block hashes that every process computes alike:
            the bridge sets ``prefix_caching_hash_algo="sha256_cbor"`` unless
            ``engine_args`` names one, and refuses ``xxhash``/``xxhash_cbor``
            without ``PYTHONHASHSEED`` (their seed is random per process).
        tier_policy: which host-tier blocks go first when it is full:
            ``"sessions"`` (default) keeps the blocks of sessions waiting on a tool
            (retained, or demoted from the device cache to make room) and drops
            cold blocks first, least recently used first, then the session whose
            next use is furthest; and a retained session whose blocks the tier
            holds gives up its device blocks to waiting work after a few copy
            times instead of 30 s (losing them costs a copy). ``"lru"`` is vLLM's
            stock policy (write-through, least recently used) with retention as
            without a tier. See ``docs/tiers.md``.
        chat_template: a Jinja chat template (text) that renders this model's chat
            instead of its tokenizer's (vLLM's ``--chat-template``; read a file with
            ``load_chat_template``).
        home: cache root for the default model and the file tier (default
            ``$MICROAGENT_HOME``).
        progress: show a progress bar while preparing the default model.
    """

    def __init__(
        self,
        model: str = "default",
        *,
        served_name: str | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        enable_lora: bool | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        adapters: Mapping[str, str | Path] | None = None,
        scheduling_policy: Literal["priority", "fcfs"] = "priority",
        engine_args: Mapping[str, Any] | None = None,
        data_parallel_rank: int | None = None,
        max_restarts: int = 3,
        restart_backoff: float = 1.0,
        cpu_seed: Literal["whole", "refuse", "ignore"] = "whole",
        retention: float | None = 0.95,
        retention_ttl: float | None = 600.0,
        prefill_rate: float | None = None,
        host_tier_bytes: int = 0,
        disk_tier_bytes: int = 0,
        tier_policy: Literal["sessions", "lru"] = "sessions",
        chat_template: str | None = None,
        home: Path | None = None,
        progress: bool = True,
    ) -> None:
        if served_name is None:
            served_name = DEFAULT_MODEL_NAME if model == "default" else Path(model).name or model
        self._is_cpu = compat.is_cpu_platform()
        extra = dict(engine_args or {})
        block_size = int(extra.get("block_size") or (_CPU_BLOCK_SIZE if self._is_cpu else 16))
        super().__init__(served_name, block_size=block_size)
        self.model_spec = model
        if self._is_cpu:  # the measured pins; a device keeps vLLM's defaults
            max_num_batched_tokens = max_num_batched_tokens or CPU_MAX_NUM_BATCHED_TOKENS
            max_num_seqs = max_num_seqs or CPU_MAX_NUM_SEQS
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_lora = bool(adapters) if enable_lora is None else enable_lora
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.scheduling_policy = scheduling_policy
        self.extra_engine_args = extra
        self.data_parallel_rank = data_parallel_rank
        self.max_restarts = max_restarts
        self.restart_backoff = restart_backoff
        if cpu_seed not in ("whole", "refuse", "ignore"):
            raise ValueError(f"cpu_seed must be 'whole', 'refuse' or 'ignore', got {cpu_seed!r}")
        self.cpu_seed = cpu_seed
        if retention is not None and not 0.0 <= retention <= 1.0:
            raise ValueError(f"retention must be a fraction in [0, 1], got {retention}")
        if retention_ttl is not None and not retention_ttl > 0:
            raise ValueError(f"retention_ttl must be > 0 seconds, got {retention_ttl}")
        self.retention = retention or 0.0
        self.retention_ttl = retention_ttl
        if prefill_rate is not None and not prefill_rate > 0:
            raise ValueError(f"prefill_rate must be > 0 tokens/s, got {prefill_rate}")
        self.prefill_rate = prefill_rate or (300.0 if self._is_cpu else 20_000.0)
        if host_tier_bytes < 0:
            raise ValueError(f"host_tier_bytes must be >= 0, got {host_tier_bytes}")
        doubled = sorted(set(extra) & {"kv_transfer_config", "kv_offloading_size"})
        if host_tier_bytes and doubled:
            raise ValueError(
                f"host_tier_bytes and engine_args {doubled} each configure a KV tier: "
                "give one of them"
            )
        self.host_tier_bytes = host_tier_bytes
        self.disk_tier_bytes = disk_tier_bytes
        if tier_policy not in ("sessions", "lru"):
            raise ValueError(f"tier_policy must be 'sessions' or 'lru', got {tier_policy!r}")
        self.tier_policy = tier_policy
        self.prefix_hash = _stable_prefix_hash(extra, disk_tier_bytes, host_tier_bytes)
        self._expiry_task: asyncio.Task[None] | None = None
        self._expiry_wake = asyncio.Event()
        self._home = home
        self.chat_template = chat_template
        self._progress = progress
        self.model_path: Path | str | None = None
        self.engine_start_seconds: list[float] = []
        #: the allocator library the engine's processes preload (None: the system's malloc)
        self.engine_allocator: str | None = None
        self._tokenizer: compat.HFTokenizer | None = None
        self._engine: Any = None
        self._sink = compat.StatSink()
        self._prometheus: CollectorRegistry | None = None
        self._kv_capacity = 0
        self._lora_ids: dict[str, int] = {}
        self._ready = asyncio.Event()
        self._lifecycle = asyncio.Lock()
        self._restart_task: asyncio.Task[None] | None = None
        self._unavailable: EngineUnavailable | None = None
        self._closed = False
        for name, path in (adapters or {}).items():
            self.register_adapter(name, str(path))

    # -- lifecycle ---------------------------------------------------------------------
    async def open(self) -> None:
        """Prepare the model, load the tokenizer and start the engine (idempotent)."""
        if self._restart_task is not None:  # a restart is bringing a new engine up
            await self._ready.wait()
            return
        async with self._lifecycle:
            if self._engine is not None or self._restart_task is not None:
                return
            if self._closed:
                raise EngineBridgeError("this bridge was closed; make a new one")
            if self.model_path is None:
                self.model_path = await asyncio.to_thread(
                    resolve_model, self.model_spec, home=self._home, progress=self._progress
                )
            if self._tokenizer is None:
                self._tokenizer = await asyncio.to_thread(
                    functools.partial(
                        compat.HFTokenizer, str(self.model_path), chat_template=self.chat_template
                    )
                )
                self.chat = self._make_chat()
            await self._start_engine()

    async def close(self) -> None:
        """Abort live requests and shut the engine down (idempotent)."""
        self._closed = True
        expiry, self._expiry_task = self._expiry_task, None
        if expiry is not None and not expiry.done():
            expiry.cancel()
            with contextlib.suppress(BaseException):
                await expiry
        task, self._restart_task = self._restart_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for rid in list(self._live):
            with contextlib.suppress(Exception):
                await self.abort(rid)
        engine, self._engine = self._engine, None
        self._ready.set()  # wake requests waiting for a restart: they see the bridge closed
        if engine is not None:
            compat.stop_output_handler(engine)
            await asyncio.to_thread(_shutdown, engine)

    def _engine_arguments(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model": str(self.model_path),
            "tokenizer": str(self.model_path),
            "served_model_name": self.model,
            "enable_prefix_caching": True,
            "scheduling_policy": self.scheduling_policy,
            # Our stat logger is given explicitly; vLLM's own periodic log stays off.
            "disable_log_stats": True,
            **compat.structured_outputs_engine_args(),
        }
        if self.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs is not None:
            args["max_num_seqs"] = self.max_num_seqs
        if self.max_model_len is not None:
            args["max_model_len"] = self.max_model_len
        elif self._is_cpu:
            args["max_model_len"] = _cpu_model_len(self.model_path)
        if self.enable_lora:
            args.update(
                enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=self.max_loras
            )
        if self._is_cpu:
            args.update(dtype=compat.cpu_dtype(), enforce_eager=True, gpu_memory_utilization=0.5)
        if self.retention_enabled:
            args.update(
                compat.retention_engine_args(
                    self.retention,
                    self.retention_ttl,
                    self.prefill_rate,
                    whole_seeded_prefills=self._is_cpu,  # GPU generators rewind: no need
                )
            )
        if self.host_tier_bytes:
            args.update(
                compat.host_tier_engine_args(
                    self.host_tier_bytes,
                    self.disk_tier_bytes,
                    str(model_home(self._home) / "kv"),
                    self.extra_engine_args.get("revision"),
                    self.prefix_hash,
                    self.tier_policy,
                )
            )
        for key, value in self.extra_engine_args.items():
            if key == "additional_config" and isinstance(args.get(key), dict):
                value = {**args[key], **dict(value)}
            args[key] = value
        return args

    # -- retention -----------------------------------------------------------------------
    @property
    def retention_enabled(self) -> bool:
        return self.retention > 0

    async def _release_engine(self, keys: list[str], prefix: str | None) -> int:
        engine = self._engine
        if engine is None or compat.engine_errored(engine):
            return 0
        return int(await compat.release_retentions(engine, keys, prefix))

    def _on_retained(self) -> None:
        """A request was retained: make sure its TTL ends even if the engine goes idle."""
        if not self.retention_enabled or self._closed:
            return
        if self._expiry_task is None or self._expiry_task.done():
            self._expiry_task = asyncio.get_running_loop().create_task(self._expire_idle())
        else:
            self._expiry_wake.set()

    async def _expire_idle(self) -> None:
        """Call the EngineCore's expiry at each retention's deadline until none is left.

        A busy engine expires entries before every step; an idle one never
        schedules, so without this a TTL would end only at the next request.
        """
        while not self._closed:
            engine = self._engine
            due: float | None = None
            if engine is not None and not compat.engine_errored(engine):
                with contextlib.suppress(Exception):
                    due = await compat.expire_retentions(engine)
            if due is None and engine is not None:
                return
            self._expiry_wake.clear()
            with contextlib.suppress(TimeoutError):
                # a new retention may end sooner: it wakes the wait
                await asyncio.wait_for(self._expiry_wake.wait(), 1.0 if due is None else due)

    async def _retention_stats(self) -> RetentionStats:
        engine = self._engine
        if engine is None or compat.engine_errored(engine):
            return RetentionStats(enabled=True)
        return RetentionStats(**await compat.retention_stats(engine))

    # -- the host KV tier ------------------------------------------------------------------
    async def tier_stats(self) -> TierStats:
        """What the host KV tier holds and has moved (``enabled=False`` when it is off)."""
        engine = self._engine
        if not self.host_tier_bytes:
            return TierStats()
        if engine is None or compat.engine_errored(engine):
            return TierStats(
                enabled=True,
                budget_bytes=self.host_tier_bytes,
                disk_budget_bytes=self.disk_tier_bytes,
            )
        return TierStats.from_wire(await compat.tier_stats(engine))

    async def _start_engine(self) -> None:
        preload = None
        environment: dict[str, str] = {}
        if self._is_cpu:
            compat.cpu_environment_defaults()
            preload = compat.engine_allocator()
            environment = compat.cpu_engine_environment()
        args = compat.engine_args(**self._engine_arguments())
        sink = compat.StatSink()
        registry = CollectorRegistry(auto_describe=True)  # this engine's vllm:* series
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # Off the event loop: starting takes ~20 s and other requests keep being served.
        # Shielded: if we are cancelled meanwhile, the engine still comes up in its
        # thread, and must then be shut down rather than leaked.
        starting = asyncio.ensure_future(
            asyncio.to_thread(
                compat.start_engine,
                args,
                [compat.stat_logger_factory(sink), compat.prometheus_logger(registry)],
                preload,
                environment,
            )
        )
        try:
            engine = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_shutdown_in_thread)
            raise
        self.engine_start_seconds.append(loop.time() - t0)
        self.engine_allocator = preload
        log.info("engine processes allocate with %s", preload or "the system's malloc")
        blocks, block_size = compat.kv_geometry(engine)
        self._engine = engine
        self._sink = sink
        self._prometheus = registry
        self._kv_capacity = blocks * block_size
        if block_size:
            self.block_size = block_size
        self.max_model_len = int(engine.model_config.max_model_len)
        scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
        if scheduler is not None:  # vLLM's device defaults, once it has chosen them
            self.max_num_seqs = int(scheduler.max_num_seqs)
            self.max_num_batched_tokens = int(scheduler.max_num_batched_tokens)
        self._unavailable = None
        self._ready.set()

    async def _ready_engine(self) -> Any:
        """The running engine; waits out a restart, starts a restart if it died idle."""
        while True:
            if self._unavailable is not None:
                raise self._unavailable
            engine = self._engine
            if engine is not None and not compat.engine_errored(engine):
                return engine
            if self._closed:
                raise EngineBridgeError("the bridge is closed")
            if engine is not None:
                self._on_engine_dead(engine, "engine found dead before a request")
            elif self._restart_task is None:
                raise EngineBridgeError("the bridge is not open: use `async with VLLMBridge(...)`")
            await self._ready.wait()

    def _on_engine_dead(self, engine: Any, cause: BaseException | str) -> None:
        if engine is not self._engine or self._closed:
            return  # already being handled
        log.warning("vLLM engine (epoch %d) died: %r; restarting", self.epoch, cause)
        self._engine_died()
        self._engine = None
        self._ready.clear()
        self._restart_task = asyncio.get_running_loop().create_task(self._restart(engine, cause))

    async def _restart(self, dead: Any, cause: BaseException | str) -> None:
        began = time.monotonic()
        compat.stop_output_handler(dead)
        await asyncio.to_thread(_shutdown, dead)
        delay = self.restart_backoff
        errors: list[BaseException] = []
        for attempt in range(self.max_restarts):
            if attempt:
                await asyncio.sleep(delay)
                delay *= 2
            try:
                async with self._lifecycle:
                    await self._start_engine()
            except Exception as exc:
                errors.append(exc)
                log.warning("engine restart attempt %d failed: %r", attempt + 1, exc)
                continue
            self._new_epoch()
            self._restart_task = None
            log.warning(
                "vLLM engine restarted (epoch %d) %.1f s after its death",
                self.epoch,
                time.monotonic() - began,
            )
            return
        self._unavailable = EngineUnavailable(
            f"the engine died ({cause!r}) and {self.max_restarts} restart attempts failed: "
            f"{errors!r}"
        )
        self._restart_task = None
        self._ready.set()

    # -- tokens and chat ---------------------------------------------------------------
    @property
    def tokenizer(self) -> compat.HFTokenizer:
        if self._tokenizer is None:
            raise EngineBridgeError("open the bridge first (the tokenizer loads with the model)")
        return self._tokenizer

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def tokenizer_fingerprint(self) -> str:
        """Equal for two bridges whose tokenizers give the same ids (then handles cross as ids)."""
        return self.tokenizer.fingerprint()

    def _make_chat(self) -> ChatComposer:
        """Token-level chat composition with the model's own chat template."""
        from .._chat import ChatComposer, ChatTemplate

        tok = self.tokenizer
        if not tok.has_chat_template:
            raise EngineBridgeError(f"model {self.model!r} has no chat template")
        eot_text = tok.eos_token
        eot_id = tok.eos_token_id
        if eot_text is None or eot_id is None:
            raise EngineBridgeError(f"model {self.model!r} has no end-of-turn token")

        def template(roles: tuple[str, ...]) -> ChatTemplate:
            return ChatTemplate.from_renderer(
                render=tok.render_chat,
                encode=tok.encode,
                eot_token_id=eot_id,
                eot_text=eot_text,
                roles=roles,
                markers=tok.special_tokens,
            )

        base = ("system", "user", "assistant")
        # the template rendered whole: a conversation with tools, where it has a tool format
        render = tok.render_chat
        try:  # tool results have a turn of their own where the template renders one
            return ChatComposer(template((*base, "tool")), self, render)
        except Exception:  # a template that refuses the role (jinja raise_exception)
            return ChatComposer(template(base), self, render)

    # -- requests ----------------------------------------------------------------------
    def check_request(self, prompt: KVHandle, sampling: Sampling) -> None:
        """Refuse what the engine would reject or die of (a seed: see ``cpu_seed``)."""
        super().check_request(prompt, sampling)
        limit = self.max_model_len
        if limit is not None:
            if len(prompt) >= limit:
                raise RequestRefused(
                    "prompt", f"{len(prompt)} prompt tokens do not fit max_model_len={limit}"
                )
            if len(prompt) + sampling.max_tokens > limit:
                raise RequestRefused(
                    "max_tokens",
                    f"{len(prompt)} prompt + {sampling.max_tokens} new tokens exceed "
                    f"max_model_len={limit}; ask for at most {limit - len(prompt)}",
                )
        if sampling.seed is not None and self._is_cpu:
            self._check_cpu_seed(len(prompt))
        if prompt.adapter is not None and not self.enable_lora:
            raise RequestRefused(
                "adapter", "this bridge was made without LoRA support (enable_lora=True)"
            )

    def _check_cpu_seed(self, prompt_tokens: int) -> None:
        """Refuse a seed the CPU backend cannot serve: its prefill must fit one step."""
        if self.cpu_seed == "ignore":
            return
        budget = self.max_num_batched_tokens
        if self.cpu_seed == "whole" and self.retention_enabled:
            if budget is not None and prompt_tokens > budget:
                raise RequestRefused(
                    "seed",
                    f"a seeded prompt must fit one scheduler step on vLLM's CPU backend: "
                    f"{prompt_tokens} prompt tokens are more than max_num_batched_tokens="
                    f"{budget} (a seeded prefill split into chunks kills the CPU engine, "
                    "'CPU Generator does not use offset'). Shorten the prompt, sample "
                    "without a seed, or raise max_num_batched_tokens",
                )
            return
        why = (
            "this bridge was made with cpu_seed='refuse'"
            if self.cpu_seed == "refuse"
            else "retention=0 leaves vLLM's own scheduler, which splits seeded prefills"
        )
        raise RequestRefused(
            "seed",
            f"per-request seeds are refused on vLLM's CPU backend here ({why}): a seeded "
            "prefill split into chunks kills the engine ('CPU Generator does not use "
            "offset'). Sample without a seed",
        )

    def _lora_request(self, adapter: AdapterRef | None) -> Any:
        if adapter is None:
            return None
        int_id = self._lora_ids.setdefault(adapter.name, len(self._lora_ids) + 1)
        return compat.lora_request(adapter.name, int_id, adapter.path)

    async def _engine_steps(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        engine = await self._ready_engine()
        epoch = self.epoch
        sampling = request.sampling
        seed = sampling.seed if not (self._is_cpu and self.cpu_seed == "ignore") else None
        kwargs: dict[str, Any] = {"lora_request": self._lora_request(request.prompt.adapter)}
        if self.scheduling_policy == "priority":
            kwargs["priority"] = request.priority
        if self.data_parallel_rank is not None:
            kwargs["data_parallel_rank"] = self.data_parallel_rank
        stream = engine.generate(
            compat.tokens_prompt(request.prompt.token_ids, request.cache_salt),
            compat.sampling_params(sampling, seed=seed, retain=request.retain),
            request.request_id,
            **kwargs,
        )
        first = True
        try:
            async for out in stream:
                cached = None
                if first:
                    cached = int(getattr(out, "num_cached_tokens", 0) or 0)
                    first = False
                completion = out.outputs[0] if out.outputs else None
                ids = tuple(int(t) for t in completion.token_ids) if completion else ()
                text = completion.text if completion else ""
                logprobs = compat.token_logprobs(
                    ids, completion.logprobs if completion else None, sampling.logprobs
                )
                reason = None
                if out.finished:
                    reason = compat.map_finish_reason(
                        completion.finish_reason if completion else None
                    )
                    reason = reason or "abort"
                yield EngineStep(ids, text, reason, cached, logprobs)
                if reason is not None:
                    return
        except Exception as exc:
            if compat.is_engine_dead(exc) or compat.engine_errored(engine):
                self._on_engine_dead(engine, exc)
                raise EngineDied(exc, epoch) from exc
            if first and isinstance(exc, ValueError):  # vLLM's input validation (a schema)
                raise RequestRefused("sampling", str(exc).splitlines()[0][:300]) from exc
            raise
        finally:
            with contextlib.suppress(BaseException):
                await stream.aclose()

    async def _abort_engine(self, request_id: str) -> None:
        engine = self._engine
        if engine is None or compat.engine_errored(engine):
            return
        with contextlib.suppress(Exception):
            await engine.abort(request_id)

    def prometheus_collector(self) -> CollectorRegistry | None:
        """vLLM's own ``vllm:*`` series of the current engine (its ``PrometheusStatLogger``).

        Each engine start gets a fresh registry: a restarted engine's counters start
        from zero (a counter reset, as after a ``vllm serve`` restart) and nothing is
        registered twice.
        """
        return self._prometheus

    def _scheduler_snapshot(self) -> SchedulerSnapshot:
        return attrs.evolve(self._sink.snapshot, kv_cache_capacity_tokens=self._kv_capacity)

    # -- test and operations support ---------------------------------------------------
    async def reset_prefix_cache(self) -> bool:
        """Evict every cached block that no running request uses (forces misses).

        Returns whether the engine reset its cache (False while requests run).
        Every retention ends first (``"released"``): vLLM resets nothing while a
        block is referenced. Handles stay valid: their next use recomputes and
        reports a miss.
        """
        engine = await self._ready_engine()
        if self.retention_enabled:
            await self.release(prefix="")
        return bool(await engine.reset_prefix_cache())

    def engine_core_pids(self) -> list[int]:
        """Process ids of the current engine's EngineCore child processes."""
        return [] if self._engine is None else compat.engine_core_pids(self._engine)

    @property
    def engine(self) -> Any:
        """The current ``AsyncLLM`` (None while stopped or restarting)."""
        return self._engine

    async def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until an engine is serving (after a restart); raise if it could not start."""
        with anyio.fail_after(timeout):
            await self._ready_engine()


def _stable_prefix_hash(extra: Mapping[str, Any], disk_bytes: int, host_bytes: int) -> str | None:
    """The prefix hash the file tier keys on (None without one); refuses one a restart changes.

    vLLM seeds ``xxhash``/``xxhash_cbor`` with random bytes per process unless
    ``PYTHONHASHSEED`` is set: the restarted EngineCore would hash every block
    differently and never hit a file.
    """
    if disk_bytes < 0:
        raise ValueError(f"disk_tier_bytes must be >= 0, got {disk_bytes}")
    if not disk_bytes:
        return None
    if not host_bytes:
        raise ValueError(
            "disk_tier_bytes needs host_tier_bytes > 0: the file tier sits under the host tier"
        )
    algo = str(extra.get("prefix_caching_hash_algo") or compat.STABLE_HASH)
    if algo in compat.UNSTABLE_HASHES and os.environ.get("PYTHONHASHSEED") is None:
        raise ValueError(
            f"prefix_caching_hash_algo={algo!r} is seeded at random in every process unless "
            "PYTHONHASHSEED is set, so a file tier would never hit after a restart: set "
            f"PYTHONHASHSEED, or use {compat.STABLE_HASH!r} (the default with disk_tier_bytes)"
        )
    return algo


def _shutdown_in_thread(started: asyncio.Future[Any]) -> None:
    if not started.cancelled() and started.exception() is None:
        threading.Thread(target=_shutdown, args=(started.result(),), daemon=True).start()


def _shutdown(engine: Any) -> None:
    with contextlib.suppress(Exception):
        compat.shutdown_engine(engine)


def _cpu_model_len(model_path: Path | str | None) -> int:
    """The CPU pin of ``max_model_len``: 4096, or the model's own length when smaller
    (its ``config.json``'s ``max_position_embeddings``; vLLM refuses a longer limit)."""
    config = Path(str(model_path)) / "config.json" if model_path is not None else None
    try:
        data = json.loads(config.read_text()) if config is not None else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    text = data.get("text_config")
    own = data.get("max_position_embeddings") or (
        text.get("max_position_embeddings") if isinstance(text, dict) else None
    )
    return min(CPU_MAX_MODEL_LEN, own) if isinstance(own, int) and own > 0 else CPU_MAX_MODEL_LEN
