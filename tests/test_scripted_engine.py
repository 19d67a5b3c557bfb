"""ScriptedEngine: vLLM's prefix-cache rules against an independent reference, outputs, failures."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import anyio
import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.engine_bridge import (
    EngineDied,
    EngineRequest,
    EngineUnavailable,
    GenerationResult,
    KVHandle,
    RequestRefused,
    Retain,
    Sampling,
)
from microagent.testing import ScriptedEngine, StepCost, ToyTokenizer
from strategies import cache_programs, chat_texts

BACKEND_RUNS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


class ReferenceCache:
    """The block rules in a few lines: prefixes of full blocks, LRU, last token recomputed.

    A cached block is named by the whole token prefix it ends (and the adapter),
    which is what a chained hash stands for. Empty blocks are used before
    evicting; a finished request's blocks enter the LRU tail-first.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.empty = num_blocks
        self.bs = block_size
        self.lru: OrderedDict[tuple[Any, ...], None] = OrderedDict()  # unreferenced cached blocks

    def _take(self) -> None:
        if self.empty:
            self.empty -= 1
        else:
            self.lru.popitem(last=False)

    def run(self, prompt: tuple[int, ...], adapter: str | None, output: tuple[int, ...]) -> int:
        """Serve ``prompt``; ``output``: the tokens the consumer received. Returns cached tokens."""
        bs, n, seq = self.bs, len(prompt), prompt + output

        def key(end: int) -> tuple[Any, ...]:
            return (adapter, seq[:end])

        hits = 0
        while hits < (n - 1) // bs and key((hits + 1) * bs) in self.lru:
            hits += 1
        blocks: list[tuple[Any, ...] | None] = [key((i + 1) * bs) for i in range(hits)]
        for end in range(bs, hits * bs + 1, bs):
            del self.lru[key(end)]
        for _ in range(-(-n // bs) - hits):
            self._take()
            blocks.append(None)
        for end in range((hits + 1) * bs, n + 1, bs):  # prefill done: full prompt blocks cached
            if key(end) not in self.lru:
                blocks[end // bs - 1] = key(end)
        for pos in range(n, n + len(output) - 1):  # decoding feeds back all but the last token
            if pos % bs == 0:
                self._take()
                blocks.append(None)
            if (pos + 1) % bs == 0 and key(pos + 1) not in self.lru:
                blocks[pos // bs] = key(pos + 1)
        for b in reversed(blocks):
            if b is None:
                self.empty += 1
            else:
                self.lru[b] = None
        return hits * bs


def _planned(out: list[int], max_tokens: int, eot: int) -> tuple[int, ...]:
    ids = (*out, eot)
    return ids[:max_tokens]


async def _run_program(program: dict[str, Any]) -> None:
    bs, nb = program["block_size"], program["num_blocks"]
    capacity = bs * nb
    outputs: dict[str, tuple[int, ...]] = {}

    def script(prompt: tuple[int, ...], request: EngineRequest) -> tuple[int, ...]:
        return outputs[request.request_id]

    ref = ReferenceCache(nb, bs)
    resident: dict[tuple[Any, ...], int] = {}  # (tokens, adapter) -> computed tokens
    lineages: list[list[tuple[tuple[int, ...], str | None]]] = []  # (tokens, adapter), newest first
    totals = {"prompt": 0, "cached": 0, "completion": 0, "misses": 0, "aborted": 0, "finished": 0}
    async with ScriptedEngine(block_size=bs, num_blocks=nb, script=script) as engine:
        engine.register_adapter("a", "/adapters/a")
        engine.register_adapter("b", "/adapters/b")
        eot = engine.eot_token_id
        handles: list[KVHandle] = []
        for root in program["roots"]:
            handles.append(engine.handle(root))
            lineages.append([(tuple(root), None)])
        for i, op in enumerate(program["ops"]):
            at = op["base"] % len(handles)
            base, base_lineage = handles[at], lineages[at]
            adapter = op["adapter"]
            max_tokens = min(op["max_tokens"], capacity - 1)
            prompt = base.extend(op["suffix"] or [10]).with_adapter(engine.resolve_adapter(adapter))
            lineage = [(prompt.token_ids, adapter), *base_lineage]
            if len(prompt) + max_tokens > capacity:
                prompt = engine.handle(prompt.token_ids[: capacity - max_tokens], adapter=adapter)
                lineage = [(prompt.token_ids, adapter)]
            rid = f"op{i}"
            planned = _planned(op["out"], max_tokens, eot)
            outputs[rid] = tuple(op["out"])
            stop_after = op["abort_after"]
            aborted = stop_after is not None and stop_after <= len(planned)
            received = planned[:stop_after] if aborted else planned

            async with engine.stream(
                prompt, Sampling(max_tokens=max_tokens), request_id=rid
            ) as gen:
                count = 0
                async for _ in gen:
                    count += 1
                    if stop_after is not None and count >= stop_after:
                        break
            result = gen.result
            assert isinstance(result, GenerationResult)

            # the reference: cached tokens, then the miss rule of known-resident ancestors
            cached = ref.run(prompt.token_ids, adapter, received)
            limit = (len(prompt) - 1) // bs * bs
            expected = 0
            for tokens, node_adapter in lineage:
                if node_adapter == adapter and (tokens, adapter) in resident:
                    expected = min(resident[(tokens, adapter)] // bs * bs, limit)
                    break
            assert result.output_ids == received
            assert result.finish_reason == (
                "abort" if aborted else ("length" if len(planned) < len(op["out"]) + 1 else "stop")
            )
            assert result.cached_tokens == cached, (i, prompt.token_ids, adapter)
            assert result.expected_cached_tokens == expected
            assert result.cache_miss == (cached < expected)
            totals["prompt"] += len(prompt)
            totals["cached"] += cached
            totals["completion"] += len(received)
            totals["misses"] += cached < expected
            totals["aborted" if aborted else "finished"] += 1
            if not aborted:
                for tokens, _ in lineage[1:]:  # its prefixes: computed for it, under its adapter
                    if len(tokens) >= bs:
                        resident[(tokens, adapter)] = len(tokens)
                resident[(prompt.token_ids, adapter)] = len(prompt)
                resident[(result.handle.token_ids, adapter)] = len(result.handle) - 1
            handles.append(result.handle)
            lineages.append([(result.handle.token_ids, adapter), *lineage])

        stats = engine.stats()
        assert stats.prompt_tokens == totals["prompt"] == stats.prefix_cache_queries
        assert stats.cached_tokens == totals["cached"] == stats.prefix_cache_hits
        assert stats.completion_tokens == totals["completion"]
        assert stats.cache_misses == totals["misses"]
        assert stats.requests_aborted == totals["aborted"]
        assert stats.requests_finished == totals["finished"]
        assert stats.requests_live == stats.scheduler_running == stats.scheduler_waiting == 0
        assert stats.kv_cache_usage == 0.0
        assert engine.cached_blocks == len(ref.lru)


@pytest.mark.parametrize("backend", BACKEND_RUNS)
@settings(max_examples=60, deadline=None)
@given(program=cache_programs)
def test_cache_accounting_matches_reference_model(
    backend: tuple[str, dict[str, Any]], program: dict[str, Any]
) -> None:
    name, options = backend
    anyio.run(_run_program, program, backend=name, backend_options=options)


# --- cache rules, by example -----------------------------------------------------------


@pytest.mark.anyio
async def test_last_prompt_token_is_recomputed() -> None:
    async with ScriptedEngine(block_size=4) as engine:
        h = engine.handle(range(20, 28))  # exactly two blocks
        first = await engine.warm(h)
        again = await engine.warm(h)
        assert first.cached_tokens == 0
        assert again.cached_tokens == 4  # (8 - 1) // 4 blocks: the last token's block is recomputed
        longer = await engine.warm(h.extend([30]))
        assert longer.cached_tokens == 8


@pytest.mark.anyio
async def test_decoded_blocks_are_cached() -> None:
    async with ScriptedEngine(block_size=4, script=[list(range(40, 49))]) as engine:
        prompt = engine.handle(range(20, 26))
        result = await engine.generate(prompt, Sampling(max_tokens=50))
        assert len(result.handle) == 6 + 10  # 9 scripted tokens and the end-of-turn token
        follow = await engine.warm(result.handle.extend([1]))
        assert follow.cached_tokens == 12  # prompt + output[:-1] = 15 computed: three full blocks
        assert not follow.cache_miss


@pytest.mark.anyio
async def test_adapters_never_share_blocks() -> None:
    async with ScriptedEngine(block_size=4) as engine:
        engine.register_adapter("x", "/x")
        engine.register_adapter("y", "/y")
        h = engine.handle(range(20, 33))
        await engine.warm(h, priority=0)
        await engine.generate(h, Sampling(max_tokens=1), adapter="x")
        y = await engine.generate(h, Sampling(max_tokens=1), adapter="y")
        x = await engine.generate(h, Sampling(max_tokens=1), adapter="x")
        assert y.cached_tokens == 0
        assert x.cached_tokens == 12


@pytest.mark.anyio
async def test_same_name_other_path_is_another_adapter() -> None:
    one = ScriptedEngine(block_size=4)
    async with one:
        ref_a = one.register_adapter("x", "/one")
        h = one.handle(range(20, 33))
        await one.generate(h, Sampling(max_tokens=1), adapter=ref_a)
        assert one.resident_tokens(h.with_adapter(ref_a)) == 12
        # a handle claiming the same name with another path is not the cached adapter
        other = h.with_adapter(type(ref_a)("x", "/two"))
        assert one.resident_tokens(other) == 0


@pytest.mark.anyio
async def test_concurrent_cold_forks_share_one_prefill() -> None:
    async with ScriptedEngine(block_size=8, prefill_time_per_token=0.0001) as engine:
        context = engine.handle(range(100, 100 + 200))
        results: list[GenerationResult] = []

        async def fork(i: int) -> None:
            results.append(
                await engine.generate(context.extend([50 + i, 60]), Sampling(max_tokens=2))
            )

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(fork, i)
        cached = sorted(r.cached_tokens for r in results)
        assert cached == [0, 200, 200, 200, 200]
        assert engine.stats().computed_prompt_tokens == 202 + 4 * 2


@pytest.mark.anyio
async def test_lru_evicts_least_recently_used() -> None:
    async with ScriptedEngine(block_size=2, num_blocks=6) as engine:
        a = engine.handle([20, 21, 22, 23, 24])
        b = engine.handle([30, 31, 32, 33, 34])
        await engine.warm(a)  # a's blocks: [20 21] [22 23] cached
        await engine.warm(b)
        assert engine.resident_tokens(a) == 4
        await engine.warm(a)  # touch a: b is now the least recently used
        c = engine.handle([40, 41, 42, 43, 44])
        await engine.warm(c)
        assert engine.resident_tokens(a) == 4
        assert engine.resident_tokens(b) < 4


@pytest.mark.anyio
async def test_max_num_seqs_makes_requests_wait() -> None:
    async with ScriptedEngine(max_num_seqs=1, decode_time_per_token=0.001) as engine:
        h = engine.handle([20, 21, 22])
        async with engine.stream(h, Sampling(max_tokens=50)) as first:
            async for _ in first:
                break
            async with anyio.create_task_group() as tg:
                tg.start_soon(engine.generate, h, Sampling(max_tokens=3))
                await anyio.wait_all_tasks_blocked()
                snap = engine.stats()
                assert (snap.scheduler_running, snap.scheduler_waiting) == (1, 1)
                await engine.abort(first.request_id)
        assert await engine.wait_idle()


# --- outputs ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_scripted_outputs_end_with_eot_and_respect_max_tokens() -> None:
    async with ScriptedEngine(script=["hello there", "general kenobi"]) as engine:
        p = engine.chat.prompt([{"role": "user", "content": "hi"}])
        one = await engine.generate(p, Sampling())
        assert (
            one.text == "hello there"
        )  # the end-of-turn token is in the ids, not the text (as in vLLM)
        assert one.output_ids[-1] == engine.eot_token_id
        assert one.finish_reason == "stop"
        two = await engine.generate(p, Sampling(max_tokens=1))
        assert (two.text, two.finish_reason) == ("general", "length")
        three = await engine.generate(p, Sampling())
        assert three.text.startswith("hello there")  # canned replies cycle


@pytest.mark.anyio
async def test_script_mapping_and_callable() -> None:
    async with ScriptedEngine(script={"capital of France": "Paris"}) as engine:
        r = await engine.generate(
            engine.chat.prompt([{"role": "user", "content": "The capital of France?"}]), Sampling()
        )
        assert r.text == "Paris"
        seeded = await engine.generate(
            engine.chat.prompt([{"role": "user", "content": "other"}]), Sampling()
        )
        assert seeded.finish_reason == "stop" and len(seeded.output_ids) > 1

    seen: list[str] = []

    def script(prompt: tuple[int, ...], request: EngineRequest) -> list[int]:
        seen.append(request.request_id)
        return [20, 21]

    async with ScriptedEngine(script=script) as engine:
        r = await engine.generate(engine.handle([5, 6]), Sampling(), request_id="mine")
        assert r.output_ids == (20, 21, engine.eot_token_id)
        assert seen == ["mine"]


@pytest.mark.anyio
async def test_choices_and_stop_strings() -> None:
    async with ScriptedEngine(seed=3) as engine:
        p = engine.chat.prompt([{"role": "user", "content": "yes or no?"}])
        r = await engine.generate(p, Sampling(choices=("yes", "no")))
        assert r.text.removesuffix("<|im_end|>") in ("yes", "no")
    async with ScriptedEngine(script=["maybe"]) as engine:
        with pytest.raises(ValueError, match="not one of the choices"):
            await engine.generate(engine.handle([5]), Sampling(choices=("yes", "no")))
    async with ScriptedEngine(script=["one, two. three"]) as engine:
        r = await engine.generate(engine.handle([5]), Sampling(stop=(".",)))
        assert (r.text, r.finish_reason) == ("one, two.", "stop")


@pytest.mark.anyio
@given(seed=st.integers(0, 2**32), text=chat_texts())
@settings(max_examples=20, deadline=None)
async def test_seeded_outputs_are_deterministic(seed: int, text: str) -> None:
    outs = []
    for _ in range(2):
        async with ScriptedEngine(seed=seed) as engine:
            p = engine.chat.prompt([{"role": "user", "content": text}])
            outs.append((await engine.generate(p, Sampling(max_tokens=64))).text)
    assert outs[0] == outs[1]


@pytest.mark.anyio
async def test_sampled_voters_differ_but_seeded_requests_repeat() -> None:
    async with ScriptedEngine() as engine:
        p = engine.chat.prompt([{"role": "user", "content": "vote"}])
        voters = {(await engine.generate(p, Sampling(temperature=0.9))).text for _ in range(5)}
        assert len(voters) > 1
        seeded = {
            (await engine.generate(p, Sampling(temperature=0.9, seed=7))).text for _ in range(3)
        }
        assert len(seeded) == 1


def test_toy_tokenizer_is_reversible() -> None:
    @given(st.text(max_size=60))
    @settings(max_examples=200)
    def roundtrip(text: str) -> None:
        tok = ToyTokenizer()
        assert tok.decode(tok.encode(text)) == text

    roundtrip()
    tok = ToyTokenizer()
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == tok.token_id("<|im_start|>")


# --- refusals and failures ---------------------------------------------------------------


@pytest.mark.anyio
async def test_refuses_when_closed_or_too_large() -> None:
    engine = ScriptedEngine(block_size=4, num_blocks=4)
    with pytest.raises(EngineUnavailable):
        engine.stream(engine.handle([1, 2]), Sampling())
    async with engine:
        with pytest.raises(RequestRefused) as info:
            engine.stream(engine.handle(range(20)), Sampling(max_tokens=1))
        assert info.value.field == "prompt"
        with pytest.raises(RequestRefused) as info:
            engine.stream(engine.handle(range(8)), Sampling(max_tokens=16))
        assert info.value.field == "max_tokens"


@pytest.mark.anyio
async def test_kill_fails_in_flight_requests_and_restarts_empty() -> None:
    async with ScriptedEngine(block_size=4, decode_time_per_token=0.001) as engine:
        h = engine.handle(range(20, 40))
        warm = await engine.warm(h)
        assert engine.resident_tokens(h) == 20
        with pytest.raises(EngineDied) as info:
            async with engine.stream(h.extend([1]), Sampling(max_tokens=200)) as gen:
                async for _ in gen:
                    engine.kill("boom")
        assert (info.value.epoch, info.value.cause) == (0, "boom")
        assert gen.result is not None and gen.result.finish_reason == "error"
        assert (engine.epoch, engine.restarts) == (1, 1)
        assert engine.cached_blocks == 0
        again = await engine.generate(warm.handle, Sampling(max_tokens=2))
        assert again.cache_miss and again.cached_tokens == 0
        stats = engine.stats()
        assert (
            stats.requests_failed == 1 and stats.requests_live == 0 and stats.scheduler_running == 0
        )


@pytest.mark.anyio
async def test_fail_next_kills_on_the_next_request() -> None:
    async with ScriptedEngine() as engine:
        engine.fail_next(RuntimeError("CPU Generator does not use offset"))
        with pytest.raises(EngineDied) as info:
            await engine.generate(engine.handle([1, 2, 3]), Sampling())
        assert isinstance(info.value.cause, RuntimeError)
        assert engine.epoch == 1
        ok = await engine.generate(engine.handle([1, 2, 3]), Sampling())
        assert ok.finish_reason == "stop"


def test_latency_is_virtual_under_mock_clock() -> None:
    async def main() -> float:
        async with ScriptedEngine(
            prefill_time_per_token=0.5, decode_time_per_token=1.0, script=[list(range(20, 120))]
        ) as engine:
            start = trio.current_time()
            result = await engine.generate(engine.handle(range(10)), Sampling(max_tokens=500))
            assert len(result.output_ids) == 101
            assert result.timings.total >= 0
            return trio.current_time() - start

    elapsed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert elapsed == pytest.approx(10 * 0.5 + 100 * 1.0)


def _timed_requests(
    cost: StepCost, prompts: list[int], max_tokens: int, **engine: int
) -> tuple[list[float], int, float]:
    """Run one request per prompt length at once under ``cost`` in virtual time: each one's
    seconds to finish, the steps the clock ran, and its busy time."""

    async def main() -> tuple[list[float], int, float]:
        elapsed: list[float] = [0.0] * len(prompts)
        async with ScriptedEngine(
            cost=cost, script=[list(range(20, 20 + max_tokens))], **engine
        ) as engine_:

            async def one(i: int, n: int) -> None:
                start = trio.current_time()
                result = await engine_.generate(
                    engine_.handle([100 + i] * n), Sampling(max_tokens=max_tokens, temperature=0.0)
                )
                assert len(result.output_ids) == max_tokens
                elapsed[i] = trio.current_time() - start

            async with trio.open_nursery() as nursery:
                for i, n in enumerate(prompts):
                    nursery.start_soon(one, i, n)
            assert engine_.steps is not None
            return elapsed, engine_.steps.steps, engine_.steps.busy

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_step_costs_its_base_its_prefill_tokens_and_its_decode_batch() -> None:
    """Under a ``StepCost`` requests share batched steps: alone, a 10-token prompt and
    20 tokens take one prefill step (base + 10 x prefill) and 19 decode steps
    (base + 1 x decode); four at once share every step, so each takes what the whole
    batch takes: one prefill step of 40 tokens and 19 steps of four decodes."""
    cost = StepCost(base=0.5, prefill_token=0.01, decode_seq=0.25)
    alone, steps, busy = _timed_requests(cost, [10], 20)
    assert alone == [pytest.approx(0.5 + 0.1 + 19 * 0.75)] and steps == 20
    assert busy == pytest.approx(alone[0])
    four, steps, _ = _timed_requests(cost, [10] * 4, 20)
    assert four == [pytest.approx(0.5 + 0.4 + 19 * (0.5 + 4 * 0.25))] * 4 and steps == 20


def test_a_long_prefill_is_chunked_by_the_token_budget_and_delays_the_decodes_beside_it() -> None:
    """A 100-token prompt under a 40-token budget takes three steps (40, 40, 20); a short
    request decoding beside it gets one token of each step's budget, so the long
    prompt's chunks are 39, 39 and 22 and every decode step beside them is slower."""
    cost = StepCost(base=0.0, prefill_token=0.01, decode_seq=0.1, max_batched_tokens=40)
    alone, steps, _ = _timed_requests(cost, [100], 1)
    assert alone == [pytest.approx(1.0)] and steps == 3
    short_alone, _, _ = _timed_requests(cost, [4], 6)
    both, steps, busy = _timed_requests(cost, [4, 100], 6)
    assert both[0] > short_alone[0] and both[1] > alone[0] + 5 * 0.1
    # every prompt token is computed once, every decode once: the busy time is the work
    assert busy == pytest.approx(0.01 * 104 + 0.1 * 10)
    with pytest.raises(ValueError, match="finite and >= 0"):
        StepCost(base=-1.0, prefill_token=0.0, decode_seq=0.0)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        StepCost(base=0.0, prefill_token=0.0, decode_seq=0.0, max_batched_tokens=0)
    with pytest.raises(ValueError, match="not both"):
        ScriptedEngine(cost=cost, decode_time_per_token=1.0)


def test_an_aborted_request_leaves_the_steps_running_for_the_others() -> None:
    """The request leading a step is aborted mid-step: the step still ends, the others
    finish, and the aborted one computes nothing more."""

    async def main() -> tuple[str, int]:
        cost = StepCost(base=1.0, prefill_token=0.0, decode_seq=0.0)
        async with ScriptedEngine(cost=cost, script=[list(range(20, 30))]) as engine:
            done: list[int] = []

            async def other() -> None:
                result = await engine.generate(engine.handle([7] * 5), Sampling(max_tokens=10))
                done.append(result.completion_tokens)

            async with (
                trio.open_nursery() as nursery,
                engine.stream(engine.handle([3] * 5), Sampling(max_tokens=10)) as gen,
            ):
                nursery.start_soon(other)
                async for delta in gen:
                    if delta.token_ids:
                        await engine.abort(gen.request_id)
            assert gen.result is not None
            return gen.result.finish_reason, done[0]

    finish, other_tokens = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert finish == "abort" and other_tokens == 10


# -- differential: the same request trace on the ScriptedEngine and on real vLLM ------------


@attrs.frozen
class TraceStep:
    """One request of the trace: ``base`` + ``suffix`` token ids.

    ``base`` is ``"root:N"`` (the first N ids of the root context, all if N is 0),
    ``"prompt:i"`` / ``"handle:i"`` (the prompt / prompt + output of step i).
    """

    name: str
    base: str
    suffix: tuple[int, ...] = ()
    adapter: str | None = None
    retain: str | None = None
    release: bool = False  # release every retention of the trace after this step


def _trace(bridge: Any) -> tuple[tuple[int, ...], list[TraceStep]]:
    """A root context (unique to this run) and the steps: prefixes, forks, adapters, retention."""
    from _engine import _context, _fork

    bs = bridge.block_size

    def question(ctx: KVHandle, text: str) -> tuple[int, ...]:
        return _fork(bridge, ctx, text).since(ctx)

    # the first fork ends 3..6 tokens short of a block: its output fills that block,
    # so a follow-up hits a block computed while decoding
    ctx = _context(
        bridge, 300, lambda c: len(_fork(bridge, c, "What happened first?")) % bs in range(122, 126)
    )
    a = question(ctx, "What happened first?")
    b = question(ctx, "Is anything wrong? Answer yes or no.")
    c = question(ctx, "Name one word of the log.")
    follow = question(ctx, "Why?")
    steps = [
        TraceStep("cold context", "root:0"),
        TraceStep("fork a", "root:0", a),
        TraceStep("fork b", "root:0", b),
        TraceStep("follow-up on a's answer", "handle:1", follow),
        TraceStep("fork a again (the same prompt)", "prompt:1"),
        TraceStep("fork a under lora-a", "prompt:1", adapter="lora-a"),
        TraceStep("fork a under lora-a again", "prompt:1", adapter="lora-a"),
        TraceStep("fork b under lora-b", "prompt:2", adapter="lora-b"),
        TraceStep("two whole blocks of the context", f"root:{2 * bs}"),
        TraceStep("under one block", f"root:{bs - 1}"),
        TraceStep("fork c, retained", "root:0", c, retain="diff/c"),
        TraceStep("on c's answer, then release", "handle:10", follow, release=True),
        TraceStep("on c's answer again, released", "handle:10", follow),
    ]
    return tuple(ctx.token_ids), steps


async def _run_trace(
    engine: Any, root: tuple[int, ...], steps: list[TraceStep], sampling: Sampling
) -> list[tuple[GenerationResult, tuple[int, int]]]:
    """Run ``steps`` one after another on ``engine``; each result with the retention stats.

    The stats are (entries, retained blocks) beyond what the engine held before the trace.
    """
    before = await engine.retention_stats()
    out: list[tuple[GenerationResult, tuple[int, int]]] = []
    for step in steps:
        kind, _, arg = step.base.partition(":")
        if kind == "root":
            n = int(arg)
            base = engine.handle(root[:n] if n else root)
        else:
            result = out[int(arg)][0]
            base = result.prompt if kind == "prompt" else result.handle
        prompt = base.extend(step.suffix).with_adapter(engine.resolve_adapter(step.adapter))
        retain = Retain(step.retain) if step.retain else None
        result = await engine.generate(prompt, sampling, retain=retain)
        now = await engine.retention_stats()
        stats = (now.entries - before.entries, now.retained_blocks - before.retained_blocks)
        if step.release:
            await engine.release(prefix="diff/")
        out.append((result, stats))
    return out


def _expected_cached(prompt: KVHandle, cached_prefix: int, bs: int) -> int:
    """vLLM's rule: whole blocks of the cached prefix, never the last prompt token."""
    return min(cached_prefix, len(prompt) - 1) // bs * bs


@pytest.mark.engine
def test_scripted_engine_caches_like_vllm_on_the_same_trace(real_engine: Any) -> None:
    """Request by request, cached and computed prompt tokens agree with the real engine.

    The trace is sequential (no concurrent prefill to share) and unique to this run
    (a nonce in the first block), so the real cache's state is determined by the
    trace alone. The ScriptedEngine gets the real engine's geometry (block size,
    number of blocks, retention fraction) and, as its script, the real outputs, so
    that every later prompt holds the same tokens on both.
    """
    bridge = real_engine.bridge
    bs = bridge.block_size
    root, steps = _trace(bridge)
    sampling = Sampling(max_tokens=8, temperature=0.0)
    real = real_engine.call(_run_trace, bridge, root, steps, sampling)
    real_engine.assert_idle()

    outputs = iter([(r.output_ids, r.finish_reason) for r, _ in real])

    def replay(_prompt: tuple[int, ...], request: EngineRequest) -> list[int]:
        ids, finish = next(outputs)
        # vLLM ends a stopped output with its end-of-turn id; the double appends its own
        return list(ids[:-1] if finish == "stop" else ids)

    capacity = bridge.stats().kv_cache_capacity_tokens
    scripted = ScriptedEngine(
        bridge.model,
        script=replay,
        block_size=bs,
        num_blocks=capacity // bs,
        retention_budget=bridge.retention,
    )
    for name, path in bridge.adapters.items():
        scripted.register_adapter(name, path.path)

    async def on_scripted() -> list[tuple[GenerationResult, tuple[int, int]]]:
        async with scripted:
            return await _run_trace(scripted, root, steps, sampling)

    double = anyio.run(on_scripted)

    rows = []
    for step, (r, r_stats), (d, d_stats) in zip(steps, real, double, strict=True):
        rows.append(
            f"{step.name:36} prompt {r.prompt_tokens:4} cached {r.cached_tokens:4}/"
            f"{d.cached_tokens:4} out {r.completion_tokens}/{d.completion_tokens}"
        )
        assert d.prompt.token_ids[: len(r.prompt) - 1] == r.prompt.token_ids[: len(r.prompt) - 1]
        assert (d.prompt_tokens, d.completion_tokens, d.finish_reason) == (
            r.prompt_tokens,
            r.completion_tokens,
            r.finish_reason,
        ), step
        assert (d.cached_tokens, d.computed_tokens) == (r.cached_tokens, r.computed_tokens), (
            step,
            rows,
        )
        assert (d.expected_cached_tokens, d.cache_miss) == (
            r.expected_cached_tokens,
            r.cache_miss,
        ), step
        assert r.cached_tokens % bs == 0 and r.computed_tokens >= 1
        assert d_stats == r_stats, (step, r_stats, d_stats)  # retention entries and blocks
    print("\n".join(rows))
    # the trace reaches what it means to: hits on a fork, on decoded blocks, a whole-block
    # prompt recomputing its last block, adapters apart, a retention that held blocks
    got = {step.name: r for step, (r, _) in zip(steps, real, strict=True)}
    assert got["cold context"].cached_tokens == 0
    assert got["fork a"].cached_tokens == _expected_cached(got["fork a"].prompt, len(root), bs)
    follow = got["follow-up on a's answer"]
    decoded = len(got["fork a"].handle) - 1  # the last sampled token is never computed
    assert follow.cached_tokens == _expected_cached(follow.prompt, decoded, bs)
    assert got["fork a under lora-a"].cached_tokens == 0
    assert (
        got["fork a under lora-a again"].cached_tokens
        == got["fork a again (the same prompt)"].cached_tokens
    )
    assert got["two whole blocks of the context"].cached_tokens == bs
    assert got["under one block"].cached_tokens == 0
    assert real[10][1][0] == 1 and real[10][1][1] > 0  # the retention held blocks
    assert real[12][1] == (0, 0)  # and was released


@pytest.mark.anyio
async def test_a_long_run_keeps_a_bounded_history_and_no_prompt_alive() -> None:
    import gc
    import tracemalloc

    async with ScriptedEngine(block_size=4, history_limit=8) as engine:

        async def run(start: int) -> None:
            for i in range(start, start + 100):
                prompt = engine.handle(range(1000 + i, 3000 + i))  # 2 000 tokens of its own
                result = await engine.generate(prompt, Sampling(max_tokens=4))
                follow = await engine.warm(result.handle.extend([7]))
                assert not follow.cache_miss  # the resident record still knows the prefix

        await run(0)  # the bounded caches fill (the double's blocks, the resident record)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await run(100)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 8 <= len(engine.history) <= 16
        # keeping the token ids of its record of resident prefixes (4 per step) would be
        # ~6 MB here: the bridge keys that record by a hash
        assert grown < 3_000_000, grown
