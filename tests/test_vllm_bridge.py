"""VLLMBridge against the real vLLM engine (the shared session engine, default model).

Numbers come from the bridge's per-engine accounting: ``stats()`` (bridge
counters and the scheduler-side numbers of the engine's own stat logger) and
each request's ``GenerationResult``. Prompts carry a nonce so that no test
hits blocks cached by another.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from _engine import RealEngine, _context, _fork
from microagent.engine_bridge import (
    EngineDied,
    EngineStats,
    GenerationResult,
    KVHandle,
    RequestRefused,
    Sampling,
    TaggedJson,
    VLLMBridge,
)
from microagent.engine_bridge.vllm import _compat as compat

BLOCK = 128
GREEDY = Sampling(max_tokens=8, temperature=0.0)


def _delta(before: EngineStats, after: EngineStats) -> dict[str, int]:
    return {
        "prompt": after.prompt_tokens - before.prompt_tokens,
        "cached": after.cached_tokens - before.cached_tokens,
        "queries": after.prefix_cache_queries - before.prefix_cache_queries,
        "hits": after.prefix_cache_hits - before.prefix_cache_hits,
    }


async def _gather(
    bridge: VLLMBridge, prompts: Sequence[KVHandle], sampling: Sampling
) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * len(prompts)

    async def one(i: int) -> None:
        results[i] = await bridge.generate(prompts[i], sampling)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return [r for r in results if r is not None]


# -- without an engine: arguments and request checks ---------------------------------------


def test_engine_arguments_pin_limits_and_pass_everything_through() -> None:
    default = compat.cpu_dtype()
    assert default in ("bfloat16", "float32")
    mine = "float16" if default == "float32" else "float32"
    b = VLLMBridge(
        max_num_batched_tokens=1024,
        max_num_seqs=4,
        adapters={"x": "/tmp/adapter-x"},
        engine_args={"num_gpu_blocks_override": 64, "tensor_parallel_size": 1, "dtype": mine},
    )
    b.model_path = Path("/models/m")
    args = b._engine_arguments()
    assert args["model"] == args["tokenizer"] == "/models/m"
    assert (args["max_num_batched_tokens"], args["max_num_seqs"]) == (1024, 4)
    assert args["enable_prefix_caching"] is True
    assert args["scheduling_policy"] == "priority"
    assert args["enable_lora"] is True  # adapters given: LoRA on
    assert args["num_gpu_blocks_override"] == 64
    assert args["dtype"] == mine  # the user's value wins over the CPU default
    b.extra_engine_args = {}
    assert b._engine_arguments()["dtype"] == default
    assert args["enforce_eager"] is True
    assert b.adapters["x"].path == "/tmp/adapter-x"
    b2 = VLLMBridge(engine_args={"no_such_engine_arg": 1})
    b2.model_path = Path("/models/m")
    with pytest.raises(TypeError, match="no_such_engine_arg"):
        compat.engine_args(**b2._engine_arguments())


def test_request_checks_without_an_engine() -> None:
    b = VLLMBridge(max_model_len=512, max_num_batched_tokens=64)
    short = b.handle(range(1, 20))
    seeded = b.stream(short, Sampling(max_tokens=4, temperature=0.8, seed=3))
    assert seeded.request.sampling.seed == 3  # its prefill fits a step: served
    with pytest.raises(RequestRefused) as info:
        b.stream(b.handle(range(1, 66)), Sampling(max_tokens=4, temperature=0.8, seed=3))
    assert info.value.field == "seed"  # a step never holds its prefill
    assert "65 prompt tokens" in str(info.value) and "max_num_batched_tokens=64" in str(info.value)
    for strict in (VLLMBridge(cpu_seed="refuse"), VLLMBridge(retention=0)):
        with pytest.raises(RequestRefused) as info:
            strict.stream(short, Sampling(max_tokens=4, temperature=0.8, seed=3))
        assert info.value.field == "seed"
    with pytest.raises(ValueError, match="cpu_seed"):
        VLLMBridge(cpu_seed="always")  # type: ignore[arg-type]
    with pytest.raises(RequestRefused) as info:
        b.stream(b.handle(range(1, 600)), Sampling(max_tokens=4))
    assert info.value.field == "prompt"
    with pytest.raises(RequestRefused) as info:
        b.stream(b.handle(range(1, 500)), Sampling(max_tokens=20))
    assert info.value.field == "max_tokens"
    b.register_adapter("x", "/tmp/x")
    with pytest.raises(RequestRefused) as info:
        b.stream(short, Sampling(max_tokens=4), adapter="x")
    assert info.value.field == "adapter"
    lenient = VLLMBridge(max_model_len=512, cpu_seed="ignore")
    gen = lenient.stream(lenient.handle(range(1, 20)), Sampling(max_tokens=4, seed=3))
    assert gen.request.sampling.seed == 3  # accepted; sent to the engine unseeded


def test_sampling_params_mapping() -> None:
    greedy = compat.sampling_params(Sampling(max_tokens=7, top_k=5))
    assert (greedy.max_tokens, greedy.temperature, greedy.seed) == (7, 0.0, None)
    assert greedy.output_kind.name == "DELTA"
    choice = compat.sampling_params(
        Sampling(choices=("yes", "no"), temperature=0.7, seed=2), seed=2
    )
    assert choice.structured_outputs.choice == ["yes", "no"]
    assert (choice.seed, choice.temperature) == (2, 0.7)
    regex = compat.sampling_params(Sampling(regex="[0-9]+", stop=("\n",)))
    assert regex.structured_outputs.regex == "[0-9]+"
    assert regex.stop == ["\n"]
    schema = compat.sampling_params(Sampling(json_schema='{"type": "object"}', logprobs=3))
    assert schema.structured_outputs.json == {"type": "object"} and schema.logprobs == 3
    assert compat.sampling_params(Sampling(json_object=True)).structured_outputs.json_object
    tagged = compat.sampling_params(
        Sampling(tagged=TaggedJson("<c>", '{"type": "object"}', "</c>"))
    )
    tag = json.loads(tagged.structured_outputs.structural_tag)
    assert tag["triggers"] == ["<c>"] and tag["structures"][0]["end"] == "</c>"
    penalties = compat.sampling_params(
        Sampling(temperature=1.0, min_p=0.1, presence_penalty=0.5, repetition_penalty=1.1)
    )
    assert (penalties.min_p, penalties.presence_penalty, penalties.repetition_penalty) == (
        0.1,
        0.5,
        1.1,
    )
    with pytest.raises(ValueError, match="one output constraint"):
        Sampling(regex="a", json_object=True)
    with pytest.raises(ValueError, match="JSON"):
        Sampling(json_schema="{not json")
    assert [compat.map_finish_reason(r) for r in ("stop", "length", "abort", None, "weird")] == [
        "stop",
        "length",
        "abort",
        None,
        "error",
    ]


def test_token_logprobs_from_vllm_sample_logprobs() -> None:
    from vllm.logprobs import FlatLogprobs, Logprob

    positions = FlatLogprobs()
    # the sampled token 7 ranked 3rd: it comes with the top 2, as vLLM sends it
    positions.append({7: Logprob(-2.0, 3), 1: Logprob(-0.5, 1), 2: Logprob(-1.0, 2)})
    positions.append({1: Logprob(-0.1, 1), 4: Logprob(-3.0, 2)})
    out = compat.token_logprobs((7, 1), positions, 2)
    assert [(e.token_id, e.logprob) for e in out] == [(7, -2.0), (1, -0.1)]
    assert out[0].top == ((1, -0.5), (2, -1.0))
    assert out[1].top == ((1, -0.1), (4, -3.0))
    assert compat.token_logprobs((7,), positions, None) == ()


# -- basics ---------------------------------------------------------------------------------


@pytest.mark.engine
def test_engine_started_with_pinned_limits(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    s = b.stats()
    print(
        f"engine start: {real_engine.start_seconds:.1f} s (bridge.open), "
        f"engine {b.engine_start_seconds}"
    )
    assert b.block_size == BLOCK
    assert s.kv_cache_capacity_tokens >= 100 * BLOCK
    assert s.kv_cache_capacity_tokens % BLOCK == 0
    assert b.max_model_len == 4096
    assert b.engine is not None
    cfg = b.engine.vllm_config.scheduler_config
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (2048, 16)
    assert b.engine_core_pids()


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{task}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return out


@pytest.mark.engine
def test_engine_processes_preload_the_allocator_and_nothing_else_does(
    real_engine: RealEngine,
) -> None:
    """tcmalloc (when the machine has it) is mapped into the EngineCore and its worker,
    and the server process's own environment is left as it was."""
    b = real_engine.bridge
    assert b.engine_allocator == compat.engine_allocator()
    procs = [p for pid in b.engine_core_pids() for p in _process_tree(pid)]
    assert len(procs) >= 2  # the EngineCore and the worker it spawned
    for pid in procs:
        with open(f"/proc/{pid}/maps") as f:
            mapped = "libtcmalloc" in f.read()
        assert mapped == (b.engine_allocator is not None), pid
    assert "tcmalloc" not in os.environ.get("LD_PRELOAD", "")


