"""bench/agents_sim.py and its token-level traces: the simulator's accounting and policies.

The real-engine probe and calibration are run by hand on a quiet machine; here
the simulator runs on small traces whose computed tokens can be worked out by
hand, and the fit, the cost model and the targets are checked on made-up data.
"""

from __future__ import annotations

import math

import _agents_trace as T
import agents_sim as S
import attrs
import pytest
from microagent.testing import StepCost

COST = StepCost(base=0.01, prefill_token=0.001, decode_seq=0.002, max_batched_tokens=256)
BLOCK = 16


def _program(i: int, arrival: float, task: int = 40) -> T.TraceProgram:
    return T.TraceProgram(
        pid=f"p{i}",
        index=i,
        arrival=arrival,
        task=task,
        results=(20, 20),
        tools=(1.0, 2.0),
        max_tokens=8,
        next_use=1.5,
    )


def test_without_pressure_each_turn_computes_only_what_it_adds_in_whole_blocks() -> None:
    """Two programs sharing a 32-token prefix, on a roomy cache: the first turn computes
    everything but the shared prefix's cached blocks; each later turn hits every full
    block of the turn before (its prompt + output) and computes the rest."""
    prefix = T.ids("prefix", 32)
    programs = [_program(0, 0.0), _program(1, 0.5)]
    for policy in T.POLICIES:
        cell = S.simulate(
            COST, blocks=256, block=BLOCK, max_num_seqs=8, programs=programs,
            policy=policy, prefix=prefix,
        )  # fmt: skip
        assert all(p["ok"] for p in cell["programs"]), cell["programs"]
        for k, record in enumerate(cell["programs"]):
            prompts = [t["prompt"] for t in record["turns"]]
            assert prompts == [72, 72 + 8 + 20, 72 + 2 * (8 + 20)]
            cached = [t["cached"] for t in record["turns"]]
            first = 0 if k == 0 else 32  # the second program finds the shared prefix
            # earlier turns: every full block of prompt + output before the last token
            assert cached == [first, (72 + 8 - 1) // BLOCK * BLOCK, (100 + 8 - 1) // BLOCK * BLOCK]
        # the engine is busy exactly for the work: no step is computed twice
        assert cell["busy_s"] > 0 and cell["steps"] > 0


def test_the_simulator_replays_recorded_completion_lengths_exactly() -> None:
    prefix = T.ids("prefix", 32)
    programs = [_program(0, 0.0)]
    cell = S.simulate(
        COST, blocks=256, block=BLOCK, max_num_seqs=8, programs=programs,
        policy="lru", prefix=prefix, outputs={"p0": [3, 5, 1]},
    )  # fmt: skip
    assert [t["completion"] for t in cell["programs"][0]["turns"]] == [3, 5, 1]
    assert [t["prompt"] for t in cell["programs"][0]["turns"]] == [72, 72 + 3 + 20, 95 + 5 + 20]


def test_under_pressure_retention_computes_no_more_than_lru_and_every_program_finishes() -> None:
    """Eight programs whose contexts outlive a cache of a third of their working set:
    LRU recomputes contexts evicted during the tool waits; retention keeps them."""
    prefix = T.ids("prefix", 16)
    programs = [_program(i, 0.2 * i, task=120) for i in range(8)]
    computed = {}
    for policy in ("microagent", "lru"):
        cell = S.simulate(
            COST, blocks=24, block=BLOCK, max_num_seqs=8, programs=programs,
            policy=policy, prefix=prefix,
        )  # fmt: skip
        assert all(p["ok"] for p in cell["programs"]), cell["programs"]
        computed[policy] = sum(
            t["prompt"] - t["cached"] for p in cell["programs"] for t in p["turns"]
        )
    assert computed["microagent"] < computed["lru"]


def test_fit_cost_recovers_a_known_step_cost_and_holds_a_negative_term_at_zero() -> None:
    from microagent.engine_bridge.scripted._step_cost import prefill_pairs

    truth = StepCost(
        base=0.03, prefill_token=0.002, decode_seq=0.005, prefill_pair=1e-6, decode_context=1e-5
    )
    points = [
        (n, prefill_pairs(0, n), 0, 0, truth.seconds(n, 0, pairs=prefill_pairs(0, n)))
        for n in (128, 512, 1024, 1920)
    ]
    points += [(0, 0.0, b, b * c, truth.seconds(0, b, context=b * c))
               for b in (1, 4, 16) for c in (10, 1000)]  # fmt: skip
    fitted = S.fit_cost(points, 2048)
    for term in S.TERMS:
        assert getattr(fitted, term) == pytest.approx(getattr(truth, term), rel=1e-6), term
    assert fitted.max_batched_tokens == 2048
    # a step that gets cheaper with more decodes cannot be: that term is held at 0
    odd = [(0, 0.0, b, 0, 0.1 - 0.001 * b) for b in (1, 2, 4, 8)] + [(100, 5050.0, 0, 0, 0.2)]
    assert S.fit_cost(odd, 64).decode_seq == 0.0


def test_the_h100_cost_model_follows_its_published_figures() -> None:
    cost, blocks = S.h100_cost()
    # the weights' read: 16 GB at 80 % of 3.35 TB/s, about 6 ms a step
    assert cost.base == pytest.approx(2 * 8.03e9 / (3.35e12 * 0.8))
    # prefill: 16 GFLOP a token at half of 989 TFLOP/s, about 30 k tokens/s
    assert 1 / cost.prefill_token == pytest.approx(989e12 * 0.5 / (2 * 8.03e9))
    # a decode reads 128 KiB of KV per context token
    assert cost.decode_context == pytest.approx(131072 / (3.35e12 * 0.8))
    # 72 GB less 16 GB of weights and 4 GB, in 16-token blocks of 128 KiB a token
    assert blocks * 16 == pytest.approx((72e9 - 16.06e9 - 4e9) / 131072, rel=1e-3)


def test_targets_read_the_calibration_and_the_projection() -> None:
    data = {
        "calibration": [
            {"pressure": "none", "blocks": 160, "policy": "lru", "err_computed": 0.0,
             "err_p50_s": 0.1, "err_p95_s": -0.3},
            {"pressure": "pressure", "blocks": 24, "policy": "lru", "err_computed": 0.12,
             "err_p50_s": 0.0, "err_p95_s": 0.0},
        ]
    }  # fmt: skip
    got = {t["target"]: t["met"] for t in S.targets(data)}
    assert got["simulated prompt computed = real: lru at 160 blocks (none)"]
    assert not got["simulated prompt computed within 10 % of real: lru at 24 blocks (pressure)"]
    assert got["simulated program p50 within 25 % of real: lru at 160 blocks (none)"]
    assert not got["simulated program p95 within 25 % of real: lru at 160 blocks (none)"]
    assert S._err(0.0, 0.0) == 0.0 and math.isinf(S._err(1.0, 0.0))


def test_the_tiered_policies_run_load_from_the_host_and_vllm_offload_retains_nothing() -> None:
    """Issue 38's baselines at a tiny scale: eight programs on a cache of a third of their
    working set over a host tier of twice the cache. Both tiered policies finish every
    program and load blocks back from the host instead of recomputing them;
    ``vllm-offload`` (FCFS, LRU, no retention) has no retained hit, ``microagent-tier``
    (retention over the sessions policy) computes no more than it."""
    prefix = T.ids("prefix", 16)
    programs = [_program(i, 0.2 * i, task=120) for i in range(8)]
    cells = {}
    for policy in ("microagent-tier", "vllm-offload", "lru"):
        cells[policy] = S.simulate(
            COST, blocks=24, block=BLOCK, max_num_seqs=8, programs=programs, policy=policy,
            prefix=prefix, host_blocks=48 if policy in S.TIERED else 0, copy_rate=1e5,
        )  # fmt: skip
        assert all(p["ok"] for p in cells[policy]["programs"]), cells[policy]["programs"]
    computed = {
        k: sum(t["prompt"] - t["cached"] for p in c["programs"] for t in p["turns"])
        for k, c in cells.items()
    }
    for policy in S.TIERED:
        assert cells[policy]["tier_loaded_blocks"] > 0
        assert cells[policy]["tier_stored_blocks"] > 0
        assert computed[policy] < computed["lru"]
    assert cells["vllm-offload"]["retained_hit_tokens"] == 0
    assert computed["microagent-tier"] <= computed["vllm-offload"]
    assert "tier_loaded_blocks" not in cells["lru"]
    with pytest.raises(ValueError, match="host tier"):
        S.simulate(
            COST, blocks=24, block=BLOCK, max_num_seqs=8, programs=programs, policy="lru",
            prefix=prefix, host_blocks=48,
        )  # fmt: skip


def test_the_host_tier_copies_over_pcie_and_the_tier_target_reads_equal_p95() -> None:
    # 2 MiB a 16-token block at 50 GB/s, plus 30 µs: about 220 k tokens/s
    assert S.h100_copy_rate() == pytest.approx(16 / (16 * 131072 / 50e9 + 30e-6))
    assert 2e5 < S.h100_copy_rate() < 2.5e5

    def cell(system: str, rate: float, latency: float) -> dict:
        record = {"ok": True, "arrival_s": 0.0, "finish_s": latency, "tool_s": 0.0,
                  "turns": [{"ttft_s": 0.1, "latency_s": latency, "prompt": 10, "cached": 0,
                             "completion": 1}]}  # fmt: skip
        return {"shape": "bfcl", "pressure": 1.6, "rate_per_min": rate, "system": system,
                "programs": [record], "wall_s": 60.0 / rate}  # fmt: skip

    data = {
        "projection": {
            "cells": [
                cell("vllm-offload", 10.0, 30.0),
                cell("microagent-tier", 10.0, 10.0),
                cell("microagent-tier", 20.0, 20.0),
                cell("microagent-tier", 30.0, 40.0),
            ]
        }
    }
    got = {t["target"]: t for t in S.targets(data)}
    tier = got[
        "H100 bfcl 1.6x: microagent-tier >= 2x programs/min at equal p95 vs vllm-offload "
        "(same host bytes)"
    ]
    # microagent-tier's p95 reaches 30 s halfway from 20 to 30 programs/min: 25 over 10
    assert tier["measured"] == pytest.approx(2.5) and tier["met"]
    uncal = got["simulator calibrated against the real engine: microagent-tier (host tier)"]
    assert not uncal["met"] and "not run" in uncal["why"]


def test_a_tiered_real_twin_is_simulated_over_its_tier_and_calibrates_the_tier() -> None:
    """``--real-tier``'s cell (microagent-tier over a host tier of CAL_TIER_HOST blocks)
    is replayed on the simulator over the same tier: it loads from the host, gets its
    calibration row, and the projection's tier target no longer says uncalibrated."""
    programs, _ = S.cal_programs(S.CAL_TIER_POLICY, S.CAL_BLOCKS["pressure"])
    twin = {
        "system": S.CAL_TIER_POLICY, "blocks": S.CAL_BLOCKS["pressure"], "pressure": "pressure",
        "host_blocks": S.CAL_TIER_HOST,
        "programs": [{"pid": p.pid, "turns": []} for p in programs[:4]],
    }  # fmt: skip
    cost = StepCost(base=0.02, prefill_token=0.001, decode_seq=0.004, max_batched_tokens=2048)
    (sim,) = S.sim_calibration({"cost": attrs.asdict(cost), "cells": [twin]})
    assert sim["system"] == S.CAL_TIER_POLICY and "tier_loaded_blocks" in sim
    assert all(p["ok"] for p in sim["programs"])
    data = {
        "calibration": [{"pressure": "pressure", "blocks": 24, "policy": S.CAL_TIER_POLICY,
                         "err_computed": 0.05, "err_p50_s": 0.1, "err_p95_s": 0.2}],
        "projection": {"cells": []},
    }  # fmt: skip
    got = {t["target"]: t["met"] for t in S.targets(data)}
    assert got[
        "simulated prompt computed within 10 % of real: microagent-tier at 24 blocks (pressure)"
    ]
    assert not any("calibrated against the real engine" in t for t in got)


def test_a_rerun_replaces_only_its_own_cells_and_keeps_the_rest() -> None:
    """``--shapes/--pressures/--tier-rates`` re-run some cells: each replaces the kept
    cell of the same shape, pressure, rate and policy; every other kept cell and its
    settings stay."""
    first = S.projection(0.01, ("lru",), shapes=("bfcl",), pressures=(0.75,))
    (cell,) = first["cells"]
    stale = {**cell, "programs": [], "stale": True}
    other = {**cell, "system": "priority", "stale": True}
    again = S.projection(
        0.01, ("lru",), [stale, other], shapes=("bfcl",), pressures=(0.75,),
        kept_settings={"swe|3": {"kept": True}},
    )  # fmt: skip
    got = {(c["system"], c.get("stale", False)) for c in again["cells"]}
    assert got == {("lru", False), ("priority", True)}
    assert again["settings"]["swe|3"] == {"kept": True} and "bfcl|0.75" in again["settings"]


def test_results_round_trip_gzipped_and_reproducibly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = {"targets": [{"target": "t", "measured": 1.5, "met": True}], "cells": [[1, 2]] * 50}
    gz, plain = tmp_path / "r.json.gz", tmp_path / "r.json"
    S.write_results(gz, data)
    S.write_results(plain, data)
    assert S.read_results(gz) == data == S.read_results(plain)
    first = gz.read_bytes()
    S.write_results(gz, data)
    assert gz.read_bytes() == first and len(first) < plain.stat().st_size
