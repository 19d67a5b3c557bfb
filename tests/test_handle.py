"""KVHandle identity and lineage; EngineBridge base behaviour through the ScriptedEngine."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from microagent.engine_bridge import (
    AdapterRef,
    EngineDied,
    HandleMismatch,
    KVHandle,
    Sampling,
    TokenDelta,
)
from microagent.testing import ScriptedEngine
from strategies import token_lists

# --- KVHandle ------------------------------------------------------------------------------


def test_identity_is_tokens_model_adapter_epoch() -> None:
    a = KVHandle((1, 2), model="m")
    assert a == KVHandle(
        [1, 2], model="m", parent=KVHandle((9,), model="m")
    )  # lineage is not identity
    assert hash(a) == hash(KVHandle((1, 2), model="m"))
    assert a != KVHandle((1, 2), model="other")
    assert a != a.with_adapter(AdapterRef("x", "/x"))
    assert a.with_adapter(AdapterRef("x", "/x")) != a.with_adapter(AdapterRef("x", "/y"))
    assert a != a.with_epoch(1)
    assert a != (1, 2)


@given(base=token_lists(min_size=1), more=token_lists(), again=token_lists())
@settings(max_examples=100)
def test_extend_since_and_segment(base: list[int], more: list[int], again: list[int]) -> None:
    root = KVHandle(base, model="m")
    child = root.extend(more)
    grandchild = child.extend(KVHandle(again, model="m"))
    assert grandchild.parent is child and child.parent is root
    assert grandchild.lineage() == [grandchild, child, root]
    assert root.is_prefix_of(grandchild) and child.is_prefix_of(grandchild.token_ids)
    assert child.since(root) == tuple(more)
    assert grandchild.since(None) == grandchild.token_ids
    seg = grandchild.segment(child)
    assert seg.token_ids == tuple(again) and seg.parent is None and seg.model == "m"
    assert len(grandchild) == len(base) + len(more) + len(again)


def test_mismatches_are_typed() -> None:
    a = KVHandle((1, 2, 3), model="m")
    with pytest.raises(HandleMismatch, match="re-tokenize"):
        a.extend(KVHandle((4,), model="other"))
    with pytest.raises(HandleMismatch, match="not a prefix"):
        a.since(KVHandle((2,), model="m"))
    with pytest.raises(HandleMismatch, match="no decoder"):
        _ = a.text


def test_text_is_decoded_lazily_once() -> None:
    calls: list[tuple[int, ...]] = []

    def decode(ids: object) -> str:
        calls.append(tuple(ids))  # type: ignore[arg-type]
        return "text"

    h = KVHandle((1, 2), model="m", decoder=decode)
    assert calls == []
    assert h.text == "text" and h.text == "text"
    assert calls == [(1, 2)]
    assert "2 tokens" in repr(h)


# --- EngineBridge base behaviour --------------------------------------------------------------


def _engine(**kwargs: object) -> ScriptedEngine:
    return ScriptedEngine(block_size=4, **kwargs)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_cancelling_the_consumer_aborts_the_request() -> None:
    async with _engine(decode_time_per_token=0.001) as engine:
        got_first = anyio.Event()
        seen: list[TokenDelta] = []

        async def consume() -> None:
            async def on_delta(delta: TokenDelta) -> None:
                seen.append(delta)
                got_first.set()

            await engine.generate(
                engine.handle(range(10, 30)), Sampling(max_tokens=500), on_delta=on_delta
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await got_first.wait()
            assert engine.stats().scheduler_running == 1
            tg.cancel_scope.cancel()
        assert seen
        assert engine.live_requests() == frozenset()
        stats = engine.stats()
        assert (stats.requests_aborted, stats.requests_live, stats.scheduler_running) == (1, 0, 0)
        assert await engine.wait_idle(timeout=1)


@pytest.mark.anyio
async def test_break_out_of_the_stream_aborts() -> None:
    async with _engine(script=["one two three four five six"]) as engine:
        async with engine.stream(engine.handle([5, 6, 7]), Sampling()) as gen:
            async for _ in gen:
                break
        assert gen.result is not None
        assert gen.result.finish_reason == "abort" and len(gen.result.output_ids) == 1
        assert engine.live_requests() == frozenset() and engine.stats().scheduler_running == 0
        assert engine.stats().requests_aborted == 1


@pytest.mark.anyio
async def test_abort_by_id_from_another_task() -> None:
    async with _engine(decode_time_per_token=0.001) as engine:
        async with engine.stream(engine.handle([5, 6, 7]), Sampling(max_tokens=400)) as gen:
            first = True
            async for _ in gen:
                if first:
                    first = False
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(engine.abort, gen.request_id)
            assert gen.result is not None and gen.result.finish_reason == "abort"
        assert await engine.abort(gen.request_id) is False  # no longer live
        assert engine.stats().scheduler_running == 0


@pytest.mark.anyio
async def test_a_hung_request_is_cleaned_up_on_timeout() -> None:
    async with _engine(prefill_time_per_token=999.0) as engine:
        with anyio.move_on_after(0.05):
            await engine.generate(engine.handle(range(10, 20)), Sampling())
        assert engine.live_requests() == frozenset()
        assert engine.stats().scheduler_running == 0
        assert await engine.wait_idle(timeout=1)


@pytest.mark.anyio
async def test_wait_idle_waits_for_live_requests() -> None:
    async with _engine(prefill_time_per_token=999.0) as engine:
        async with engine.stream(engine.handle(range(10, 20)), Sampling()) as gen:
            assert await engine.wait_idle(timeout=0.05) is False
            await engine.abort(gen.request_id)
        assert await engine.wait_idle(timeout=1) is True


@pytest.mark.anyio
async def test_evicted_handle_is_a_detected_miss_and_still_works() -> None:
    async with _engine(num_blocks=8) as engine:
        context = engine.handle(range(100, 120))
        first = await engine.generate(context, Sampling(max_tokens=4))
        fork = first.handle.extend([7, 8])
        assert engine.resident_tokens(first.handle) >= 20
        for i in range(4):  # fill the pool with other prompts
            await engine.warm(engine.handle([200 + i] * 20))
        assert engine.resident_tokens(first.handle) == 0
        again = await engine.generate(fork, Sampling(max_tokens=4))
        assert again.cache_miss and again.cached_tokens < again.expected_cached_tokens
        assert again.finish_reason in ("stop", "length") and fork.is_prefix_of(again.handle)
        assert engine.stats().cache_misses == 1
        rewarmed = await engine.generate(fork, Sampling(max_tokens=4))
        assert (
            not rewarmed.cache_miss
            and rewarmed.cached_tokens == rewarmed.expected_cached_tokens > 0
        )


@pytest.mark.anyio
async def test_old_epoch_handles_work_after_a_kill_and_first_use_is_a_miss() -> None:
    async with _engine() as engine:
        before = await engine.generate(engine.handle(range(10, 40)), Sampling(max_tokens=3))
        assert before.handle.epoch == 0
        engine.kill("test kill")
        assert engine.epoch == 1
        after = await engine.generate(before.handle.extend([1, 2]), Sampling(max_tokens=3))
        assert after.cache_miss and after.cached_tokens == 0
        assert after.handle.epoch == 1
        second = await engine.generate(after.handle.extend([3]), Sampling(max_tokens=3))
        assert not second.cache_miss and second.cached_tokens > 0
        stats = engine.stats()
        assert (stats.epoch, stats.restarts, stats.cache_misses) == (1, 1, 1)


@pytest.mark.anyio
async def test_engine_death_reaches_every_in_flight_request() -> None:
    async with _engine(decode_time_per_token=0.001) as engine:
        errors: list[EngineDied] = []
        started = 0
        all_started = anyio.Event()

        async def run(i: int) -> None:
            nonlocal started
            try:
                async with engine.stream(engine.handle([i, 1, 2]), Sampling(max_tokens=400)) as gen:
                    async for _ in gen:
                        started += 1
                        if started == 3:
                            all_started.set()
            except EngineDied as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(run, 20 + i)
            await all_started.wait()
            engine.kill("oom")
        assert len(errors) == 3 and all(e.epoch == 0 for e in errors)
        stats = engine.stats()
        assert (stats.requests_failed, stats.requests_live, stats.scheduler_running) == (3, 0, 0)


@pytest.mark.anyio
async def test_chat_attribute_and_request_ids() -> None:
    async with _engine() as engine:
        prompt = engine.chat.prompt([{"role": "user", "content": "hi"}])
        result = await engine.generate(prompt, Sampling(max_tokens=5), request_id="r1", priority=-1)
        assert result.request_id == "r1" and result.priority == -1
        assert engine.history[-1].request_id == "r1"
        assert result.prompt == prompt and result.handle.parent == prompt
        assert result.output.token_ids == result.output_ids


def test_common_prefix_length_counts_the_shared_leading_tokens() -> None:
    a = KVHandle((1, 2, 3, 4), model="m")
    assert a.common_prefix_length(KVHandle((1, 2, 9), model="m")) == 2
    assert a.common_prefix_length([1, 2, 3, 4, 5]) == 4
    assert a.common_prefix_length(()) == 0 and a.common_prefix_length([7]) == 0
