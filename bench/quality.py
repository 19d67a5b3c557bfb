"""Quality of collaboration strategies vs a single call, per task family (issue 14).

Runs every method on the same generated closed questions (``bench/_quality_tasks.py``:
one family after another, ``--items`` each, fixed by ``--seed``) on the real
engine in-process: the embedded default model (SmolLM2-135M-Instruct) behind the
same ``VLLMBridge`` settings as ``bench/collab.py``. Every method is a
collaboration given as the HTTP request's fields (``agents`` + ``collaboration``,
plus ``temperature`` and ``max_tokens``), run through ``collaborate()``, the
function the server calls; every answer is constrained to the item's choices.

Baselines: ``greedy`` (one voter, temperature 0) and ``single`` (one voter at the
collaboration default, temperature 0.7): a single constrained call, the same
path as every other method. ``greedy-labels`` is the greedy call given the
lettered options that ``debias: labels`` uses, so that a gain of a debiased soft
vote can be told apart from a gain of the lettered format alone.

``best`` is the published configuration, read from ``bench/results/quality_best.json``
(the exact request fields), so the numbers reported for it are the ones a
client gets: two voters, one per order of the choices (``debias: order``), soft
votes read from one-token answers, each order's content-free prior divided out
(``calibrate: content``). Best-of-N with a validator is not run: on closed questions the only
validator is the answer key.

Sampling is not seeded (seeds are refused on vLLM's CPU backend), so two runs
of a sampled method differ; pairs (McNemar) are the same items.

Usage: ``.venv/bin/python bench/quality.py [--quick] [--items 200]
[--families a,b] [--methods a,b] [--out quality] [--update] [--force]``.
Writes ``bench/results/<out>.json``, ``<out>_tables.md`` and ``<out>.png``;
``--update`` rewrites BENCHMARKS.md's generated section. Refuses to start when
the 1-minute load average is 1 or more (``--force``; the JSON says so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _quality_report as R  # noqa: E402
from _accuracy_tasks import Item  # noqa: E402
from _quality_tasks import FAMILIES, PROBED, quality_set  # noqa: E402
from _sections import machine  # noqa: E402
from accuracy import outcome_row  # noqa: E402

RESULTS = HERE / "results"
BEST = RESULTS / "quality_best.json"
TEMPERATURE = 0.7
MAX_TOKENS = 8
CONCURRENCY = 8  # collaborations in flight at once (the engine batches their requests)
QUICK_ITEMS = 40
FULL_ITEMS = 200


def _vote(n: int, **collaboration: Any) -> dict[str, Any]:
    return {
        "agents": [{"name": "voter", "count": n}],
        "collaboration": {"mode": "vote", "style": "direct", **collaboration},
    }


def _team(mode: str, n: int, **collaboration: Any) -> dict[str, Any]:
    return {
        "agents": [{"name": "agent", "count": n}],
        "collaboration": {"mode": mode, **collaboration},
    }


#: method -> request fields (agents, collaboration, optionally temperature);
#: answer.choices is added per item
METHODS: dict[str, dict[str, Any]] = {
    "greedy": {**_vote(1), "temperature": 0.0},
    "single": _vote(1),
    "greedy-labels": {**_vote(1, debias="labels"), "temperature": 0.0},
    "vote5": _vote(5, early_stop=False),
    "debias5-order": _vote(5, early_stop=False, debias="order"),
    "debias5-labels": _vote(5, early_stop=False, debias="labels"),
    "soft5": _vote(5, early_stop=False, soft=True),
    "best": {},  # read from quality_best.json: vote-2, debias order, soft, content-calibrated
    "soft2-order": _vote(2, early_stop=False, debias="order", soft=True),
    "soft2-labels": _vote(2, early_stop=False, debias="labels", soft=True),
    "soft4-order-cal": _vote(4, debias="order", soft=True, calibrate="position"),
    "soft1-content": _vote(1, soft=True, calibrate="content"),
    "adaptive9": _vote(9, adaptive="beta", wave=2),
    "best5-self": _team("best_of", 5, judge="self", answer_tokens=MAX_TOKENS),
    "auto5": _team("auto", 5),
}
#: the methods of --quick (every method; fewer items)
QUICK_METHODS = tuple(METHODS)
#: the methods of the full run (sized to fit about 30 minutes): the lettered votes beyond
#: greedy-labels and the position-calibrated soft vote are --quick only
FULL_METHODS = tuple(
    m for m in METHODS if m not in ("debias5-labels", "soft2-labels", "soft4-order-cal")
)


def published() -> dict[str, Any]:
    """The published closed-choice configuration: ``agents``, ``collaboration``, ``max_tokens``."""
    best: dict[str, Any] = json.loads(BEST.read_text())
    return best


def request_of(method: str, item: Item) -> dict[str, Any]:
    """The request fields of ``method`` for ``item`` (what a client would send)."""
    fields = published() if method == "best" else METHODS[method]
    collaboration = dict(fields["collaboration"])
    collaboration["answer"] = {**collaboration.get("answer", {}), "choices": list(item.choices)}
    return {
        "agents": fields["agents"],
        "collaboration": collaboration,
        "temperature": fields.get("temperature", TEMPERATURE),
        "max_tokens": fields.get("max_tokens", MAX_TOKENS),
    }


async def run_one(bridge: Any, method: str, item: Item) -> dict[str, Any]:
    """``method`` on ``item`` through ``collaborate()``; a refused configuration is a row too."""
    import microagent as M

    body = request_of(method, item)
    options = dict(body["collaboration"])
    mode = options.pop("mode")
    t0 = time.monotonic()
    try:
        out = await M.collaborate(
            bridge,
            mode,
            item.question,
            body["agents"],
            temperature=body["temperature"],
            max_tokens=body["max_tokens"],
            **options,
        )
    except M.InvalidCollaboration as exc:  # e.g. soft votes over choices sharing a first token
        return {"method": method, "item": item.id, "family": item.family, "refused": str(exc)}
    row: dict[str, Any] = outcome_row(method, item, out, time.monotonic() - t0)
    return row


async def run_method(bridge: Any, method: str, items: list[Item]) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def guarded(item: Item) -> dict[str, Any]:
        async with sem:
            row = await run_one(bridge, method, item)
            row["rep"] = 0
            return row

    return list(await asyncio.gather(*(guarded(i) for i in items)))


async def main_async(args: argparse.Namespace, methods: list[str]) -> dict[str, Any]:
    from _collab_engines import SETTINGS, make_bridge

    if args.families == "all":
        families = tuple(PROBED)
    else:
        families = tuple(args.families.split(",")) if args.families else FAMILIES
    items = quality_set(args.items, args.seed, families)
    bridge = make_bridge()
    rows: list[dict[str, Any]] = []
    loads: dict[str, list[float]] = {}
    t_start = time.monotonic()
    await bridge.open()
    try:
        print(f"engine up after {time.monotonic() - t_start:.0f} s", flush=True)
        for method in methods:
            before = os.getloadavg()[0]
            t0 = time.monotonic()
            got = await run_method(bridge, method, items)
            rows += got
            loads[method] = [round(before, 2), round(os.getloadavg()[0], 2)]
            for family in families:
                mine = [r for r in got if r["family"] == family and "refused" not in r]
                acc = sum(r["correct"] for r in mine) / len(mine) if mine else float("nan")
                print(f"{method:18s} {family:10s} acc {acc:.3f}", flush=True)
            print(f"{method:18s} {time.monotonic() - t0:6.1f} s  load {before:.2f}", flush=True)
            bridge.generations.clear()  # kept per method only: instrumentation
    finally:
        await bridge.close()
    return {
        "settings": {
            "model": "default (SmolLM2-135M-Instruct, embedded)",
            "engine": SETTINGS,
            "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS,
            "items_per_family": args.items,
            "families": list(families),
            "seed": args.seed,
            "methods": {m: published() if m == "best" else METHODS[m] for m in methods},
            "sampling_seeded": False,
        },
        "items": [item.__dict__ for item in items],
        "rows": rows,
        "loadavg_per_method": loads,
        "command": "python bench/quality.py " + " ".join(sys.argv[1:]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} items per family")
    ap.add_argument("--items", type=int, default=0, help=f"items per family ({FULL_ITEMS})")
    ap.add_argument(
        "--families", default="", help=f"comma-separated subset of {list(PROBED)}, or all"
    )
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--methods", default="", help=f"comma-separated subset of {list(METHODS)}")
    ap.add_argument("--out", default="")
    ap.add_argument("--update", action="store_true", help="rewrite BENCHMARKS.md's section")
    ap.add_argument("--force", action="store_true", help="run even on a busy machine")
    ap.add_argument("--report-only", action="store_true", help="tables from the existing JSON")
    args = ap.parse_args()
    args.items = args.items or (QUICK_ITEMS if args.quick else FULL_ITEMS)
    out = args.out or ("quality_quick" if args.quick else "quality")
    default = QUICK_METHODS if args.quick else FULL_METHODS
    methods = args.methods.split(",") if args.methods else list(default)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {list(METHODS)}")
    path = RESULTS / f"{out}.json"
    if args.report_only:
        data = json.loads(path.read_text())
    else:
        load = os.getloadavg()[0]
        if load >= 1.0 and not args.force:
            print(
                f"load average {load:.2f} >= 1: the machine is not quiet; refusing", file=sys.stderr
            )
            return 2
        started = time.time()
        data = asyncio.run(main_async(args, methods))
        data["machine"] = machine(load, bool(args.force and load >= 1.0), started)
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, separators=(",", ":")))  # compact: per-item rows
    tables = R.tables(data)
    (RESULTS / f"{out}_tables.md").write_text(tables)
    R.plot(data, RESULTS / f"{out}.png")
    print(tables)
    if args.update:
        R.update_benchmarks(HERE.parent / "BENCHMARKS.md", tables, f"bench/results/{out}.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
