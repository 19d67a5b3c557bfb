"""The pure parts of bench/load.py: arrivals, contexts, the tables and the BENCHMARKS.md section.

No engine: the benchmark itself is run by hand on a quiet machine (see BENCHMARKS.md).
"""

from __future__ import annotations

import _load_report as R
import load as L
import pytest
from _load_accounting import RequestRecord, prefill


def run(system: str, rate: float, rep: int, p95: float, recomputed: int) -> dict[str, object]:
    return {
        "system": system,
        "rate_per_min": rate,
        "rep": rep,
        "loadavg_before": 0.1,
        "completed": 9,
        "failed": 0,
        "per_min": 5.0,
        "p50_s": p95 / 2,
        "p95_s": p95,
        "p99_s": p95,
        "computed_tokens": 1000,
        "reusable_tokens": 900,
        "recomputed_tokens": recomputed,
        "retained_hit_tokens": 0,
        "preemptions": 0,
    }


DATA = {
    "settings": {
        "collaborations_per_run": 9,
        "mix": ["vote5-reason"],
        "reps": 2,
        "kv_blocks": 40,
        "block_tokens": 128,
        "context_words": 700,
    },
    "machine": {"cpus": 2, "loadavg_at_start": 0.2, "seconds": 10},
    "runs": [
        run("microagent", 6, 0, 4.0, 100),
        run("microagent", 6, 1, 6.0, 300),
        run("ablation", 6, 0, 10.0, 800),
        run("ablation", 6, 1, 10.0, 800),
    ],
}


def test_arrivals_are_poisson_and_reproducible() -> None:
    a = L.arrivals(2.0, 500, seed=3)
    assert a == L.arrivals(2.0, 500, seed=3) and a == sorted(a)
    mean_gap = a[-1] / len(a)
    assert 0.4 < mean_gap < 0.6  # rate 2/s


def test_contexts_are_unique_per_seed() -> None:
    assert L.context_text(1, 50) != L.context_text(2, 50)
    assert L.context_text(1, 50) == L.context_text(1, 50)


def test_tables_take_medians_and_ratios_from_the_json() -> None:
    text = R.tables(DATA)
    assert "| 6 | microagent | 18 (0) | 5.00 | 2.5 | 5.0 | 5.0 | 1000 | 900 | 200 |" in text
    assert "| 6 | 0.50× | 0.50× | 1.00× | 0.25× |" in text  # against the ablation


def client_curve() -> dict[str, object]:
    """The client: p95 5 s unloaded, 9 s at 12/min (<= 2x), 30 s at 24/min (past it)."""
    runs = []
    for rate, p95, rec, ours_p95, ours_rec in (
        (6, 5.0, 100, 4.0, 50),
        (12, 9.0, 1000, 5.0, 300),
        (24, 30.0, 4000, 9.0, 900),
    ):
        for system, p, r, per_min in (
            ("client", p95, rec, rate * 0.9),
            ("microagent", ours_p95, ours_rec, rate * 0.95),
        ):
            row = run(system, rate, 0, p, r)
            row["per_min"] = per_min
            runs.append(row)
    return {**DATA, "runs": runs}


def test_targets_are_read_at_the_clients_loaded_point() -> None:
    rows = R.medians(client_curve())
    assert R.loaded_point(rows, "client") == 12  # 9 s <= 2 x 5 s; 30 s is past it
    # microagent reaches the client's 9 s p95 at 24/min: 22.8 / 10.8 = 2.11x the throughput
    assert R.throughput_at_p95(rows, "microagent", 9.0) == 24 * 0.95
    goals = R.targets(rows)
    assert [g["met"] for g in goals] == [True, True]
    assert abs(goals[0]["measured"] - 24 * 0.95 / (12 * 0.9)) < 1e-9
    assert goals[1]["measured"] == 0.3
    text = R.tables(client_curve())
    assert "| 12 | 0.56× | 0.56× | 1.00× | 0.30× |" in text  # against the client
    assert "2.11× the throughput" in text


def test_throughput_at_a_p95_interpolates_between_rates() -> None:
    rows = R.medians(client_curve())
    # microagent: (5.7/min, 4 s), (11.4/min, 5 s): 4.5 s is half way
    assert abs(R.throughput_at_p95(rows, "microagent", 4.5) - (5.7 + 11.4) / 2) < 1e-9  # type: ignore[operator]


def rec(at: float, done: float, prompt: list[int], out: list[int], cached: int) -> RequestRecord:
    return RequestRecord(at, done, tuple(prompt), tuple(out), cached)


def test_recomputed_counts_only_what_an_earlier_request_had_computed() -> None:
    ctx = list(range(300))  # two whole blocks of 128 + 44
    first = rec(0, 1, ctx, [1000, 1001], 0)  # nothing before it: nothing reusable
    second = rec(2, 3, [*ctx, 7, 8], [5], 256)  # both blocks hit
    third = rec(4, 5, [*ctx, 9], [5], 128)  # one block was evicted in between
    scored = prefill([third, first, second])  # order of the records is irrelevant
    assert scored.prompt_tokens == 300 + 302 + 301
    assert scored.computed_tokens == 300 + (302 - 256) + (301 - 128)
    assert scored.reusable_tokens == 0 + 256 + 256
    assert scored.recomputed_tokens == 128


