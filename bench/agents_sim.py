"""Agent programs past this machine, by simulation: a step cost model calibrated, then projected.

Issue 26, part 4. The ScriptedEngine with a ``StepCost`` (``cost=``) runs
batched engine steps (chunked prefill sharing a token budget, decode slowing
with its batch) in virtual time, with the same prefix cache, admission and
``RetentionTable`` as the vLLM scheduler. This script:

1. **Probes** the real engine (``VLLMBridge``, the default model, ``ENGINE``'s
   settings) for a step's cost: prefill steps of 128-1 920 tokens and decode
   steps of 1-16 requests, fitted by least squares to ``base + prefill_token x
   tokens + decode_seq x requests``.
2. **Calibrates**: one token-level trace (``bench/_agents_trace.py``: BFCL-like
   programs, small scale) runs on the real engine at two cache sizes (no
   pressure, and about 1.6x the working set), under ``microagent`` (retention and
   program priority) and ``lru`` (neither). The simulator replays the same trace,
   with the real run's completion lengths, under the probed cost. Compared:
   prompt tokens computed (targets: exact without pressure, within 10 % under
   it) and program latency p50/p95 (within 25 %).
3. **Projects** a GPU: Llama-3.1-8B on one H100 SXM, a cost model from published
   figures (``h100_cost``), both program shapes at full size, hundreds of
   concurrent programs, the cache at 0.75x, 1.6x and 3x the live working set,
   ``microagent`` against ``priority`` and ``lru`` (FCFS + LRU), in virtual time.
   With a host KV tier (issue 38): ``microagent-tier`` (microagent's retention and
   priorities over a host tier evicting by sessions) against ``vllm-offload`` (vLLM's
   native CPU offloading: FCFS, no retention, every block stored, LRU), the same host
   bytes, at 1.6x and 3x, the former at rising rates: programs/min at equal p95.

Results: ``bench/results/agents_sim.json.gz`` (gzipped: the projection keeps every
turn; ``targets`` included), its tables in
the agents family page with ``--update``. The probe and calibration need the real engine
(``--skip-real`` reuses the JSON's); refuses a busy machine (load average above
0.5) unless ``--force``.

Usage: ``.venv/bin/python bench/agents_sim.py [--quick] [--skip-real] [--update]``
(``--policies microagent-tier vllm-offload`` projects those alone and keeps the JSON's
other cells; ``--window-scale`` shortens the projection's window).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _agents_programs as P  # noqa: E402
import _agents_report as R  # noqa: E402
import _agents_trace as T  # noqa: E402
from _sections import machine, machine_sentence, publish  # noqa: E402

RESULTS = HERE / "results"
#: The results, gzipped (the projection keeps every turn of every program: ~18 MB raw).
RESULTS_FILE = RESULTS / "agents_sim.json.gz"
#: The real engine's settings (bench/agents.py's, with a context that lets a small cache
#: be under pressure: vLLM keeps room for one max_model_len sequence).
ENGINE: dict[str, int] = {"max_num_seqs": 16, "max_model_len": 2048, "max_num_batched_tokens": 2048}
CPU_BLOCK = 128
#: The calibration trace: BFCL-like programs at half their context, a quarter of their tool
#: time, 16 tokens a turn, arriving at RATE programs/min.
CAL_SCALE = P.Scale(context=0.5, turns=0.6, time=0.25, max_tokens=16)
CAL_RATE, CAL_PROGRAMS = 40.0, 10
#: Cache sizes of the calibration (blocks of 128): roomy, and about 1.6x the working set.
CAL_BLOCKS = {"none": 160, "pressure": 24}
CAL_POLICIES = ("microagent", "lru")
#: The tiered calibration cell (``--real-tier``): microagent's retention over a host tier
#: of the projection's size (2x the device cache), under the sessions' policy, at the
#: pressure cache size, on an engine of its own.
CAL_TIER_POLICY = "microagent-tier"
CAL_TIER_HOST = 2 * CAL_BLOCKS["pressure"]
SEED = 26
#: The projection's programs: the retention policy's constants (``DEFAULT_MIN_HOLD``, the
#: 0.95 budget, the headroom rule) were chosen on SEED's programs with 60 s windows, so
#: what is reported is drawn from another seed.
REPORT_SEED = 27


# -- the cost models -----------------------------------------------------------------------------


#: The step cost's terms, in the order of a probe point's features.
TERMS = ("base", "prefill_token", "prefill_pair", "decode_seq", "decode_context")


def fit_cost(points: Sequence[Sequence[float]], budget: int) -> Any:
    """Non-negative least squares of a step's seconds on its work.

    A point is (prefill tokens, prefill attention pairs, decoding requests, their
    context tokens, seconds); a term whose coefficient comes out negative is held
    at 0 and the rest refitted (numpy has no NNLS; five terms need no more).
    """
    import numpy as np
    from microagent.testing import StepCost

    a = np.array([[1.0, *p[:4]] for p in points])
    y = np.array([p[4] for p in points])
    free = list(range(len(TERMS)))
    coef = np.zeros(len(TERMS))
    while free:
        fitted, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (fitted >= 0).all():
            coef[free] = fitted
            break
        free.pop(int(np.argmin(fitted)))
    return StepCost(**{t: float(c) for t, c in zip(TERMS, coef, strict=True)},
                    max_batched_tokens=budget)  # fmt: skip


#: Published figures the GPU projection is built from.
H100 = {
    "gpu": "NVIDIA H100 SXM5 80 GB (datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3)",
    "model": "Llama-3.1-8B-Instruct, BF16 (config: 8.03 B parameters, 32 layers, "
    "hidden 4 096, 8 KV heads x 128 dims: 128 KiB of KV per token)",
    "flops": 989e12,
    "bandwidth": 3.35e12,
    "memory": 80e9,
    "params": 8.03e9,
    "layers": 32,
    "hidden": 4096,
    "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2,
    "mfu_prefill": 0.5,  # compute-bound prefill at half of peak
    "bandwidth_efficiency": 0.8,  # memory-bound decode at 80 % of peak bandwidth
    "gpu_memory_utilization": 0.9,  # vLLM's default
    "activation_reserve": 4e9,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "block": 16,
    # the host tier (issue 38): host<->HBM over PCIe Gen5 x16 (64 GB/s a direction, about
    # 50 GB/s effective), a per-transfer latency charged on every 16-token block (2 MiB);
    # no file tier (the ScriptedEngine models one host tier)
    "pcie_bandwidth": 50e9,
    "pcie_latency": 30e-6,
    # host bytes of the tier, as a multiple of the cell's device KV, the same for both
    # tiered policies: an HGX/DGX H100 node has 2 TB of RAM for 8 GPUs (256 GB a GPU, about
    # 4.5x one H100's KV cache), so 2x the device KV fits in any cell's share of it
    "host_kv_multiple": 2.0,
}


def h100_cost() -> tuple[Any, int]:
    """The H100 step cost and the KV cache's size in blocks.

    A step reads the weights once (``base``); each decoding request computes one
    token's FLOPs and reads its KV (``decode_seq``, ``decode_context``); each prompt
    token costs its FLOPs at the prefill MFU (``prefill_token``), and its attention
    to every earlier token 4 x layers x hidden FLOPs (``prefill_pair``).
    """
    from microagent.testing import StepCost

    h = H100
    weights = 2 * h["params"]  # BF16 bytes; also the FLOPs per token
    bandwidth = h["bandwidth"] * h["bandwidth_efficiency"]
    prefill_flops = h["flops"] * h["mfu_prefill"]
    cost = StepCost(
        base=weights / bandwidth,
        prefill_token=weights / prefill_flops,
        prefill_pair=4 * h["layers"] * h["hidden"] / prefill_flops,
        decode_seq=weights / h["flops"],
        decode_context=h["kv_bytes_per_token"] / bandwidth,
        max_batched_tokens=int(h["max_num_batched_tokens"]),
    )
    kv = h["memory"] * h["gpu_memory_utilization"] - weights - h["activation_reserve"]
    return cost, int(kv // (h["kv_bytes_per_token"] * h["block"]))


def h100_copy_rate() -> float:
    """Tokens per second the host tier copies into HBM: a block's bytes over PCIe plus the
    per-transfer latency, per block (about 220 k tokens/s)."""
    h = H100
    block_bytes = h["kv_bytes_per_token"] * h["block"]
    return h["block"] / (block_bytes / h["pcie_bandwidth"] + h["pcie_latency"])


# -- the real engine -----------------------------------------------------------------------------


def _real_bridge(blocks: int, prefill_rate: float | None = None, host_blocks: int = 0) -> Any:
    from microagent import VLLMBridge

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tier: dict[str, Any] = {}
    if host_blocks:
        from agents import kv_bytes_per_token

        tier = {
            "host_tier_bytes": host_blocks * CPU_BLOCK * kv_bytes_per_token(),
            "tier_policy": "sessions",
        }
    return VLLMBridge(
        "default",
        max_num_seqs=ENGINE["max_num_seqs"],
        max_model_len=ENGINE["max_model_len"],
        max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
        engine_args={"num_gpu_blocks_override": blocks},
        prefill_rate=prefill_rate,
        retention_ttl=600.0,
        progress=False,
        **tier,
    )


async def probe(bridge: Any) -> dict[str, Any]:
    """Step timings of the real engine, as ``fit_cost``'s points: prefill steps of fresh
    prompts (one step each, within the budget), and decode steps of 1-16 requests over
    short and long contexts (the median step of each request's decode)."""
    from microagent import Sampling
    from microagent.engine_bridge.scripted._step_cost import prefill_pairs

    points: list[tuple[int, float, int, int, float]] = []
    # the first pass warms the CPU engine's per-shape kernels up and is not kept
    for rep in range(3):
        for n in (128, 512, 1024, 1536, 1920):
            prompt = bridge.handle(T.ids(f"probe/prefill/{rep}/{n}", n))
            result = await bridge.generate(prompt, Sampling(max_tokens=1))
            computed = n - result.cached_tokens
            pairs = prefill_pairs(result.cached_tokens, computed)
            if rep:
                points.append((computed, pairs, 0, 0, result.timings.total))
    count = bridge.chat.prompt([{"role": "user", "content": "Count from 1 to 300: 1, 2, 3,"}])
    for rep, ctx, batch in itertools.product((0, 1), (0, 1024), (1, 2, 4, 8, 16)):
        point = await _decode_point(bridge, count, f"{rep}/{ctx}/{batch}", ctx, batch)
        if rep and point is not None:  # the first pass warms up and is not kept
            points.append(point)
    return {"points": points}


async def _decode_point(
    bridge: Any, count: Any, seed: str, ctx: int, batch: int
) -> tuple[int, float, int, int, float] | None:
    """The median decode step of ``batch`` requests over ``ctx`` + a counting prompt: token
    gaps after every request has its first token (its prefill done), while all decode."""
    import anyio
    from microagent import Sampling

    marks: list[list[float]] = [[] for _ in range(batch)]
    lengths = [0] * batch

    async def one(i: int) -> None:
        handle = bridge.handle([*T.ids(f"probe/decode/{seed}/{i}", ctx), *count.token_ids])
        lengths[i] = len(handle)

        def seen(delta: Any) -> None:
            if delta.token_ids:
                marks[i].append(time.monotonic())

        await bridge.generate(handle, Sampling(max_tokens=48), on_delta=seen)

    async with anyio.create_task_group() as tg:
        for i in range(batch):
            tg.start_soon(one, i)
    if not all(marks):
        return None
    start = max(m[0] for m in marks)
    end = min(m[-1] for m in marks)
    gaps = [b - a for m in marks for a, b in itertools.pairwise(m) if a >= start and b <= end]
    if len(gaps) < batch:
        return None
    decoded = statistics.fmean(sum(start <= t <= end for t in m) for m in marks)
    context = round(sum(lengths) + batch * decoded / 2)
    return (0, 0.0, batch, context, statistics.median(gaps))


def cal_programs(policy: str, blocks: int) -> tuple[list[T.TraceProgram], int]:
    """The calibration trace (its prefix seeded apart per cell: no hit across cells)."""
    shape = P.SHAPES["bfcl"]
    drawn = P.programs(shape, CAL_SCALE, CAL_RATE, CAL_PROGRAMS, 0, SEED)
    prefix = T.shared_prefix(shape)
    traces = [T.from_program(p, prefix) for p in drawn]
    return [replace(tp, pid=f"{policy}-{blocks}-{tp.pid}") for tp in traces], prefix


async def real_cells(prefill_rate_hint: float | None) -> dict[str, Any]:
    """The probe and the calibration cells on the real engine, one engine per cache size."""
    out: dict[str, Any] = {"cells": []}
    for label, blocks in CAL_BLOCKS.items():
        bridge = _real_bridge(blocks, prefill_rate_hint)
        async with bridge:
            if label == "none":
                out["probe"] = await probe(bridge)
                cost = fit_cost(out["probe"]["points"], ENGINE["max_num_batched_tokens"])
                out["cost"] = attrs.asdict(cost)
                print(f"probed step cost: {cost}", flush=True)
            # a warm-up on another trace: the CPU engine compiles a kernel per new batch
            # shape, which a first cell would otherwise pay for alone
            warm, prefix_len = cal_programs("warm-up", blocks)
            await T.run_cell(bridge, warm[:5], "lru", T.ids(f"warm/{blocks}", prefix_len), 900.0)
            order = CAL_POLICIES if label == "none" else CAL_POLICIES[::-1]
            for policy in order:
                programs, prefix_len = cal_programs(policy, blocks)
                prefix = T.ids(f"prefix/{policy}/{blocks}", prefix_len)
                before = bridge.stats()
                cell = await T.run_cell(bridge, programs, policy, prefix, timeout=900.0)
                after = bridge.stats()
                cell.update(
                    _labels("bfcl", label, blocks, policy, "real"),
                    recomputed_tokens=after.recomputed_tokens - before.recomputed_tokens,
                    preemptions=after.preemptions - before.preemptions,
                )
                out["cells"].append(cell)
                print(f"real {label} {policy}: {_line(cell)}", flush=True)
    # the tiered cell in the same run, so that one probe's engine speed holds for all
    out["cells"] += await real_tier_cells(prefill_rate_hint)
    return out


async def real_tier_cells(prefill_rate_hint: float | None) -> list[dict[str, Any]]:
    """The tiered calibration cell on the real engine: ``CAL_TIER_POLICY``'s trace (the
    retention policy's requests) over a host tier of ``CAL_TIER_HOST`` blocks, at the
    pressure cache size, with the tier's loads and their measured copy rate."""
    blocks = CAL_BLOCKS["pressure"]
    bridge = _real_bridge(blocks, prefill_rate_hint, host_blocks=CAL_TIER_HOST)
    async with bridge:
        warm, prefix_len = cal_programs("warm-up", blocks)
        await T.run_cell(bridge, warm[:5], "lru", T.ids(f"warm/{blocks}", prefix_len), 900.0)
        programs, prefix_len = cal_programs(CAL_TIER_POLICY, blocks)
        prefix = T.ids(f"prefix/{CAL_TIER_POLICY}/{blocks}", prefix_len)
        before, tier_before = bridge.stats(), await bridge.tier_stats()
        cell = await T.run_cell(bridge, programs, TRACE_POLICY[CAL_TIER_POLICY], prefix, 900.0)
        after, tier_after = bridge.stats(), await bridge.tier_stats()
    loaded = (tier_after.loaded_blocks - tier_before.loaded_blocks) * CPU_BLOCK
    seconds = tier_after.load_seconds - tier_before.load_seconds
    cell.update(
        _labels("bfcl", "pressure", blocks, CAL_TIER_POLICY, "real"),
        host_blocks=CAL_TIER_HOST,
        recomputed_tokens=after.recomputed_tokens - before.recomputed_tokens,
        preemptions=after.preemptions - before.preemptions,
        tier_loaded_blocks=tier_after.loaded_blocks - tier_before.loaded_blocks,
        tier_stored_blocks=tier_after.stored_blocks - tier_before.stored_blocks,
        tier_load_s=round(seconds, 3),
        copy_tokens_per_s=round(loaded / seconds) if seconds > 0 else None,
    )
    print(f"real pressure {CAL_TIER_POLICY}: {_line(cell)}", flush=True)
    return [cell]


async def reprobe() -> dict[str, Any]:
    """The probe and its fit alone, on a fresh engine."""
    async with _real_bridge(CAL_BLOCKS["none"]) as bridge:
        probed = await probe(bridge)
    cost = fit_cost(probed["points"], ENGINE["max_num_batched_tokens"])
    print(f"probed step cost: {cost}", flush=True)
    return {"probe": probed, "cost": attrs.asdict(cost)}


def _labels(shape: str, label: str, blocks: int, policy: str, engine: str) -> dict[str, Any]:
    return {
        "shape": shape,
        "pressure": label,
        "rate_per_min": CAL_RATE,
        "system": policy,
        "engine": engine,
        "blocks": blocks,
    }


# -- the simulator -------------------------------------------------------------------------------


def simulate(
    cost: Any,
    *,
    blocks: int,
    block: int,
    max_num_seqs: int,
    programs: Sequence[T.TraceProgram],
    policy: str,
    prefix: Sequence[int],
    outputs: dict[str, Sequence[int]] | None = None,
    host_blocks: int = 0,
    copy_rate: float | None = None,
) -> dict[str, Any]:
    """One cell on the ScriptedEngine under ``cost``, in virtual time.

    ``policy`` is a trace's (``T.POLICIES``) or a tiered one (``TIERED``: a host tier of
    ``host_blocks`` copying ``copy_rate`` tokens/s; ``vllm-offload`` retains nothing).
    """
    from microagent.testing import ScriptedEngine, run_virtual

    tier = TIERED.get(policy)
    if (tier is None) != (host_blocks == 0):
        raise ValueError(f"{policy}: a host tier is for {sorted(TIERED)} and they need one")
    tiering: dict[str, Any] = {}
    if tier is not None:
        tiering = {"host_tier_blocks": host_blocks, "tier_policy": tier}
        if copy_rate is not None:
            tiering["tier_copy_rate"] = copy_rate

    def exact(prompt: Sequence[int], request: Any) -> list[int]:
        return [T.ID_RANGE[0]] * request.sampling.max_tokens  # "length" at exactly that many

    async def main() -> dict[str, Any]:
        engine = ScriptedEngine(
            cost=cost,
            num_blocks=blocks,
            block_size=block,
            max_num_seqs=max_num_seqs,
            # VLLMBridge's default; vLLM's own offloading has no retention
            retention_budget=0.0 if policy == "vllm-offload" else 0.95,
            retention_ttl=600.0,
            history_limit=16,
            script=exact,
            **tiering,
        )
        async with engine:
            trace = TRACE_POLICY.get(policy, policy)
            cell = await T.run_cell(engine, programs, trace, prefix, 1e6, outputs)
            stats = engine.stats()
            assert engine.steps is not None
            cell["recomputed_tokens"] = stats.recomputed_tokens
            cell["retained_hit_tokens"] = stats.retained_hit_tokens
            if tier is not None:
                ts = await engine.tier_stats()
                cell["tier_loaded_blocks"] = ts.loaded_blocks
                cell["tier_stored_blocks"] = ts.stored_blocks
                cell["tier_evicted_blocks"] = ts.evicted_blocks
                cell["tier_load_s"] = round(ts.load_seconds, 3)
            cell["busy_s"] = round(engine.steps.busy, 3)
            cell["steps"] = engine.steps.steps
        return cell

    return run_virtual(main)


def sim_calibration(real: dict[str, Any]) -> list[dict[str, Any]]:
    """The calibration trace on the simulator, each cell replaying its real twin's outputs."""
    from microagent.testing import StepCost

    cost = StepCost(**real["cost"])
    out = []
    for twin in real["cells"]:
        programs, prefix_len = cal_programs(twin["system"], twin["blocks"])
        recorded = {r["pid"]: [t["completion"] for t in r["turns"]] for r in twin["programs"]}
        # each turn as the real run generated it; turns it never ran (a program it did not
        # finish), as planned
        outputs = {
            p.pid: [*recorded.get(p.pid, []), *[p.max_tokens] * p.turns][: p.turns]
            for p in programs
        }
        prefix = T.ids(f"prefix/{twin['system']}/{twin['blocks']}", prefix_len)
        cell = simulate(
            cost,
            blocks=twin["blocks"],
            block=CPU_BLOCK,
            max_num_seqs=ENGINE["max_num_seqs"],
            programs=programs,
            policy=twin["system"],
            prefix=prefix,
            outputs=outputs,
            # the tier's copies at the retention rule's rate (the real engine's
            # measured rate is in its cell: its loads overlap the engine's steps)
            host_blocks=twin.get("host_blocks", 0),
        )
        cell.update(_labels("bfcl", twin["pressure"], twin["blocks"], twin["system"], "simulated"))
        out.append(cell)
    return out


def calibration_rows(real: list[dict[str, Any]], sim: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (cache, policy): the real and simulated measures and the simulator's error."""
    rows = []
    for r in real:
        s = next(c for c in sim if c["blocks"] == r["blocks"] and c["system"] == r["system"])
        mr, ms = _measures(r), _measures(s)
        rows.append(
            {
                "pressure": r["pressure"],
                "blocks": r["blocks"],
                "policy": r["system"],
                **{f"real_{k}": v for k, v in mr.items()},
                **{f"sim_{k}": v for k, v in ms.items()},
                **{f"err_{k}": _err(ms[k], mr[k]) for k in ("computed", "p50_s", "p95_s")},
            }
        )
    return rows


def _measures(cell: dict[str, Any]) -> dict[str, Any]:
    progs = [R.program_measures(p) for p in cell["programs"]]
    lat = [m["latency"] for m in progs]
    return {
        "programs": len(progs),
        "failed": sum(not m["ok"] for m in progs),
        "computed": sum(m["computed"] for m in progs),
        "floor": sum(m["floor"] for m in progs),
        "p50_s": R.percentile(lat, 50),
        "p95_s": R.percentile(lat, 95),
    }


def _err(sim: float, real: float) -> float:
    """The simulator's relative error (0 when both are 0)."""
    if real == 0:
        return 0.0 if sim == 0 else math.inf
    return sim / real - 1.0


# -- the projection ------------------------------------------------------------------------------

PROJ_PRESSURES = (0.75, 1.6, 3.0)
PROJ_POLICIES = ("microagent", "priority", "lru", "microagent-tier", "vllm-offload")
#: The policies with a host tier, and its eviction policy (``ScriptedEngine(tier_policy=)``).
TIERED = {"microagent-tier": "sessions", "vllm-offload": "lru"}
#: Each tiered policy's requests, as a trace policy: microagent's retains and priorities,
#: or vLLM's defaults (FCFS, nothing retained).
TRACE_POLICY = {"microagent-tier": "microagent", "vllm-offload": "lru"}
#: The tiered policies run at these pressures (the issue's), ``microagent-tier`` at these
#: multiples of the projection's rate (the cache kept at its size): its programs/min at
#: ``vllm-offload``'s p95 (at the projection's rate) is read off that curve.
TIER_PRESSURES = (1.6, 3.0)
TIER_RATES = {"microagent-tier": (1.0, 1.2, 1.4), "vllm-offload": (1.0,)}
#: Programs arrive at this fraction of what the engine could prefill at the workload floor
#: (each context once): a load it sustains when nothing is recomputed.
PROJ_LOAD = 0.6
#: Seconds of arrivals per projected cell: at least this, and three programs' durations.
PROJ_WINDOW_S = 120.0


def projection(
    scale_window: float,
    policies: Sequence[str] = PROJ_POLICIES,
    kept: Sequence[dict[str, Any]] = (),
    *,
    shapes: Sequence[str] = ("bfcl", "swe"),
    pressures: Sequence[float] = PROJ_PRESSURES,
    tier_rates: Sequence[float] | None = None,
    kept_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Both shapes on the H100 model at ``PROJ_LOAD``, the cache sized to each pressure.

    The rate is set by the compute (a fraction of the floor's prefill capacity), the
    cache by the pressure (the live working set at that rate over the pressure), as
    ``bench/agents.py`` sizes it; the tables say what fraction of one H100's KV that is.
    The tiered policies get a host tier of ``host_kv_multiple`` x the cache, at
    ``TIER_PRESSURES`` and ``TIER_RATES``; ``scale_window``: of ``PROJ_WINDOW_S`` (a
    tenth with ``--quick``). Only ``policies`` run, on ``shapes`` at ``pressures``
    (``microagent-tier`` at ``tier_rates`` multiples when given); ``kept``: cells of an
    earlier run (the same programs: the draws are seeded), each replaced by the cell of
    the same shape, pressure, rate and policy when this run has one.
    """
    cells: list[dict[str, Any]] = []
    settings = dict(kept_settings or {})
    rates = dict(TIER_RATES)
    if tier_rates is not None:
        rates["microagent-tier"] = tuple(tier_rates)
    copy_rate = h100_copy_rate()
    for shape_name in shapes:
        shape = P.SHAPES[shape_name]
        scale = P.Scale()
        sample = [
            P.draw_program(shape, scale, random.Random(f"floor/{i}"), "f", i, 0.0)
            for i in range(200)
        ]
        floor = statistics.fmean(p.contexts()[-1] + p.max_tokens for p in sample)
        cost, h100_blocks = h100_cost()
        rate_per_min = 60.0 * PROJ_LOAD / (cost.prefill_token * floor)
        ws = P.working_set(shape, scale, rate_per_min, 1.0 / cost.prefill_token, 25.0)
        window = max(PROJ_WINDOW_S, 3.0 * ws.duration_s) * scale_window
        count = max(20, round(rate_per_min / 60.0 * window))
        prefix = T.shared_prefix(shape)
        by_rate: dict[float, list[T.TraceProgram]] = {}

        for pressure in pressures:
            blocks = P.kv_blocks(ws.tokens, pressure, int(H100["block"]), 1)
            host_blocks = round(blocks * H100["host_kv_multiple"])
            settings[f"{shape_name}|{pressure:g}"] = {
                "rate_per_min": round(rate_per_min, 1),
                "programs": count,
                "concurrency": round(ws.concurrency, 1),
                "working_set_tokens": round(ws.tokens),
                "blocks": blocks,
                "of_h100_kv": round(blocks / h100_blocks, 2),
                "host_blocks": host_blocks,
                "host_gb": round(host_blocks * H100["block"] * H100["kv_bytes_per_token"] / 1e9, 1),
                "copy_tokens_per_s": round(copy_rate),
                "cost": attrs.asdict(cost),
            }
            runs = [
                (policy, times)
                for policy in policies
                if policy not in TIERED or pressure in TIER_PRESSURES
                for times in rates.get(policy, (1.0,))
            ]
            for policy, times in runs:
                if times not in by_rate:
                    n = round(count * times)
                    drawn = P.programs(shape, scale, rate_per_min * times, n, 0, REPORT_SEED)
                    by_rate[times] = [T.from_program(p, prefix) for p in drawn]
                t = time.monotonic()
                cell = simulate(
                    cost,
                    blocks=blocks,
                    block=int(H100["block"]),
                    max_num_seqs=int(H100["max_num_seqs"]),
                    programs=by_rate[times],
                    policy=policy,
                    prefix=T.ids(f"prefix/{shape_name}", prefix),
                    host_blocks=host_blocks if policy in TIERED else 0,
                    copy_rate=copy_rate,
                )
                cell.update(
                    shape=shape_name,
                    pressure=pressure,
                    rate_per_min=round(rate_per_min * times, 1),
                    system=policy,
                    engine="simulated-h100",
                    blocks=blocks,
                    host_blocks=host_blocks if policy in TIERED else 0,
                    window_scale=scale_window,
                    sim_wall_s=round(time.monotonic() - t, 1),
                )
                cells.append(cell)
                print(
                    f"h100 {shape_name} {pressure:g}x {times:g}x rate {policy}: {_line(cell)} "
                    f"({cell['sim_wall_s']} s of wall time)",
                    flush=True,
                )
    ran = {_cell_key(c) for c in cells}
    cells = [c for c in kept if _cell_key(c) not in ran] + cells
    return {
        "cells": cells,
        "settings": settings,
        "h100": H100,
        "load": PROJ_LOAD,
        "seed": REPORT_SEED,
        "selection_seed": SEED,
    }


def _cell_key(cell: dict[str, Any]) -> tuple[str, float, float, str]:
    return (cell["shape"], cell["pressure"], cell["rate_per_min"], cell["system"])


def _line(cell: dict[str, Any]) -> str:
    """One finished cell as a progress line."""
    m = _measures(cell)
    x = m["computed"] / m["floor"] if m["floor"] else math.nan
    return (
        f"{m['programs'] - m['failed']}/{m['programs']} done, p50 {m['p50_s']:.2f} s, "
        f"p95 {m['p95_s']:.2f} s, computed {m['computed']} ({x:.2f}x floor)"
    )


# -- targets and tables --------------------------------------------------------------------------


def read_results(path: Path) -> dict[str, Any]:
    """A results file, gzipped (``.gz``) or not."""
    raw = path.read_bytes()
    data: dict[str, Any] = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    return data


def write_results(path: Path, data: dict[str, Any]) -> None:
    """Compact JSON, gzipped when ``path`` ends in ``.gz`` (reproducibly: no timestamp)."""
    raw = json.dumps(data, separators=(",", ":"), default=str).encode()
    path.write_bytes(gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)


def _target(target: str, measured: float, met: bool, why: str = "") -> dict[str, Any]:
    value = round(measured, 4) if math.isfinite(measured) else str(measured)
    return {"target": target, "measured": value, "met": bool(met), "why": why}


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26 part 4's calibration targets, and the projection's reading of the headline ones."""
    out = []
    rows = data.get("calibration", [])
    for row in rows:
        name = f"{row['policy']} at {row['blocks']} blocks ({row['pressure']})"
        exact = row["pressure"] == "none"
        err = row["err_computed"]
        out.append(
            _target(
                f"simulated prompt computed {'= real' if exact else 'within 10 % of real'}: {name}",
                err,
                err == 0 if exact else abs(err) <= 0.10,
            )
        )
        for q in ("p50_s", "p95_s"):
            out.append(
                _target(
                    f"simulated program {q[:3]} within 25 % of real: {name}",
                    row[f"err_{q}"],
                    abs(row[f"err_{q}"]) <= 0.25,
                )
            )
    table = R.rows({"cells": data.get("projection", {}).get("cells", [])})
    for shape in ("bfcl", "swe"):
        ours = table.get((shape, 1.6, _rate(table, shape), "microagent"))
        lru = table.get((shape, 1.6, _rate(table, shape), "lru"))
        if ours is None or lru is None:
            continue
        out.append(
            _target(
                f"H100 {shape} 1.6x: microagent prompt computed <= 1.3x the floor",
                ours["x_floor"],
                ours["x_floor"] <= 1.3,
            )
        )
        ratio = ours["ttft_later_p95_s"] / lru["ttft_later_p95_s"]
        out.append(
            _target(
                f"H100 {shape} 1.6x: later-turn TTFT p95 <= 0.5x FCFS+LRU's", ratio, ratio <= 0.5
            )
        )
        tail = ours["work_p99_s"] / ours["work_p50_s"]
        out.append(
            _target(
                f"H100 {shape} 1.6x: program time without tools p99 <= 3x p50", tail, tail <= 3.0
            )
        )
        p95 = ours["p95_s"] / lru["p95_s"]
        out.append(
            _target(f"H100 {shape} 1.6x: program p95 no worse than FCFS+LRU's", p95, p95 <= 1.0)
        )
    out += tier_targets(data)
    return out


def tier_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 38's projection target, per shape and pressure: ``microagent-tier``'s
    programs/min at ``vllm-offload``'s p95 (interpolated on its rate curve; its highest
    throughput when it never gets that slow, a lower bound), over ``vllm-offload``'s; and
    whether ``microagent-tier`` is calibrated at all."""
    out = []
    table = R.rows({"cells": data.get("projection", {}).get("cells", [])})
    for shape, pressure in itertools.product(("bfcl", "swe"), TIER_PRESSURES):
        base_rows = {k[2]: r for k, r in table.items()
                     if k[:2] == (shape, pressure) and k[3] == "vllm-offload"}  # fmt: skip
        curve = [(r["per_min"], r["p95_s"]) for k, r in table.items()
                 if k[:2] == (shape, pressure) and k[3] == "microagent-tier"]  # fmt: skip
        if not base_rows or not curve:
            continue
        base = base_rows[min(base_rows)]
        tp = R.throughput_at(curve, base["p95_s"])
        ratio = (tp or 0.0) / base["per_min"] if base["per_min"] else math.nan
        bound = tp is not None and tp >= max(x for x, _ in curve) - 1e-9
        out.append(
            _target(
                f"H100 {shape} {pressure:g}x: microagent-tier >= 2x programs/min at equal p95 "
                "vs vllm-offload (same host bytes)",
                ratio,
                ratio >= 2.0,
                f"{tp or 0.0:.1f} vs {base['per_min']:.1f} programs/min at vllm-offload's p95 "
                f"{base['p95_s']:.1f} s"
                + (
                    " (a lower bound: microagent-tier stays under it at its highest rate)"
                    if bound
                    else ""
                )
                + "; virtual time on a cost model",
            )
        )
    cal = {row["policy"] for row in data.get("calibration", [])}
    if "microagent-tier" not in cal and any(t[3] == "microagent-tier" for t in table):
        out.append(
            _target(
                "simulator calibrated against the real engine: microagent-tier (host tier)",
                math.nan,
                False,
                "not run: the calibration's real-engine cells cover microagent and lru only; "
                "the tier's copy cost is an assumption (PCIe figures), not a fit",
            )
        )
    return out


def _rate(table: dict[Any, Any], shape: str) -> float:
    return next((k[2] for k in table if k[0] == shape and k[1] == 1.6), 0.0)


def _f(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return "∞" if v == math.inf else f"{v:.{digits}f}"


def tables(data: dict[str, Any]) -> str:
    lines = []
    cost = data.get("real", {}).get("cost")
    if cost:
        lines += [
            "**The probed step cost** of the real engine on this machine: "
            f"{cost['base'] * 1e3:.1f} ms a step + {cost['prefill_token'] * 1e3:.3f} ms a prompt "
            f"token + {cost['prefill_pair'] * 1e6:.4f} µs a (prompt token, earlier token) pair "
            f"+ {cost['decode_seq'] * 1e3:.2f} ms a decoding request + "
            f"{cost['decode_context'] * 1e6:.3f} µs a context token of each "
            f"(fitted to {len(data['real']['probe']['points'])} probed steps)",
            "",
            "**Calibration** (the same token-level trace on the real engine and on the "
            "simulator; error = simulated / real − 1):",
            "",
            "| cache | policy | computed real | computed sim | error | p50 real | p50 sim | "
            "error | p95 real | p95 sim | error |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in data.get("calibration", []):
            lines.append(
                f"| {row['blocks']} blocks ({row['pressure']}) | {row['policy']} | "
                f"{row['real_computed']} | {row['sim_computed']} | {row['err_computed']:+.1%} | "
                f"{_f(row['real_p50_s'])} s | {_f(row['sim_p50_s'])} s | "
                f"{row['err_p50_s']:+.1%} | {_f(row['real_p95_s'])} s | "
                f"{_f(row['sim_p95_s'])} s | {row['err_p95_s']:+.1%} |"
            )
    proj = data.get("projection")
    if proj:
        table = R.rows({"cells": proj["cells"]})
        lines += [
            "",
            "**Projection: Llama-3.1-8B on one H100** (a cost model from published figures, "
            "see below, run in virtual time: a projection, never a GPU measurement):",
            "",
            "| shape | pressure | KV (of one H100's) | programs/min | live programs | policy | "
            "host tier (blocks loaded) | computed × floor | p50 | p95 | p99 | "
            "without tools p50 / p99 | later-turn TTFT p95 | failed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (shape, pressure, rate, system), row in table.items():
            s = proj["settings"][f"{shape}|{pressure:g}"]
            host = "—"
            if system in TIERED:
                host = (f"{s['host_gb']:g} GB, {TIERED[system]} "
                        f"({_f(row['tier_loaded_blocks'], 0)})")  # fmt: skip
            lines.append(
                f"| {shape} | {pressure:g}× | {s['blocks'] * H100['block'] / 1e3:.0f} k tokens "
                f"({s['of_h100_kv']:.0%}) | {rate:g} | {s['concurrency']:g} | {system} | "
                f"{host} | "
                f"{_f(row['x_floor'])} | {_f(row['p50_s'], 1)} s | {_f(row['p95_s'], 1)} s | "
                f"{_f(row['p99_s'], 1)} s | {_f(row['work_p50_s'], 1)} / "
                f"{_f(row['work_p99_s'], 1)} s | {_f(row['ttft_later_p95_s'], 3)} s | "
                f"{row['failed']} |"
            )
        h = proj["h100"]
        short = {c["system"]: c["window_scale"] for c in proj["cells"]
                 if c.get("window_scale", 1.0) != 1.0}  # fmt: skip
        lines += [
            "",
            f"Cost model: {h['gpu']}; {h['model']}. A step reads the weights once "
            f"(at {h['bandwidth_efficiency']:.0%} of peak bandwidth), each decoding request "
            "reads its KV (the shape's mean live context) and computes a token, each prompt "
            f"token costs its FLOPs at {h['mfu_prefill']:.0%} of peak; KV cache: "
            f"{h['gpu_memory_utilization']:.0%} of memory less the weights and "
            f"{h['activation_reserve'] / 1e9:.0f} GB, blocks of {h['block']}, "
            f"max_num_seqs {h['max_num_seqs']}, max_num_batched_tokens "
            f"{h['max_num_batched_tokens']}. Programs arrive (Poisson) at "
            f"{proj['load']:.0%} of what the model could prefill at the workload floor; the "
            "cache is the live working set at that rate over the pressure (its share of one "
            "H100's KV cache in the table). The retention policy's constants were chosen on "
            f"programs of seed {SEED}; these are seed {REPORT_SEED}'s.",
            "",
            "Host tier (issue 38): `microagent-tier` is microagent's retention and priorities "
            "over a host tier that evicts by sessions (cold blocks first, then the held session "
            "due back last; retention reckons a demotion as a copy); `vllm-offload` is vLLM's "
            "native CPU offloading (`--kv-offloading-size`): FCFS, no retention, every full "
            "block stored, LRU. Both get the same host bytes, "
            f"{h.get('host_kv_multiple', 0):g}x the cell's device KV (an HGX H100 node has "
            "2 TB of RAM for 8 GPUs, 256 GB a GPU). A load copies at "
            f"{h.get('pcie_bandwidth', 0) / 1e9:.0f} GB/s (PCIe Gen5 x16, effective) plus "
            f"{h.get('pcie_latency', 0) * 1e6:.0f} µs a {h['block']}-token block "
            f"({h['kv_bytes_per_token'] * h['block'] / 2**20:.0f} MiB): "
            f"{h100_copy_rate() / 1e3:.0f} k tokens/s, overlapping other requests' steps; "
            "these are assumptions, not fits. No file tier is modelled (vLLM's "
            "`TieringOffloadingSpec` files are not a baseline here). `microagent-tier` runs "
            f"at {', '.join(f'{x:g}x' for x in TIER_RATES['microagent-tier'])} the rate "
            "(the cache kept), for its programs/min at `vllm-offload`'s p95. "
            + (
                "Run on a shorter window (a fraction of the others'): "
                + ", ".join(f"{k} {v:g}" for k, v in sorted(short.items()))
                + "."
                if short
                else ""
            ),
        ]
    lines += ["", "| target | measured | met | note |", "|---|---|---|---|"]
    for t in data.get("targets", []):
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {t['measured']} | {met} | {t.get('why') or ''} |")
    for part, name in (("real", "the real engine's runs"), ("projection", "the projection")):
        if data.get(part, {}).get("machine"):
            lines += ["", f"Machine for {name}: {machine_sentence(data[part]['machine'])}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the projection")
    parser.add_argument(
        "--window-scale", type=float, default=1.0, help="of the projection's window (--quick: 0.1)"
    )
    parser.add_argument("--skip-real", action="store_true", help="reuse the JSON's real cells")
    parser.add_argument("--skip-projection", action="store_true")
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=PROJ_POLICIES,
        default=list(PROJ_POLICIES),
        help="project only these; the JSON's cells of the others are kept",
    )
    parser.add_argument(
        "--shapes", nargs="+", choices=("bfcl", "swe"), default=["bfcl", "swe"],
        help="project only these shapes (the JSON's other cells are kept)",
    )  # fmt: skip
    parser.add_argument(
        "--pressures", nargs="+", type=float, default=list(PROJ_PRESSURES),
        help="project only these pressures (the JSON's other cells are kept)",
    )  # fmt: skip
    parser.add_argument(
        "--tier-rates", nargs="+", type=float, default=None,
        help="microagent-tier's rate multiples (default: "
        + ", ".join(f"{x:g}" for x in TIER_RATES["microagent-tier"]) + ")",
    )  # fmt: skip
    parser.add_argument(
        "--real-tier",
        action="store_true",
        help=f"run the real {CAL_TIER_POLICY} calibration cell alone, keep the other real cells",
    )
    parser.add_argument(
        "--probe-only", action="store_true", help="probe and fit again, keep the real cells"
    )
    parser.add_argument("--update", action="store_true", help="rewrite the agents page and row")
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--out", type=Path, default=RESULTS_FILE)
    args = parser.parse_args()
    started = time.time()
    load = os.getloadavg()[0]
    if load > 0.5 and not args.force and not args.skip_real:
        raise SystemExit(f"load average {load:.2f} > 0.5: not a quiet machine (--force)")
    data: dict[str, Any] = read_results(args.out) if args.out.exists() else {}
    if args.probe_only:
        import anyio

        data["real"] |= anyio.run(reprobe)
    elif args.real_tier:
        import anyio

        kept = [c for c in data["real"]["cells"] if c["system"] != CAL_TIER_POLICY]
        data["real"]["cells"] = kept + anyio.run(real_tier_cells, None)
    elif not args.skip_real:
        import anyio

        data["real"] = anyio.run(real_cells, None)
    if "real" in data:
        sim = sim_calibration(data["real"])
        data["simulated"] = sim
        data["calibration"] = calibration_rows(data["real"]["cells"], sim)
    if not args.skip_projection:
        kept = data.get("projection", {}).get("cells", [])
        scale_window = 0.1 if args.quick else args.window_scale
        data["projection"] = projection(
            scale_window,
            args.policies,
            kept,
            shapes=args.shapes,
            pressures=args.pressures,
            tier_rates=args.tier_rates,
            kept_settings=data.get("projection", {}).get("settings"),
        )
    record = machine(round(load, 2), args.force, started)
    if args.real_tier:
        data["real"]["tier_machine"] = record
    elif args.probe_only or not args.skip_real:
        data["real"]["machine"] = record
    if not args.skip_projection:
        data["projection"]["machine"] = record
    data["targets"] = targets(data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # compact, as bench/quality.py writes its per-item rows: the projection holds every turn
    write_results(args.out, data)
    text = tables(data)
    print(text)
    if args.update:  # the agents family page holds the simulation's tables
        from agents import family_report

        publish(HERE.parent, family_report())


if __name__ == "__main__":
    main()
