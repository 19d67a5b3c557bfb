"""Accuracy of collaboration strategies vs a single call on the default model (issue 14).

Runs, on the real engine in-process (the embedded SmolLM2-135M-Instruct, the
same ``VLLMBridge`` settings as ``bench/collab.py``), every method on the same
closed questions: a greedy single call, a sampled single call, vote-5, vote-5
debiased (``debias: order`` and ``labels``), a full vote-9 (from which vote-5,
the exact early stop and the adaptive rules are *replayed* on the very same
samples), the adaptive vote itself (``adaptive: window`` and ``beta``, up to 9
voters), debate (3 agents, 2 rounds), the soft vote-5 over lettered options
(``soft: true, debias: labels``, uncalibrated and ``calibrate: position``),
best-of-5 judged by the model itself (``best_of``, ``judge: self``) and the
``auto`` mode. Every answer is constrained to the question's choices; voters
answer directly (``style: direct``).

Pairing: every method answers the same items (``--seed`` fixes the question
sets, ``--reps`` repeats them); results keep per-item correctness so any two
methods are compared with an exact McNemar test on the same items. Sampling
itself is not seeded (the collaboration layer passes no per-request seed, and
seeds are refused on vLLM's CPU backend), so two runs of a sampled method
differ; ``--reps`` measures how much.

Accuracy is not a timing number: it stays valid on a busy machine. The JSON
still records the load average before and after each method.

Usage: ``.venv/bin/python bench/accuracy.py [--easy 60] [--mc 0] [--reps 1]
[--methods a,b] [--out accuracy] [--update]``. Writes
``bench/results/<out>.json`` and ``<out>_tables.md``; ``--update`` rewrites
its family page and headline row (``bench/_accuracy_report.py``, ``bench/report.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _accuracy_report as R  # noqa: E402
from _accuracy_tasks import Item, easy_set, mc_set  # noqa: E402
from _sections import FamilyReport, Headline, data_line, date_cell, machine_cell, page, publish  # noqa: E402

RESULTS = HERE / "results"
TEMPERATURE = 0.7
ANSWER_TOKENS = 8
DEBATE_TOKENS = 48
CONCURRENCY = 8  # collaborations in flight at once (the engine batches their requests)

#: method -> (mode, options); every vote is direct and constrained to the item's choices
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "greedy": ("vote", {"voters": 1, "temperature": 0.0}),
    "single": ("vote", {"voters": 1}),
    "vote5": ("vote", {"voters": 5, "early_stop": False}),
    "vote5-debias": ("vote", {"voters": 5, "early_stop": False, "debias": "order"}),
    "vote5-labels": ("vote", {"voters": 5, "early_stop": False, "debias": "labels"}),
    "vote9": ("vote", {"voters": 9, "early_stop": False}),
    "adaptive9-window": ("vote", {"voters": 9, "adaptive": "window", "wave": 3}),
    "adaptive9-beta": ("vote", {"voters": 9, "adaptive": "beta", "wave": 2}),
    "debate3x2": ("debate", {"agents": 3, "rounds": 2}),
    "soft5-labels": ("vote", {"voters": 5, "early_stop": False, "debias": "labels", "soft": True}),
    "soft5-labels-cal": (
        "vote",
        {"voters": 5, "debias": "labels", "soft": True, "calibrate": "position"},
    ),
    "best5-self": ("best_of", {"agents": 5, "judge": "self"}),
    "auto": ("auto", {"agents": 5}),
}
#: the roles whose answers are a method's samples, in agent order
SAMPLE_ROLES = ("voter", "debater", "candidate")
#: replayed on the full vote-9's samples (voter order): name -> replay() options
REPLAYS: dict[str, dict[str, Any]] = {
    "vote5 (replay, full)": {"voters": 5, "wave": 5, "exact": False},
    "vote5 exact stop (replay)": {"voters": 5, "wave": 1},
    "vote9 exact stop (replay)": {"voters": 9, "wave": 1},
    "window w3 (replay)": {"voters": 9, "wave": 3, "rule": "window"},
    "beta 0.95 w1 (replay)": {"voters": 9, "wave": 1, "rule": "beta"},
    "beta 0.95 w2 (replay)": {"voters": 9, "wave": 2, "rule": "beta"},
    "beta 0.9 w1 (replay)": {"voters": 9, "wave": 1, "rule": "beta", "confidence": 0.9},
}


async def run_one(bridge: Any, method: str, item: Item) -> dict[str, Any]:
    import microagent as M

    mode, options = METHODS[method]
    opts = dict(options)
    t0 = time.monotonic()
    if mode == "vote":
        opts.setdefault("temperature", TEMPERATURE)
        out = await M.vote(
            bridge,
            item.question,
            choices=list(item.choices),
            style="direct",
            max_tokens=ANSWER_TOKENS,
            answer_tokens=ANSWER_TOKENS,
            **opts,
        )
    elif mode == "debate":
        out = await M.debate(
            bridge,
            item.question,
            max_tokens=DEBATE_TOKENS,
            temperature=TEMPERATURE,
            answer={"choices": list(item.choices)},
            **opts,
        )
    else:  # best_of, auto: their agents as a count, every answer constrained to the choices
        agents = [{"name": "agent", "count": opts.pop("agents")}]
        if mode == "best_of":
            opts["answer_tokens"] = ANSWER_TOKENS
        out = await M.collaborate(
            bridge,
            mode,
            item.question,
            agents,
            answer={"choices": list(item.choices)},
            max_tokens=ANSWER_TOKENS,
            temperature=TEMPERATURE,
            **opts,
        )
    return outcome_row(method, item, out, time.monotonic() - t0)


def outcome_row(method: str, item: Item, out: Any, seconds: float) -> dict[str, Any]:
    """One result row: the outcome's answer, its samples, costs and diagnostics (shared with
    ``bench/quality.py``)."""
    voters = [a for a in out.agents if a.role in SAMPLE_ROLES]
    extra: dict[str, Any] = {}
    if "soft" in out.details:
        extra["soft"] = out.details["soft"]
        extra["ballots"] = out.details["ballots"]
    if "candidates" in out.details:
        extra["candidates"] = [
            {"answer": c["answer"], "score": c.get("score")} for c in out.details["candidates"]
        ]
    if "strategy" in out.details:
        extra["strategy"] = out.details["strategy"]
    if "path" in out.details:  # compute: the calculator's answer, or the direct (greedy) one
        extra["path"] = out.details["path"]
    return {
        "method": method,
        "item": item.id,
        "family": item.family,
        "answer": out.answer,
        "correct": out.answer == item.answer,
        "ordered": [a.answer or "" for a in voters],
        "samples": out.details.get("samples", len(voters)),
        "stopped_by": out.details.get("stopped_by"),
        "debiased": "debias" in out.details,
        "rounds": out.rounds,
        "prompt_tokens": out.usage.prompt_tokens,
        "cached_tokens": out.usage.cached_tokens,
        "completion_tokens": out.usage.completion_tokens,
        "seconds": round(seconds, 3),
        **extra,
    }


async def run_method(bridge: Any, method: str, items: list[Item], rep: int) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def guarded(item: Item) -> dict[str, Any]:
        async with sem:
            row = await run_one(bridge, method, item)
            row["rep"] = rep
            return row

    return list(await asyncio.gather(*(guarded(i) for i in items)))


def seam_check(bridge: Any) -> dict[str, Any]:
    """The tail of one debate round-2 prompt as the engine saw it (the seam fix, on real ids)."""
    for gen in getattr(bridge, "generations", []):
        text = bridge.detokenize(gen.request.prompt.token_ids)
        if "These are the answers of the other agents" in text:
            at = text.index("These are the answers of the other agents")
            return {"round2_prompt_around_instruction": text[max(0, at - 80) : at + 60]}
    return {}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from _collab_engines import SETTINGS, make_bridge

    items = easy_set(args.easy, args.seed) + mc_set(args.mc, args.mc_seed)
    methods = args.methods.split(",") if args.methods else list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {list(METHODS)}")
    bridge = make_bridge()
    rows: list[dict[str, Any]] = []
    loads: dict[str, list[float]] = {}
    seam: dict[str, Any] = {}
    t_start = time.monotonic()
    await bridge.open()
    try:
        print(f"engine up after {time.monotonic() - t_start:.0f} s", flush=True)
        for rep in range(args.reps):
            for method in methods:
                before = os.getloadavg()[0]
                t0 = time.monotonic()
                got = await run_method(bridge, method, items, rep)
                rows += got
                loads.setdefault(method, []).extend([before, os.getloadavg()[0]])
                acc = sum(r["correct"] for r in got) / len(got)
                print(
                    f"rep {rep} {method:18s} acc {acc:.3f}  {time.monotonic() - t0:6.1f} s  "
                    f"load {before:.2f}",
                    flush=True,
                )
                if method.startswith("debate") and not seam:
                    seam = seam_check(bridge)
                bridge.generations.clear()  # kept per method only: instrumentation
    finally:
        await bridge.close()
    return {
        "settings": {
            "model": "default (SmolLM2-135M-Instruct, embedded)",
            "engine": SETTINGS,
            "temperature": TEMPERATURE,
            "answer_tokens": ANSWER_TOKENS,
            "debate_tokens": DEBATE_TOKENS,
            "style": "direct",
            "easy": args.easy,
            "mc": args.mc,
            "seed": args.seed,
            "mc_seed": args.mc_seed,
            "reps": args.reps,
            "methods": {m: {"mode": METHODS[m][0], **METHODS[m][1]} for m in methods},
            "replays": REPLAYS,
            "sampling_seeded": False,
        },
        "items": [item.__dict__ for item in items],
        "rows": rows,
        "seam_check": seam,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_per_method": {m: [round(x, 2) for x in v] for m, v in loads.items()},
            "loadavg_at_end": round(os.getloadavg()[0], 2),
            "seconds": round(time.monotonic() - t_start),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        },
        "command": "python bench/accuracy.py " + " ".join(sys.argv[1:]),
    }


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The accuracy page and headline, from ``accuracy.json`` in ``results``."""
    data = json.loads((results / "accuracy.json").read_text())
    summary = R.summarize(data, data["rows"])
    qset, methods = max(summary.items(), key=lambda kv: kv[1]["greedy"]["n"])
    base = max(R.BASELINES, key=lambda b: methods[b]["accuracy"])
    best = max((m for m in methods if m not in R.BASELINES), key=lambda m: methods[m]["accuracy"])
    points = 100 * (methods[best]["accuracy"] - methods[base]["accuracy"])
    test = methods[best].get(f"vs_{base}")
    p = f", McNemar p={test['p']:.2g}" if test else ""
    return FamilyReport(
        family="accuracy",
        title="Accuracy of collaboration strategies",
        headline=Headline(
            figure=f"accuracy of the best strategy ({best}), {methods[best]['n']} {qset} items",
            value=f"{methods[best]['accuracy']:.3f} ({points:+.1f} points{p})",
            baseline=f"one {base} call: {methods[base]['accuracy']:.3f}",
            target="none (a comparison)",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"Every strategy on the same closed questions as a single call, paired item by item "
            f"(exact McNemar tests). On the {qset} set the best, {best}, is {points:+.1f} points "
            f"from the stronger single call ({base}){p}."
        ),
        page=page(
            "Accuracy of collaboration strategies (`bench/accuracy.py`)",
            __doc__,
            [("Results", R.tables(data) + "\n" + data_line("accuracy.json"))],
        ),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--easy", type=int, default=60, help="easy closed questions (default 60)")
    ap.add_argument("--mc", type=int, default=0, help="benchmark multiple-choice items (0..240)")
    ap.add_argument("--seed", type=int, default=14, help="seed of the easy question set")
    ap.add_argument("--mc-seed", type=int, default=1234, help="seed of the 240 MC items")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--methods", default="", help=f"comma-separated subset of {list(METHODS)}")
    ap.add_argument("--out", default="accuracy")
    ap.add_argument("--update", action="store_true", help="rewrite the family page and row")
    ap.add_argument(
        "--report-only", action="store_true", help="no engine: tables from the existing JSON"
    )
    args = ap.parse_args()
    path = RESULTS / f"{args.out}.json"
    if args.report_only:
        data = json.loads(path.read_text())
    else:
        data = asyncio.run(main_async(args))
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, separators=(",", ":")))  # compact: per-item rows
    tables = R.tables(data)
    (RESULTS / f"{args.out}_tables.md").write_text(tables)
    print(tables)
    if args.update and args.out == "accuracy":
        publish(HERE.parent, family_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
