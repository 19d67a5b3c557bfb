"""Resume journals: a rerun after an engine death keeps what the first run generated.

Inside one ``resume_journal``, an engine request equal to one of an earlier run is
answered from its record when that had finished (no engine request), and continues
from its tokens when it had generated some (the engine sees the prompt with them
appended and the rest of ``max_tokens``); constrained sampling starts over. Over
HTTP, the rerun of a collaboration killed mid-generation keeps its tokens.
"""

from __future__ import annotations

import anyio
import httpx
import pytest
from microagent.engine_bridge import (
    EngineDied,
    GenerationResult,
    KVHandle,
    Sampling,
    resume_journal,
)
from microagent.server import create_app
from microagent.testing import ScriptedEngine
from test_server_faults import VOTE, killed_while, metric_lines
from test_server_helpers import eventually

pytestmark = pytest.mark.anyio


async def killed_after(
    engine: ScriptedEngine, prompt: KVHandle, sampling: Sampling, tokens: int
) -> tuple[int, ...]:
    """Generate until ``tokens`` tokens came, then kill the engine; the tokens seen."""
    seen: list[int] = []
    with pytest.raises(EngineDied):
        async with engine.stream(prompt, sampling) as gen:
            async for delta in gen:
                seen.extend(delta.token_ids)
                if len(seen) >= tokens:
                    engine.kill("killed by the test")
    return tuple(seen)


async def test_a_rerun_continues_a_partial_generation_from_its_tokens(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    async with ScriptedEngine(reply_words=(60, 60)) as engine:
        prompt = engine.handle(range(10, 90))
        sampling = Sampling(max_tokens=48, temperature=0.7)
        with resume_journal() as journal:
            partial = await killed_after(engine, prompt, sampling, 20)
            journal.new_run()
            before = len(engine.history)
            result = await engine.generate(prompt, sampling)
        sent = engine.history[before:]
    assert len(partial) >= 20
    assert len(sent) == 1  # one engine request: the continuation
    assert sent[0].prompt.token_ids == prompt.token_ids + partial
    assert sent[0].sampling.max_tokens == 48 - len(partial)
    assert result.prompt.token_ids == prompt.token_ids  # the caller's own request
    assert result.output_ids[: len(partial)] == partial
    assert result.completion_tokens == 48 and result.finish_reason == "length"
    assert result.handle.token_ids == prompt.token_ids + result.output_ids
    assert result.cached_tokens <= len(prompt)
    assert (journal.resumed, journal.replayed, journal.tokens_kept) == (1, 0, len(partial))


async def test_a_finished_generation_is_replayed_without_an_engine_request(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    async with ScriptedEngine(reply_words=(5, 8)) as engine:
        prompt = engine.handle(range(10, 60))
        sampling = Sampling(max_tokens=64, temperature=0.7)
        other = engine.handle(range(100, 150))
        with resume_journal() as journal:
            first = await engine.generate(prompt, sampling)
            await killed_after(engine, other, Sampling(max_tokens=64), 1)
            journal.new_run()
            before = len(engine.history)
            again = await engine.generate(prompt, sampling)
            twice = await engine.generate(prompt, sampling)  # not in the first run: generated
        sent = engine.history[before:]
    assert again.output_ids == first.output_ids and again.text == first.text
    assert again.finish_reason == first.finish_reason == "stop"
    assert [r.prompt.token_ids for r in sent] == [prompt.token_ids]  # only ``twice``
    assert twice.request_id == sent[0].request_id
    assert (journal.replayed, journal.resumed) == (1, 0)


async def test_constrained_and_unjournaled_generations_start_over(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    async with ScriptedEngine(reply_words=(60, 60)) as engine:
        prompt = engine.handle(range(10, 70))
        free = Sampling(max_tokens=48)
        penalised = Sampling(max_tokens=48, repetition_penalty=1.2)
        with resume_journal() as journal:
            await killed_after(engine, prompt, penalised, 10)
            journal.new_run()
            before = len(engine.history)
            result = await engine.generate(prompt, penalised)
            sent = engine.history[before:]
        assert [(r.prompt.token_ids, r.sampling.max_tokens) for r in sent] == [
            (prompt.token_ids, 48)
        ]
        assert result.completion_tokens == 48
        # outside a journal nothing is recorded: a rerun is a new generation
        await killed_after(engine, prompt, free, 10)
        before = len(engine.history)
        await engine.generate(prompt, free)
        assert engine.history[before].prompt.token_ids == prompt.token_ids
        assert journal.tokens_kept == 0


async def test_equal_requests_of_a_run_each_claim_their_own_record(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    """Three voters with one prompt: each rerun request continues a different record."""
    async with ScriptedEngine(reply_words=(60, 60), decode_time_per_token=0.01) as engine:
        prompt = engine.handle(range(10, 70))
        sampling = Sampling(max_tokens=40, temperature=0.9)
        with resume_journal() as journal:
            partials: list[list[int]] = [[], [], []]

            async def voter(i: int) -> None:
                async with engine.stream(prompt, sampling) as gen:
                    async for delta in gen:
                        partials[i].extend(delta.token_ids)

            with pytest.raises(BaseExceptionGroup):
                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(voter, i)
                    await eventually(lambda: min(len(p) for p in partials) >= 5)
                    engine.kill("killed by the test")
            journal.new_run()
            before = len(engine.history)
            results: list[GenerationResult] = []

            async def again() -> None:
                results.append(await engine.generate(prompt, sampling))

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(again)
            sent = engine.history[before:]
    n = len(prompt)
    assert sorted(r.prompt.token_ids[n:] for r in sent) == sorted(tuple(p) for p in partials)
    for result in results:  # each result is its record's tokens, then the continuation's
        assert any(result.output_ids[: len(p)] == tuple(p) for p in partials)
        assert result.completion_tokens == 40
    assert journal.resumed == 3
    assert journal.tokens_kept == sum(len(p) for p in partials)


async def test_a_collaboration_run_again_over_http_keeps_its_tokens(
    anyio_backend: tuple[str, dict[str, object]],
) -> None:
    engine = ScriptedEngine(decode_time_per_token=0.01, reply_words=(30, 40))
    async with engine:
        app = create_app({"scripted": engine})
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            r = await killed_while(
                c,
                engine,
                VOTE,
                ready=lambda: sum(len(g.output_ids) for g in engine._live.values()) >= 12,
            )
            assert r.status_code == 200, r.text
            text = (await c.get("/metrics")).text
    kept = metric_lines(text, "microagent:engine_resumed_tokens_total")
    assert kept['{kind="collaboration"}'] >= 12
    continued = [
        req
        for req in engine.history
        if req.sampling.max_tokens < VOTE["max_tokens"]  # type: ignore[operator]
    ]
    assert continued  # the rerun's voters continued from their tokens
    assert r.json()["usage"]["completion_tokens"] > 0