def test_an_output_and_a_prompt_count_only_once_their_request_finished() -> None:
    ctx = list(range(100))
    out = list(range(1000, 1200))
    thread = [*ctx, *out[:-1]]  # 299 tokens: two whole blocks
    running = rec(0, 10, ctx, out, 0)
    during = rec(5, 6, [*thread, 1], [], 0)  # submitted before the output existed
    after = rec(11, 12, [*thread, 1], [], 0)
    assert prefill([running, during]).reusable_tokens == 0  # 100 shared: no whole block
    assert prefill([running, after]).reusable_tokens == 256
    assert prefill([running, after]).recomputed_tokens == 256
    twin = rec(1, 10, [*ctx, *ctx, 5], [], 0)  # concurrent cold twins: duplicated, not evicted
    assert prefill([rec(0, 10, [*ctx, *ctx, 4], [], 0), twin]).recomputed_tokens == 0


def test_a_supplementary_run_adds_its_rates_and_says_so() -> None:
    more = {
        "settings": {**DATA["settings"], "rates_per_min": [12], "systems": ["client"], "reps": 1},
        "machine": {"cpus": 2, "loadavg_at_start": 0.3, "seconds": 5},
        "runs": [run("client", 12, 0, 7.0, 10)],
    }
    first = {**DATA, "settings": {**DATA["settings"], "rates_per_min": [6]}}
    merged = R.merge(first, more)
    assert merged["settings"]["rates_per_min"] == [6, 12] and len(merged["runs"]) == 5
    assert "Supplementary run (`--append`) at 12/min, client, 1 repetition(s)" in R.tables(merged)
    other_cache = {**more, "settings": {**more["settings"], "kv_blocks": 80}}
    with pytest.raises(ValueError, match="same engine settings"):
        R.merge(first, other_cache)


def test_a_target_nobody_was_tested_on_is_not_counted_as_met() -> None:
    data = client_curve()
    for row in data["runs"]:  # type: ignore[union-attr]
        row["recomputed_tokens"] = 0
    goals = R.targets(R.medians(data))
    assert goals[1]["met"] is None and "not a test" in goals[1]["text"]
    assert "| n/a |" in R.tables(data)


def test_a_peer_that_runs_the_whole_schedule_is_scored_like_the_others() -> None:
    """The LangGraph path: the peer reports latencies, failures and records; run_config
    scores them with the same function as every other system."""
    import asyncio

    ctx = list(range(300))

    class Peer:
        async def mark(self) -> dict[str, object]:
            return {}

        async def run_schedule(self, schedule: list[tuple[float, str, str]]) -> dict[str, object]:
            assert [kind for _, kind, _ in schedule] == ["vote5-reason", "debate3x2"]
            return {"latencies": [2.0, 4.0], "failures": ["ConnectionError: x"], "wall": 6.0}

        async def measure(self, mark: dict[str, object]) -> dict[str, object]:
            records = [rec(0, 1, ctx, [1], 0), rec(2, 3, [*ctx, 5], [1], 128)]
            return {"records": records, "preemptions": 0, "retained_hit_tokens": 0, "released": {}}

    schedule = [(0.0, "vote5-reason", "a"), (1.0, "debate3x2", "b")]
    result = asyncio.run(L.run_config(Peer(), schedule))
    assert result["completed"] == 2 and result["failed"] == 1 and result["per_min"] == 20.0
    assert result["recomputed_tokens"] == 128 and result["computed_tokens"] == 300 + 301 - 128


def test_the_recording_caller_keeps_token_ids_cached_tokens_and_timings() -> None:
    """What the client and LangGraph systems are scored from, read off vLLM's response."""
    import asyncio
    from types import SimpleNamespace

    import _collab_client as C

    sent: list[dict[str, object]] = []

    class Completions:
        async def create(self, **kwargs: object) -> object:
            sent.append(kwargs)
            body = {
                "prompt_token_ids": [1, 2, 3],
                "choices": [{"token_ids": [7, 8], "message": {"content": "yes"}}],
                "usage": {"prompt_tokens_details": {"cached_tokens": 2}},
            }
            return SimpleNamespace(
                model_dump=lambda: body,
                usage=SimpleNamespace(prompt_tokens=3, completion_tokens=2),
                choices=[SimpleNamespace(message=SimpleNamespace(content="yes"))],
            )

    client = SimpleNamespace(chat=SimpleNamespace(completions=Completions()))
    caller = C.RecordingCaller(client, "bench")
    text = asyncio.run(
        caller.call(
            [{"role": "user", "content": "q"}], max_tokens=4, temperature=0.0, choices=["yes", "no"]
        )
    )
    assert text == "yes"
    assert sent[0]["extra_body"] == {
        "return_token_ids": True,
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    (record,) = caller.records
    assert (record.prompt, record.output, record.cached) == ((1, 2, 3), (7, 8), 2)
    assert record.submitted <= record.finished and caller.requests[0]["prompt_tokens"] == 3
    plain = C.Caller(client, "bench")
    asyncio.run(plain.call([{"role": "user", "content": "q"}], max_tokens=4, temperature=0.0))
    assert sent[1]["extra_body"] is None  # the plain client sends nothing extra


def test_the_client_runs_every_load_workload_with_one_call_per_role() -> None:
    """The client side of the load mix, on a fake SDK call: the calls each role makes."""
    import asyncio

    import _collab_client as C

    class Fake:
        def __init__(self) -> None:
            self.calls = 0

        async def call(self, messages: list[object], **kwargs: object) -> str:
            self.calls += 1
            return "Answer: yes"

    expected = {"vote5-reason": 10, "debate3x2": 6, "aggregate3+1": 4}  # reason + answer each
    for kind, calls in expected.items():
        fake = Fake()
        asyncio.run(C.run_workload(fake, {**L.WORKLOADS[kind], **L.COMMON}, "ctx", L.CHOICES))  # type: ignore[arg-type]
        assert fake.calls == calls, kind
