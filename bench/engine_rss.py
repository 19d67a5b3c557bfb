"""Why the CPU engine's RSS grows: vLLM's oneDNN matmuls at many batch sizes, per allocator.

The soak (``bench/soak.py``) found the engine processes' RSS growing over thousands
of requests while everything of ours came back to its starting level; the growth is
in vLLM's CPU worker (the EngineCore's own RSS stays flat). This isolates it: the
default model's 120 linear layers (30 layers × qkv, o, gate-up, down: SmolLM2-135M's
shapes, random bf16 weights) as vLLM's CPU backend builds them (``ops.create_onednn_mm``
with its 32-entry per-layer cache), then ``calls`` forward passes, each at a new
random batch token count M in 1..2048 (what a step of mixed prefill and decode is).
One fresh subprocess per allocator:

- ``glibc``: the system's malloc;
- ``glibc-fixed-threshold``: glibc with ``MALLOC_TRIM_THRESHOLD_`` set (which fixes
  the mmap threshold: large blocks go back to the kernel at once);
- ``tcmalloc``: ``LD_PRELOAD`` of the system's tcmalloc (``engine_allocator``);
- ``tcmalloc, oneDNN cache 64``: tcmalloc with oneDNN's process-wide primitive
  cache capped (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, default 1024), as microagent's
  engine processes run (``engine_bridge.vllm._compat.cpu_engine_environment``).

Prints RSS growth and time per call; writes ``bench/results/engine_rss.json``;
``--update`` writes its family page and headline row (``bench/report.py``). About 2
minutes per allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from _sections import (  # noqa: E402
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    page,
    publish,
    quiet_load,
    x,
)

#: (in, out) features of one SmolLM2-135M decoder layer's linears: qkv, o, gate-up, down
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
LAYERS = 30

PROBE = r"""
import json, random, sys, time, torch
from vllm import _custom_ops as ops

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

calls, every, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
shapes = json.loads(sys.argv[4])
layers = []
for _ in range(int(sys.argv[5])):
    for k, n in shapes:
        w = torch.randn(n, k, dtype=torch.bfloat16)
        layers.append((ops.create_onednn_mm(w.t(), 32), k, w))
base = rss()
rng = random.Random(seed)
t0 = time.monotonic()
points = []
for i in range(1, calls + 1):
    m = rng.randint(1, 2048)
    for handler, k, _ in layers:
        ops.onednn_mm(handler, torch.randn(m, k, dtype=torch.bfloat16), None)
    if i % every == 0:
        points.append([i, round(rss() - base, 1), round(time.monotonic() - t0, 2)])
print(json.dumps({"base_mb": round(base, 1), "points": points}))
"""


def variants() -> dict[str, dict[str, str]]:
    """allocator name -> environment changes of its subprocess."""
    out: dict[str, dict[str, str]] = {
        "glibc": {},
        "glibc-fixed-threshold": {"MALLOC_TRIM_THRESHOLD_": "131072"},
    }
    from microagent.engine_bridge.vllm._compat import (
        ENGINE_ONEDNN_CACHE,
        cpu_engine_environment,
        engine_allocator,
    )

    lib = engine_allocator()  # the library microagent's engine processes preload
    if lib is not None:
        out["tcmalloc"] = {"LD_PRELOAD": lib}
        # and the environment they get: oneDNN's cache capped
        out[f"tcmalloc, oneDNN cache {ENGINE_ONEDNN_CACHE}"] = {
            "LD_PRELOAD": lib,
            **cpu_engine_environment(),
        }
    return out


def run_variant(env_changes: dict[str, str], calls: int, every: int, seed: int) -> Any:
    from microagent.engine_bridge.vllm._compat import ONEDNN_CACHE_ENV

    unset = ("LD_PRELOAD", "MALLOC_TRIM_THRESHOLD_", ONEDNN_CACHE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(env_changes)
    args = [str(calls), str(every), str(seed), json.dumps(SHAPES), str(LAYERS)]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def tables(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        f"{LAYERS * len(SHAPES)} oneDNN linears of the default model's shapes, "
        f"{s['calls']} forward passes at random batch token counts 1..2048 (seed "
        f"{s['seed']}), one fresh process per allocator; machine: {s['cpus']} CPUs, "
        f"load average {s['load_before']:.2f} at start.",
        "",
        "| allocator | RSS at start (MiB) | "
        + " | ".join(f"+MiB after {p[0]}" for p in data["runs"][0]["points"])
        + " | ms per pass |",
        "|---|---|" + "---|" * len(data["runs"][0]["points"]) + "---|",
    ]
    for run in data["runs"]:
        pts = run["points"]
        per_call = pts[-1][2] / pts[-1][0] * 1000
        cells = " | ".join(f"{p[1]:.0f}" for p in pts)
        lines.append(f"| {run['allocator']} | {run['base_mb']:.0f} | {cells} | {per_call:.0f} |")
    lines.append("")
    lines.append("Data: `bench/results/engine_rss.json`.")
    return "\n".join(lines) + "\n"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The engine-RSS page and headline, from ``engine_rss.json`` in ``results``."""
    data = json.loads((results / "engine_rss.json").read_text())
    growth = {run["allocator"]: run["points"][-1][1] for run in data["runs"]}
    ours = next(name for name in growth if "cache" in name)
    passes = data["runs"][0]["points"][-1][0]
    s = data["settings"]
    return FamilyReport(
        family="engine_rss",
        title="The CPU engine's RSS per allocator",
        headline=Headline(
            figure=f"engine RSS growth over {passes} passes, {ours} (as microagent runs)",
            value=f"{x(growth[ours] / max(1.0, growth['glibc']))} ({growth[ours]:.0f} MiB)",
            baseline=f"glibc's malloc ({growth['glibc']:.0f} MiB)",
            target="none (a diagnosis)",
            machine=f"{s['cpus']} CPUs, load {s['load_before']:.2f}",
            date=date_cell({}),
        ),
        summary=(
            "What the soak's engine growth is made of, outside any server: vLLM's oneDNN "
            "linears at random batch sizes, one fresh process per allocator. "
            + ", ".join(f"{name} +{mib:.0f} MiB" for name, mib in growth.items())
            + "."
        ),
        page=page(
            "The CPU engine's RSS per batch shape and allocator (`bench/engine_rss.py`)",
            __doc__,
            [("Results", tables(data) + "\n" + data_line("engine_rss.json"))],
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="forward passes (200)")
    parser.add_argument("--every", type=int, default=40, help="passes per sample")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args(argv)
    load = quiet_load(args.force, 0.5)
    if load is None:
        return 2
    runs = []
    for name, env in variants().items():
        t0 = time.monotonic()
        got = run_variant(env, args.calls, args.every, args.seed)
        runs.append({"allocator": name, "env": env, **got})
        last = got["points"][-1]
        print(
            f"{name:22s} start {got['base_mb']:.0f} MiB, +{last[1]:.0f} MiB after {last[0]} "
            f"passes, {time.monotonic() - t0:.0f} s",
            flush=True,
        )
    data = {
        "settings": {
            "calls": args.calls,
            "every": args.every,
            "seed": args.seed,
            "cpus": os.cpu_count(),
            "load_before": load,
        },
        "runs": runs,
        "command": "python bench/engine_rss.py " + " ".join(sys.argv[1:]),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engine_rss.json").write_text(json.dumps(data, indent=1))
    md = tables(data)
    print(md)
    if args.update:
        publish(HERE.parent, family_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