@pytest.mark.engine
def test_engine_processes_cap_onednn_primitive_cache(real_engine: RealEngine) -> None:
    """The EngineCore and its worker run with oneDNN's cache capped (the server does not)."""
    want = os.environ.get(compat.ONEDNN_CACHE_ENV, str(compat.ENGINE_ONEDNN_CACHE))
    procs = [p for pid in real_engine.bridge.engine_core_pids() for p in _process_tree(pid)]
    assert len(procs) >= 2
    for pid in procs:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        assert env.get(compat.ONEDNN_CACHE_ENV.encode()) == want.encode(), pid


def test_engine_process_environment_is_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with compat.engine_process_environment("/lib/libtcmalloc_minimal.so.4"):
        assert os.environ["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4"
        os.environ["LD_PRELOAD"] += ":/torch/libgomp.so"  # what vLLM's CPU platform adds
    assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "/lib/libjemalloc.so.2")  # the user's own allocator wins
    with compat.engine_process_environment("/lib/libtcmalloc_minimal.so.4"):
        assert os.environ["LD_PRELOAD"] == "/lib/libjemalloc.so.2"
    monkeypatch.setenv("LD_PRELOAD", "/x/libfoo.so")
    with compat.engine_process_environment("/lib/libtcmalloc_minimal.so.4"):
        assert os.environ["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4:/x/libfoo.so"
    assert os.environ["LD_PRELOAD"] == "/x/libfoo.so"
    monkeypatch.setenv(compat.ALLOCATOR_ENV, "system")
    assert compat.engine_allocator() is None


def test_engine_environment_defaults_are_scoped_and_yield_to_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = compat.ONEDNN_CACHE_ENV
    monkeypatch.delenv(name, raising=False)
    with compat.engine_process_environment(None, compat.cpu_engine_environment()):
        assert os.environ[name] == str(compat.ENGINE_ONEDNN_CACHE)
    assert name not in os.environ
    monkeypatch.setenv(name, "512")  # the user's own setting wins, and is kept
    with compat.engine_process_environment(None, compat.cpu_engine_environment()):
        assert os.environ[name] == "512"
    assert os.environ[name] == "512"


@pytest.mark.engine
def test_tokenize_roundtrip_and_chat_template_matches_hf(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    text = "Hello, world! <|im_end|>"
    ids = b.tokenize(text)
    assert ids[-1] == b.tokenizer.eos_token_id  # special-token text maps to the token
    assert b.detokenize(ids) == text
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    composed = b.chat.prompt(messages)
    hf = b.tokenizer.raw.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    hf_ids = hf["input_ids"] if hasattr(hf, "keys") else hf
    assert list(composed.token_ids) == list(hf_ids)


@pytest.mark.engine
def test_generate_streams_deltas_and_returns_handle(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = b.chat.prompt([{"role": "user", "content": f"Say hi ({uuid.uuid4().hex[:6]})."}])
    deltas: list[tuple[int, ...]] = []

    async def run() -> GenerationResult:
        return await b.generate(
            prompt,
            Sampling(max_tokens=12),
            priority=1,
            on_delta=lambda d: deltas.append(d.token_ids),
        )

    r = real_engine.call(run)
    assert r.finish_reason in ("stop", "length")
    assert r.priority == 1  # the engine runs the priority scheduler
    assert sum(deltas, ()) == r.output_ids
    assert r.handle.token_ids == prompt.token_ids + r.output_ids
    assert r.completion_tokens == len(r.output_ids) >= 1
    assert r.prompt_tokens == len(prompt)
    # the text is the tokens' own, but for a stop token that ended it: vLLM writes no text
    # for that one (a reply that stopped within 12 tokens ends with <|im_end|>'s id)
    if r.finish_reason == "stop" and r.text != b.detokenize(r.output_ids):
        assert r.text == b.detokenize(r.output_ids[:-1])
        assert b.detokenize(r.output_ids[-1:]) in ("<|im_end|>", "<|endoftext|>")
    else:
        assert r.text == b.detokenize(r.output_ids)
    real_engine.assert_idle()


@pytest.mark.engine
def test_structured_choice(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = b.chat.prompt([{"role": "user", "content": "Is water wet? Answer yes or no."}])
    r = real_engine.call(b.generate, prompt, Sampling(max_tokens=4, choices=("yes", "no")))
    assert r.text in ("yes", "no")


@pytest.mark.engine
def test_refuses_prompts_and_budgets_over_max_model_len(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    assert b.max_model_len is not None
    too_long = b.handle([b.tokenize(" river")[0]] * b.max_model_len)
    with pytest.raises(RequestRefused) as info:
        b.stream(too_long, GREEDY)
    assert info.value.field == "prompt"
    near = b.handle([b.tokenize(" river")[0]] * (b.max_model_len - 4))
    with pytest.raises(RequestRefused) as info:
        b.stream(near, Sampling(max_tokens=8))
    assert info.value.field == "max_tokens"


# -- acceptance 1: forks share the context; second-level forks; misses --------------------------


@pytest.mark.engine
def test_concurrent_forks_compute_the_context_once(real_engine: RealEngine) -> None:
    b = real_engine.bridge

    def question(i: int) -> str:
        return f"Question {i}: what stands out in line {i + 1}?"

    # The second-level fork below can only be served from cache up to the last full
    # block of the first fork's output handle; align the context so that block
    # boundary falls close to the handle's end (output <= 8 tokens, suffix ~25).
    ctx = _context(b, 1500, lambda c: (len(_fork(b, c, question(0))) - 1) % BLOCK < 40)
    forks = [_fork(b, ctx, question(i)) for i in range(5)]
    suffixes = [len(f) - len(ctx) for f in forks]
    before = b.stats()
    results = real_engine.call(_gather, b, forks, GREEDY)
    after = b.stats()
    d = _delta(before, after)
    computed_bridge = d["prompt"] - d["cached"]
    computed_engine = d["queries"] - d["hits"]
    bound = len(ctx) + sum(suffixes) + 5 * BLOCK
    print(
        f"forks: context={len(ctx)} suffixes={suffixes} prompt={d['prompt']} "
        f"cached={d['cached']} computed(bridge)={computed_bridge} "
        f"computed(scheduler)={computed_engine} bound={bound}"
    )
    assert d["prompt"] == sum(len(f) for f in forks)
    assert computed_bridge <= bound
    assert d["queries"] == d["prompt"]
    assert computed_engine <= bound
    assert all(r.finish_reason in ("stop", "length") for r in results)

    # A second-level fork: built on a first fork's OUTPUT handle plus a short suffix.
    first = results[0]
    second = _fork(b, b.chat.close_turn(first.handle), "Now summarise that in one word.")
    assert first.handle.is_prefix_of(second)
    r2 = real_engine.call(b.generate, second, GREEDY)
    print(f"second-level fork: length={len(second)} cached={r2.cached_tokens}")
    assert (
        r2.cached_tokens >= (len(first.handle) - 1) // BLOCK * BLOCK
    )  # all of the output's blocks
    assert r2.cached_tokens >= len(second) - BLOCK
    assert not r2.cache_miss

    # Forced eviction: the next use of a known-resident handle is a detected miss,
    # and the handle still works; a re-warm makes it hit again.
    assert real_engine.call(b.reset_prefix_cache)
    misses = b.stats().cache_misses
    r3 = real_engine.call(b.generate, second, GREEDY)
    print(f"after eviction: cached={r3.cached_tokens} expected={r3.expected_cached_tokens}")
    assert r3.cache_miss
    assert r3.cached_tokens < r3.expected_cached_tokens
    assert r3.finish_reason in ("stop", "length")
    assert b.stats().cache_misses == misses + 1
    r4 = real_engine.call(b.generate, second, GREEDY)
    assert not r4.cache_miss
    assert r4.cached_tokens >= len(second) - BLOCK
    real_engine.assert_idle()


@pytest.mark.engine
def test_second_engine_evicts_for_real_and_keeps_its_own_stats(real_engine: RealEngine) -> None:
    """A second, small engine in the same process: LRU eviction is a detected miss,
    and each engine's stats are its own (the process-global metrics would mix them)."""
    shared = real_engine.bridge

    async def run() -> tuple[list[GenerationResult], EngineStats, int]:
        small = VLLMBridge(
            max_model_len=1024,
            max_num_seqs=4,
            engine_args={"num_gpu_blocks_override": 12},
            progress=False,
        )
        async with small:
            capacity = small.stats().kv_cache_capacity_tokens
            prompt = _fork(small, _context(small, 600), "One word?")
            out = [await small.generate(prompt, Sampling(max_tokens=2))]
            out.append(await small.generate(prompt, Sampling(max_tokens=2)))  # resident: hit
            filled = 0
            while filled <= capacity:  # other long prompts push it out (LRU)
                other = _fork(small, _context(small, 700), "One word?")
                await small.generate(other, Sampling(max_tokens=1))
                filled += len(other)
            out.append(await small.generate(prompt, Sampling(max_tokens=2)))  # evicted: miss
            out.append(await small.generate(prompt, Sampling(max_tokens=2)))  # re-warmed: hit
            return out, small.stats(), capacity

    before = shared.stats()
    (cold, warm, evicted, rewarmed), small_stats, capacity = real_engine.call(run)
    after = shared.stats()
    print(
        f"small engine: capacity={capacity} cached cold/warm/evicted/rewarmed="
        f"{cold.cached_tokens}/{warm.cached_tokens}/{evicted.cached_tokens}/{rewarmed.cached_tokens}"
    )
    assert capacity == 12 * BLOCK
    full = (len(cold.prompt) - 1) // BLOCK * BLOCK
    assert (cold.cached_tokens, warm.cached_tokens) == (0, full)
    assert evicted.cache_miss and evicted.cached_tokens < full
    assert not rewarmed.cache_miss and rewarmed.cached_tokens == full
    assert small_stats.cache_misses == 1
    assert small_stats.prefix_cache_queries == small_stats.prompt_tokens
    assert small_stats.prefix_cache_hits == small_stats.cached_tokens
    # The shared engine's numbers did not move while the small one worked.
    assert (after.prefix_cache_queries, after.prefix_cache_hits) == (
        before.prefix_cache_queries,
        before.prefix_cache_hits,
    )
    assert after.requests_started == before.requests_started
    real_engine.assert_idle()


# -- acceptance 2: abort and cancellation reach the scheduler -----------------------------------


async def _wait_scheduler_idle(bridge: VLLMBridge, timeout: float) -> float:
    t0 = time.monotonic()
    with anyio.fail_after(timeout):
        # Polling is the point: the number lives in the engine process.
        while bridge.stats().scheduler_running:  # noqa: ASYNC110
            await anyio.sleep(0.005)
    return time.monotonic() - t0


def _long_prompt(bridge: VLLMBridge) -> KVHandle:
    return bridge.chat.prompt(
        [{"role": "user", "content": f"Write a very long story ({uuid.uuid4().hex[:8]})."}]
    )


@pytest.mark.engine
def test_abort_after_first_tokens(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = _long_prompt(b)

    async def run() -> tuple[GenerationResult, int, float]:
        async with b.stream(prompt, Sampling(max_tokens=500, temperature=0.8)) as gen:
            seen = 0
            running = 0
            async for _ in gen:
                seen += 1
                running = max(running, b.stats().scheduler_running)
                if seen == 3:
                    assert await b.abort(gen.request_id)
            assert gen.result is not None
            latency = await _wait_scheduler_idle(b, 1.0)
            return gen.result, running, latency

    result, running, latency = real_engine.call(run)
    print(f"abort: scheduler running 0 after {latency * 1000:.0f} ms")
    assert running >= 1  # the scheduler did report the request running
    assert result.finish_reason == "abort"
    assert 1 <= result.completion_tokens < 500
    assert latency < 1.0
    real_engine.assert_idle()


@pytest.mark.engine
def test_cancelling_the_consumer_aborts(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = _long_prompt(b)

    async def run() -> tuple[GenerationResult | None, float, int]:
        holder: dict[str, object] = {}
        started = anyio.Event()
        aborted_before = b.stats().requests_aborted

        async def consume() -> None:
            async with b.stream(prompt, Sampling(max_tokens=500, temperature=0.8)) as gen:
                holder["gen"] = gen
                n = 0
                async for _ in gen:
                    n += 1
                    if n == 3:
                        started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await started.wait()
            tg.cancel_scope.cancel()
        gen = holder["gen"]
        latency = await _wait_scheduler_idle(b, 1.0)
        return gen.result, latency, b.stats().requests_aborted - aborted_before  # type: ignore[attr-defined]

    result, latency, aborted = real_engine.call(run)
    print(f"cancel: scheduler running 0 after {latency * 1000:.0f} ms")
    assert result is not None
    assert result.finish_reason == "abort"
    assert aborted == 1
    assert latency < 1.0
    real_engine.assert_idle()


# -- acceptance 3: adapters never share blocks --------------------------------------------------


@pytest.mark.engine
def test_adapters_do_not_share_cache(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = _fork(b, _context(b, 3 * BLOCK + 10), "Reply with one word.")
    one = Sampling(max_tokens=1)

    async def run() -> list[GenerationResult]:
        out = [await b.generate(prompt, one, adapter="lora-a")]
        out.append(await b.generate(prompt, one, adapter="lora-b"))
        out.append(await b.generate(prompt, one, adapter="lora-b"))
        out.append(await b.generate(prompt, one, adapter="lora-a"))
        out.append(await b.generate(prompt, one))  # the base model
        return out

    a1, b1, b2, a2, base = real_engine.call(run)
    full = (len(prompt) - 1) // BLOCK * BLOCK
    print(
        f"adapters: a1={a1.cached_tokens} b1={b1.cached_tokens} b2={b2.cached_tokens} "
        f"a2={a2.cached_tokens} base={base.cached_tokens}"
    )
    assert (a1.adapter, b1.adapter, base.adapter) == ("lora-a", "lora-b", None)
    assert a1.cached_tokens == 0
    assert b1.cached_tokens == 0  # same tokens, other adapter: no hit
    assert base.cached_tokens == 0  # nor for the base model
    assert b2.cached_tokens == full  # same adapter twice: hits
    assert a2.cached_tokens == full
    assert not (b2.cache_miss or a2.cache_miss)
    real_engine.assert_idle()


# -- acceptance 4: the engine-killer is refused; a killed engine restarts -----------------------


@pytest.mark.engine
def test_seeded_chunked_prefill_is_refused_and_engine_survives(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    prompt = _context(b, 2500)
    assert len(prompt) > b.max_num_batched_tokens
    with pytest.raises(RequestRefused) as info:
        b.stream(prompt, Sampling(max_tokens=4, temperature=0.8, seed=7))
    assert info.value.field == "seed"
    assert "max_num_batched_tokens" in str(info.value)
    # The engine still serves (and the same prompt without a seed is fine).
    restarts = b.restarts
    r = real_engine.call(b.generate, prompt, Sampling(max_tokens=2, temperature=0.8))
    assert r.finish_reason in ("stop", "length")
    assert b.restarts == restarts
    assert not b.engine.errored


@pytest.mark.engine
def test_killed_engine_fails_fast_and_restarts(real_engine: RealEngine) -> None:
    b = real_engine.bridge
    epoch, restarts = b.epoch, b.restarts
    # A handle resident in this epoch (longer than a block, so its reuse can miss).
    old = real_engine.call(
        b.generate, _fork(b, _context(b, 300), "One word?"), Sampling(max_tokens=4)
    )
    pids = b.engine_core_pids()
    assert pids
    before = b.stats()

    async def run() -> tuple[float, EngineDied, GenerationResult | None]:
        t_kill = 0.0
        gen = b.stream(_long_prompt(b), Sampling(max_tokens=500, temperature=0.8))
        try:
            async with gen:
                n = 0
                async for _ in gen:
                    n += 1
                    if n == 3:
                        t_kill = time.monotonic()
                        for pid in pids:
                            os.kill(pid, signal.SIGKILL)
        except EngineDied as exc:
            return time.monotonic() - t_kill, exc, gen.result
        raise AssertionError("the generation finished although its engine was killed")

    latency, died, failed = real_engine.call(run)
    print(f"engine killed: EngineDied after {latency * 1000:.0f} ms")
    assert latency < 1.0
    assert died.epoch == epoch
    assert "EngineDeadError" in str(died)  # names the cause
    assert failed is not None and failed.finish_reason == "error"
    # The next call waits out the restart and succeeds on a fresh engine.
    t0 = time.monotonic()
    fresh = real_engine.call(b.generate, _long_prompt(b), Sampling(max_tokens=4))
    print(f"restart + first request: {time.monotonic() - t0:.1f} s")
    assert fresh.finish_reason in ("stop", "length")
    assert (b.epoch, b.restarts) == (epoch + 1, restarts + 1)
    assert fresh.handle.epoch == b.epoch
    assert b.engine_core_pids() and set(b.engine_core_pids()).isdisjoint(pids)
    # Accounting is still correct: the killed request counts as failed, the fresh
    # engine's stat logger starts from zero and saw exactly the new request.
    after = b.stats()
    assert after.requests_failed == before.requests_failed + 1
    assert after.requests_finished == before.requests_finished + 1
    assert (
        after.requests_started
        == after.requests_finished + after.requests_aborted + after.requests_failed
    )
    assert after.prefix_cache_queries == fresh.prompt_tokens
    assert after.kv_cache_capacity_tokens == before.kv_cache_capacity_tokens
    # An old-epoch handle still works; its first use is reported as a miss.
    again = real_engine.call(b.generate, b.chat.close_turn(old.handle), Sampling(max_tokens=2))
    assert again.finish_reason in ("stop", "length")
    assert again.cache_miss
    real_engine.assert_idle()
