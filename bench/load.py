"""Collaborations under load: KV retention and least-attained-service scheduling, on and off.

Open-loop Poisson arrivals of a workload mix (vote-5 reason-then-answer,
debate 3×2, aggregate 3+1), each collaboration on its own ~1 500-token
context, on one in-process vLLM engine whose KV cache is sized so that the
live working set is larger than the cache. Two configurations on identical
engine settings, interleaved, paired (the same arrival times and contexts):

* ``microagent``: retention on (half the KV cache) and ``ServicePolicy()``;
* ``ablation``: retention off (``VLLMBridge(retention=0)``: vLLM's own
  scheduler and LRU cache) and ``ServicePolicy(enabled=False)`` (the
  critical-path priorities alone).

This is an ablation of what the in-engine design adds, not yet the
comparison with client code on vLLM's own server (issue 12 asks for both;
the client side is not measured here). Per configuration and rate:
collaborations/min, p50/p95/p99 latency, prompt tokens computed, tokens
recomputed after eviction, preemptions, retained-hit tokens. Writes
``bench/results/load[_quick].json``, a Markdown table and a latency-vs-
throughput PNG; ``--update`` rewrites the load section of BENCHMARKS.md.

Refuses to start when the 1-minute load average is above 0.5 (``--force``
to override; then the table says so).

Usage: ``.venv/bin/python bench/load.py [--quick] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _load_report as R  # noqa: E402
from _sections import machine  # noqa: E402

RESULTS = HERE / "results"
WORDS = [
    "river", "mountain", "lantern", "harbor", "copper", "meadow", "orbit", "signal", "cedar",
    "quartz", "falcon", "ember", "glacier", "prairie", "beacon", "willow", "canyon", "marble",
    "thistle", "comet",
]  # fmt: skip
MIX = ("vote5-reason", "debate3x2", "aggregate3+1")


def context_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return (
        f"Incident report {seed}. {body}.\n\n"
        "Question: is the incident above resolved, yes or no? Explain briefly."
    )


def arrivals(rate_per_s: float, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


async def one(bridge: Any, kind: str, context: str, policy: Any) -> dict[str, Any]:
    from microagent.collab import AgentSpec, collaborate

    common: dict[str, Any] = {"max_tokens": 40, "temperature": 0.7, "scheduling": policy}
    if kind == "vote5-reason":
        outcome = await collaborate(
            bridge,
            "vote",
            context,
            [AgentSpec("voter", count=5)],
            answer={"choices": ["yes", "no"]},
            style="reason",
            answer_tokens=4,
            **common,
        )
    elif kind == "debate3x2":
        outcome = await collaborate(
            bridge,
            "debate",
            context,
            [AgentSpec("d", count=3)],
            rounds=2,
            early_stop=False,
            **common,
        )
    else:
        outcome = await collaborate(
            bridge,
            "aggregate",
            context,
            [AgentSpec("proposer", count=3), AgentSpec("aggregator", role="aggregator")],
            **common,
        )
    u = outcome.usage
    return {
        "prompt": u.prompt_tokens,
        "computed": u.computed_prompt_tokens,
        "completion": u.completion_tokens,
    }


async def run_config(
    bridge: Any, policy: Any, schedule: list[tuple[float, str, str]]
) -> dict[str, Any]:
    before = bridge.stats()
    latencies: list[float] = []
    usage: list[dict[str, Any]] = []
    failures = 0
    t0 = time.monotonic()

    async def launch(at: float, kind: str, context: str) -> None:
        nonlocal failures
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        start = time.monotonic()
        try:
            usage.append(await one(bridge, kind, context, policy))
            latencies.append(time.monotonic() - start)
        except Exception as exc:  # counted and reported, never hidden
            failures += 1
            print(f"  failed: {type(exc).__name__}: {exc}", flush=True)

    await asyncio.gather(*(launch(*item) for item in schedule))
    wall = time.monotonic() - t0
    after = bridge.stats()
    retention = await bridge.retention_stats()
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [0.0] * 99
    return {
        "completed": len(latencies),
        "failed": failures,
        "wall_s": wall,
        "per_min": 60.0 * len(latencies) / wall if wall else 0.0,
        "p50_s": statistics.median(latencies) if latencies else 0.0,
        "p95_s": q[94],
        "p99_s": q[98],
        "prompt_tokens": after.prompt_tokens - before.prompt_tokens,
        "computed_tokens": after.computed_prompt_tokens - before.computed_prompt_tokens,
        "recomputed_tokens": after.recomputed_tokens - before.recomputed_tokens,
        "retained_hit_tokens": after.retained_hit_tokens - before.retained_hit_tokens,
        "preemptions": after.preemptions - before.preemptions,
        "released": dict(retention.released),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from microagent.collab import ServicePolicy
    from microagent.engine_bridge import VLLMBridge

    engine = {"num_gpu_blocks_override": args.blocks}
    configs = {
        "microagent": (
            VLLMBridge(max_num_seqs=8, max_model_len=4096, engine_args=engine, progress=False),
            ServicePolicy(),
        ),
        "ablation": (
            VLLMBridge(
                max_num_seqs=8, max_model_len=4096, engine_args=engine, retention=0, progress=False
            ),
            ServicePolicy(enabled=False),
        ),
    }
    runs: list[dict[str, Any]] = []
    for name, (bridge, _) in configs.items():
        t = time.monotonic()
        await bridge.open()
        print(f"{name}: engine started in {time.monotonic() - t:.0f} s", flush=True)
    try:
        for rep in range(args.reps):
            for rate in args.rates:
                seed = 1000 * rep + int(rate * 100)
                times = arrivals(rate / 60.0, args.count, seed)
                kinds = [MIX[i % len(MIX)] for i in range(args.count)]
                order = list(configs) if rep % 2 == 0 else list(reversed(configs))
                for name in order:  # interleaved; the same arrivals, fresh contexts per system
                    bridge, policy = configs[name]
                    schedule = [
                        (
                            at,
                            kind,
                            context_text(
                                seed * 100 + i + (7 if name == "ablation" else 0), args.words
                            ),
                        )
                        for i, (at, kind) in enumerate(zip(times, kinds, strict=True))
                    ]
                    load = os.getloadavg()[0]
                    result = await run_config(bridge, policy, schedule)
                    result.update(system=name, rate_per_min=rate, rep=rep, loadavg_before=load)
                    runs.append(result)
                    print(
                        f"rep {rep} rate {rate}/min {name}: {result['completed']} done, "
                        f"p50 {result['p50_s']:.1f} s, p95 {result['p95_s']:.1f} s, "
                        f"recomputed {result['recomputed_tokens']}, "
                        f"preempted {result['preemptions']}",
                        flush=True,
                    )
    finally:
        for bridge, _ in configs.values():
            await bridge.close()
    return {
        "runs": runs,
        "settings": {
            "rates_per_min": args.rates,
            "collaborations_per_run": args.count,
            "reps": args.reps,
            "kv_blocks": args.blocks,
            "block_tokens": 128,
            "context_words": args.words,
            "mix": list(MIX),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rates, 9 collaborations, 1 rep")
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="per minute")
    parser.add_argument("--count", type=int, default=None, help="collaborations per run")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=40, help="KV cache blocks (128 tokens)")
    parser.add_argument("--words", type=int, default=700, help="context words (~1.5k tokens)")
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite BENCHMARKS.md's section")
    args = parser.parse_args()
    args.rates = args.rates or ([6.0, 12.0] if args.quick else [4.0, 8.0, 12.0, 16.0])
    args.count = args.count or (9 if args.quick else 18)
    args.reps = args.reps or (1 if args.quick else 3)
    load = os.getloadavg()[0]
    if load > 0.5 and not args.force:
        print(f"load average {load:.2f} > 0.5: the machine is not quiet; refusing", file=sys.stderr)
        return 2
    started = time.time()
    data = asyncio.run(main_async(args))
    data["machine"] = machine(load, bool(args.force and load > 0.5), started)
    RESULTS.mkdir(exist_ok=True)
    stem = "load_quick" if args.quick else "load"
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2))
    tables = R.tables(data)
    (RESULTS / f"{stem}_tables.md").write_text(tables)
    R.plot(data, RESULTS / f"{stem}.png")
    print(tables)
    if args.update:
        R.update_benchmarks(HERE.parent / "BENCHMARKS.md", tables, f"bench/results/{stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
