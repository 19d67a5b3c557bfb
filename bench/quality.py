"""Quality of collaboration strategies vs a single call, per task family (issues 14, 30).

Greedy decoding (temperature 0) is the baseline every claim is made against;
the sampled single call stays beside it. Families come in two sets
(issue 30): *selection* families (``_quality_tasks``), where configurations
and ``auto``'s rules are chosen, and *report* families
(``_quality_report_families``: ``--families report``), generated from their own
seed and frozen (their items' hash committed and checked here) before any
selection, never used for a choice. The published numbers are the report
families'. ``compute``/``compute3``/``auto5-calc`` are the program-aided
methods (the sandboxed calculator); ``soft2-content`` is the closed-choice
configuration published before issue 30. A published file's ``serve_args``
(``microagent serve`` options its request needs over HTTP, e.g.
``--calculator``) are parsed by serve's own parser and recorded in the JSON;
this bench runs in process, through the function the server calls.

Runs every method on the same generated questions (``bench/_quality_tasks.py``:
one family after another, ``--items`` each, fixed by ``--seed``) on the real
engine in-process: the embedded default model (SmolLM2-135M-Instruct) behind the
same ``VLLMBridge`` settings as ``bench/collab.py``. Every method is a
collaboration given as the HTTP request's fields (``agents`` + ``collaboration``,
plus ``temperature`` and ``max_tokens``), run through ``collaborate()``, the
function the server calls. Which methods run on a family depends on its kind
(``METHODS_BY_KIND``): on closed families every answer is constrained to the
item's choices (``METHODS``); free families (``FREE_METHODS``: a city, a number)
and the JSON family (``JSON_METHODS``: ``extract``) have no choices, and their
answers are graded by ``_quality_tasks.grade``.

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

Free answers: the baselines are one unconstrained call (``auto`` with one agent:
the question alone, a single sample), as are best-of-N's candidates; ``vote5`` is
self-consistency over the normalised answers (``vote`` adds "Answer concisely."),
``vote5-adaptive`` the same with early-stopping self-consistency's window rule in
waves of 2 (at 5 voters the Beta rule could stop no earlier than the exact one);
on numeric families (``_quality_tasks.NUMERIC``) the ``-number`` votes tally the
reply's last number (``answer.extract: number``) instead of the whole reply, so
"3 + 1 = 4" and "The answer is 4." are one vote for 4; ``best5-self`` best-of-5
judged by the model's P(yes); ``best2-likelihood`` and ``best3-likelihood`` best-of-N
scored by the candidates' own likelihood, summed per answer (``judge: likelihood``,
soft self-consistency: no judge request); ``best3-likelihood-greedy`` the same over
one greedy candidate and two samples, and ``-adaptive`` in waves of two, the third
candidate only when the first two leave the answer open (published for free answers
as ``bench/results/quality_best_free.json``); on ``extract``
``best5-validator`` and ``reflect-validator`` use the JSON-schema validator the
request carries (``EXTRACT_SCHEMA``), and ``auto5`` gets it too. Votes are not run
on ``extract``: a vote's answer is the normalised text (lower-cased, punctuation
dropped), which is no longer JSON.

Sampling is not seeded (seeds are refused on vLLM's CPU backend), so two runs
of a sampled method differ; pairs (McNemar) are the same items.

Usage: ``.venv/bin/python bench/quality.py [--quick] [--items 200]
[--families a,b|all|free] [--methods a,b] [--out quality] [--update] [--force]``.
``all`` is every closed family, ``free`` every free one. Writes
``bench/results/<out>.json``, ``<out>_tables.md`` and ``<out>.png`` (``<out>`` by
default: ``quality``, or ``quality_free`` when every family is free, so a free run
never replaces the closed one; ``_quick`` added by ``--quick``); ``--update``
rewrites the quality family page (every ``quality*`` run) and its headline row.
Refuses to start when the 1-minute load average is 1 or more (``--force``; the JSON says so).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _quality_report as R  # noqa: E402
import _quality_report_families as F  # noqa: E402
import _quality_tasks as T  # noqa: E402
from _accuracy_tasks import Item  # noqa: E402
from _quality_http import ServedModel  # noqa: E402
from _quality_tasks import FAMILIES, FREE, PROBED, quality_set  # noqa: E402
from _sections import (  # noqa: E402
    RESULTS_LINK,
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine,
    machine_cell,
    page,
    publish,
    quiet_load,
)
from accuracy import outcome_row  # noqa: E402
from microagent.evaluation import (  # noqa: E402
    BUILTIN,
    GREEDY_CANDIDATE,
    EvalItem,
    candidate_from_dict,
    request_for,
)
from microagent.server import serve_options  # noqa: E402

RESULTS = HERE / "results"
BEST = RESULTS / "quality_best.json"
#: the published free-answer configuration: ``FREE_METHODS["best3-likelihood-greedy-adaptive"]``
BEST_FREE = RESULTS / "quality_best_free.json"
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


def _with_greedy(sampled: int, **collaboration: Any) -> dict[str, Any]:
    """Best-of by likelihood over one greedy candidate and ``sampled`` samples."""
    return {
        "agents": [
            {"name": "greedy", "count": 1, "temperature": 0.0},
            {"name": "sampled", "count": sampled},
        ],
        "collaboration": {"mode": "best_of", "judge": "likelihood", **collaboration},
    }


#: program-aided (``compute``): one greedy solver writes arithmetic, the sandboxed calculator
#: evaluates it; a question with nothing to compute gets the greedy call's answer
#: (``microagent eval``'s built-in candidate of the same name)
COMPUTE: dict[str, Any] = BUILTIN["compute"].closed.to_dict()
#: the same with two sampled solvers beside the greedy one: their values are voted
COMPUTE3: dict[str, Any] = {
    "agents": [
        {"name": "greedy", "count": 1, "temperature": 0.0},
        {"name": "sampled", "count": 2},
    ],
    "collaboration": {"mode": "compute"},
}
#: the server options the calculator methods need over HTTP (``serve_args`` when published)
CALCULATOR_ARGS = ["--calculator"]

#: method -> request fields (agents, collaboration, optionally temperature);
#: answer.choices is added per item
METHODS: dict[str, dict[str, Any]] = {
    "greedy": GREEDY_CANDIDATE.closed.to_dict(),  # microagent eval's baseline
    "single": _vote(1),
    "greedy-labels": {**_vote(1, debias="labels"), "temperature": 0.0},
    "vote5": _vote(5, early_stop=False),
    "debias5-order": _vote(5, early_stop=False, debias="order"),
    "debias5-labels": _vote(5, early_stop=False, debias="labels"),
    "soft5": _vote(5, early_stop=False, soft=True),
    "best": {},  # the published configuration, read from quality_best.json
    # the closed configuration published before issue 30 (chosen on the selection families)
    "soft2-content": {
        **_vote(2, debias="order", soft=True, calibrate="content", answer_tokens=1),
        "max_tokens": 8,
    },
    "compute": COMPUTE,
    "compute3": COMPUTE3,
    "auto5-calc": _team("auto", 5, calculator=True),
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
#: the methods of a report run (``--families report``): the baselines, the published
#: configuration, the one it replaced and the calculator's variants
REPORT_METHODS = (
    "greedy",
    "single",
    "best",
    "soft2-content",
    "best3-likelihood-greedy-adaptive",
    "compute",
    "compute3",
    "auto5-calc",
)

#: the request's validator on ``extract``: its answer must be JSON valid against the schema
SCHEMA_VALIDATOR: dict[str, Any] = {"type": "json_schema", "schema": T.EXTRACT_SCHEMA}
#: one unconstrained call: ``auto`` with one agent and no validator is a single sample
_ONE = _team("auto", 1)
#: free-answer families (a city, a number): method -> request fields (no answer.choices)
FREE_METHODS: dict[str, dict[str, Any]] = {
    "greedy": GREEDY_CANDIDATE.free.to_dict(),  # microagent eval's baseline
    "single": _ONE,
    "vote3": _vote(3, early_stop=False),  # self-consistency within the 3x token bound
    "vote5": _vote(5, early_stop=False),
    "vote5-adaptive": _vote(5, adaptive="window", wave=2),
    # numeric families only (``T.NUMERIC``): the tally reads the reply's last number
    "vote3-number": _vote(3, early_stop=False, answer={"extract": "number"}),
    "vote5-number": _vote(5, early_stop=False, answer={"extract": "number"}),
    "vote5-number-adaptive": _vote(5, adaptive="window", wave=2, answer={"extract": "number"}),
    "best5-self": _team("best_of", 5, judge="self"),
    # the candidates' own likelihood, summed per answer (soft self-consistency): no judge step
    "best2-likelihood": _team("best_of", 2, judge="likelihood"),
    "best3-likelihood": _team("best_of", 3, judge="likelihood"),
    "best5-likelihood": _team("best_of", 5, judge="likelihood"),  # best5-self's budget
    # one greedy candidate and two samples: the samples outvote the mode only together
    "best3-likelihood-greedy": _with_greedy(2),
    # the same in waves of 2: the third candidate only when the first two leave it open;
    # published for free answers (``BEST_FREE``), read from the file as a client reads it
    "best3-likelihood-greedy-adaptive": _with_greedy(2, adaptive=True),
    "best3-likelihood-number": _team(
        "best_of", 3, judge="likelihood", answer={"extract": "number"}
    ),
    "auto5": _team("auto", 5),
    "best": {},  # the published configuration, read from quality_best_free.json
    "compute": COMPUTE,
    "compute3": COMPUTE3,
    "auto5-calc": _team("auto", 5, calculator=True),
}
#: free methods that read a number (``answer.extract: number``): run on numeric families only
NUMBER_METHODS = frozenset(
    m
    for m, fields in FREE_METHODS.items()
    if fields and fields["collaboration"].get("answer", {}).get("extract") == "number"
)
#: the JSON family (``extract``): no votes (their answer is normalised text, not JSON)
JSON_METHODS: dict[str, dict[str, Any]] = {
    "greedy": GREEDY_CANDIDATE.free.to_dict(),
    "single": _ONE,
    "best5-self": _team("best_of", 5, judge="self"),
    "best5-validator": _team("best_of", 5, validator=SCHEMA_VALIDATOR),
    "best3-likelihood": _team("best_of", 3, judge="likelihood"),
    "best3-likelihood-validator": _team(
        "best_of", 3, judge="likelihood", validator=SCHEMA_VALIDATOR
    ),
    "reflect-validator": {
        "agents": [{"name": "drafter"}, {"name": "critic"}],
        "collaboration": {"mode": "reflect", "validator": SCHEMA_VALIDATOR},
    },
    "auto5": _team("auto", 5, validator=SCHEMA_VALIDATOR),
}
#: a family's kind (``_quality_tasks.kind``) -> the methods that fit it; the others are not
#: run on it (and its tables have no row for them)
METHODS_BY_KIND: dict[str, dict[str, dict[str, Any]]] = {
    "closed": METHODS,
    "free": FREE_METHODS,
    "json": JSON_METHODS,
}
#: every method name, in run order
ALL_METHODS = tuple(dict.fromkeys(m for table in METHODS_BY_KIND.values() for m in table))


def methods_for(family: str, chosen: list[str] | None, quick: bool = False) -> list[str]:
    """The methods run on ``family``: those of ``chosen`` that fit its kind (``None``: the
    kind's defaults: ``REPORT_METHODS`` on report families, ``QUICK_METHODS``/``FULL_METHODS``
    on closed ones, all otherwise)."""
    table = METHODS_BY_KIND[T.kind(family)]
    if chosen is None and family in F.REPORT_FAMILIES:
        chosen = list(REPORT_METHODS)
    if chosen is None:
        if table is METHODS:
            return list(QUICK_METHODS if quick else FULL_METHODS)
        chosen = list(table)
    return [m for m in chosen if m in table and (m not in NUMBER_METHODS or family in T.NUMERIC)]


def fields_of(method: str, family: str) -> dict[str, Any]:
    """The request fields of ``method`` on ``family`` (before the item's choices)."""
    if method == "best":
        return published(T.kind(family))
    return METHODS_BY_KIND[T.kind(family)][method]


def published(kind: str = "closed") -> dict[str, Any]:
    """The published configuration for closed (``quality_best.json``) or free questions
    (``quality_best_free.json``): the request fields, less ``serve_args``, the server
    options it needs over HTTP (checked by ``serve_args``)."""
    return copy.deepcopy(_published_file(kind))


@functools.cache
def _published_file(kind: str) -> dict[str, Any]:
    """A published file's request fields, read and its ``serve_args`` checked once per run."""
    best: dict[str, Any] = json.loads((BEST if kind == "closed" else BEST_FREE).read_text())
    serve_args(best)
    best.pop("serve_args", None)
    return best


def serve_args(config: dict[str, Any]) -> list[str]:
    """A published file's ``serve_args`` (``[]`` without), parsed by ``microagent serve``'s
    own parser so that a typo fails here, not for the user who copies it."""
    args = config.get("serve_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SystemExit(f"serve_args must be a list of strings, got {args!r}")
    try:
        serve_options(args)
    except ValueError as exc:
        raise SystemExit(f"serve_args {args}: microagent serve refuses them: {exc}") from None
    return list(args)


def request_of(method: str, item: Item) -> dict[str, Any]:
    """The request fields of ``method`` for ``item`` (what a client would send).

    Closed items add their choices as ``answer.choices``; free ones have none and get
    their family's completion budget (``_quality_tasks.MAX_TOKENS``), which is also a
    direct vote's ``answer_tokens`` (a direct voter's whole answer).
    """
    fields = fields_of(method, item.family)
    # the request microagent eval sends (``request_for``): choices added, budgets set
    candidate = candidate_from_dict(
        {k: v for k, v in fields.items() if k != "max_tokens" or item.choices}, method, method
    )
    budget = MAX_TOKENS if item.choices else T.MAX_TOKENS[item.family]
    question = EvalItem(0, item.question, (item.answer,), item.choices, item.family)
    request = request_for(candidate, question, budget)
    return {
        "agents": list(request.agents),
        "collaboration": request.collaboration,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
    }


async def run_one(bridge: Any, method: str, item: Item) -> dict[str, Any]:
    """``method`` on ``item`` through ``collaborate()``; a refused configuration is a row too."""
    import microagent as M

    body = request_of(method, item)
    options = dict(body["collaboration"])
    mode = options.pop("mode")
    t0 = time.monotonic()
    try:
        if isinstance(bridge, ServedModel):  # --http: the same fields, as a client sends them
            out = await bridge.collaborate(body, item)
        else:
            out = await M.collaborate(
                bridge,
                mode,
                item.question,
                body["agents"],
                temperature=body["temperature"],
                max_tokens=body["max_tokens"],
                **options,
            )
    except (M.InvalidCollaboration, ValueError) as exc:  # a configuration refusing the item
        return {"method": method, "item": item.id, "family": item.family, "refused": str(exc)}
    row: dict[str, Any] = outcome_row(method, item, out, time.monotonic() - t0)
    if not item.choices:  # a free answer: graded (closed ones are the choice itself)
        row.update(T.grade(item, out.answer))
    return row


async def run_method(bridge: Any, method: str, items: list[Item]) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def guarded(item: Item) -> dict[str, Any]:
        async with sem:
            row = await run_one(bridge, method, item)
            row["rep"] = 0
            return row

    return list(await asyncio.gather(*(guarded(i) for i in items)))


def parse_families(text: str) -> tuple[str, ...]:
    """``--families``: names, ``all`` (every closed family) or ``free`` (every free one)."""
    if not text:
        return FAMILIES
    out: list[str] = []
    for name in text.split(","):
        out += (
            list(PROBED)
            if name == "all"
            else list(FREE)
            if name == "free"
            else list(F.REPORT_FAMILIES)
            if name == "report"
            else [name]
        )
    for family in out:
        T.kind(family)  # raises on an unknown family
    return tuple(dict.fromkeys(out))


async def main_async(args: argparse.Namespace, chosen: list[str] | None) -> dict[str, Any]:
    from _collab_engines import SETTINGS, make_bridge

    families = parse_families(args.families)
    plan = {f: methods_for(f, chosen, args.quick) for f in families}
    methods = list(dict.fromkeys(m for f in families for m in plan[f]))
    first = {m: next(f for f in families if m in plan[f]) for m in methods}
    items = quality_set(args.items, args.seed, families)
    report = [f for f in families if f in F.REPORT_FAMILIES]
    if report:  # the report families must be the frozen ones
        frozen = F.items_hash(F.report_items())
        if frozen != F.REPORT_HASH:
            raise SystemExit(
                f"the report families' items hash to {frozen}, not the frozen {F.REPORT_HASH}: "
                "a generator or the seed changed after they were frozen"
            )
    published_args = sorted(
        {a for path in (BEST, BEST_FREE) for a in serve_args(json.loads(path.read_text()))}
    )
    bridge: Any = (
        ServedModel(published_args, RESULTS / "quality-serve.log", engine=args.engine)
        if args.http
        else make_bridge()
    )
    rows: list[dict[str, Any]] = []
    loads: dict[str, list[float]] = {}
    t_start = time.monotonic()
    await bridge.open()
    try:
        print(f"engine up after {time.monotonic() - t_start:.0f} s", flush=True)
        for method in methods:
            before = os.getloadavg()[0]
            t0 = time.monotonic()
            got = await run_method(bridge, method, [i for i in items if method in plan[i.family]])
            rows += got
            loads[method] = [round(before, 2), round(os.getloadavg()[0], 2)]
            for family in (f for f in families if method in plan[f]):
                mine = [r for r in got if r["family"] == family and "refused" not in r]
                acc = sum(r["correct"] for r in mine) / len(mine) if mine else float("nan")
                print(f"{method:18s} {family:10s} acc {acc:.3f}", flush=True)
            print(f"{method:18s} {time.monotonic() - t0:6.1f} s  load {before:.2f}", flush=True)
            if not args.http:
                bridge.generations.clear()  # kept per method only: instrumentation
    finally:
        await bridge.close()
    return {
        "settings": {
            "model": "default (SmolLM2-135M-Instruct, embedded)",
            "engine": SETTINGS,
            "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS,
            "max_tokens_per_family": {f: T.MAX_TOKENS.get(f, MAX_TOKENS) for f in families},
            "items_per_family": args.items,
            "families": list(families),
            "seed": args.seed,
            # each method's fields on the first family it runs on; ``requests``: per family
            "methods": {m: fields_of(m, first[m]) for m in methods},
            "requests": {
                f: {m: request_of(m, next(i for i in items if i.family == f)) for m in plan[f]}
                for f in families
            },
            "sampling_seeded": False,
            # in process (collaborate(), the function the server calls) or over HTTP
            "path": "http" if args.http else "in-process",
            # report families: generated from their own frozen seed, never used for a choice
            "report_families": report,
            "report_seed": F.REPORT_SEED if report else None,
            "report_hash": F.REPORT_HASH if report else None,
            "tool_families": sorted(set(report) & F.TOOL_FAMILIES),
            # what the published configurations need from a server (``serve_args``)
            "serve_args": {
                "best": serve_args(json.loads(BEST.read_text())),
                "best_free": serve_args(json.loads(BEST_FREE.read_text())),
            },
        },
        "items": [item.__dict__ for item in items],
        "rows": rows,
        "loadavg_per_method": loads,
        "command": "python bench/quality.py " + " ".join(sys.argv[1:]),
    }


#: The runs the family page shows first, in this order; the other ``quality*`` runs follow.
FIRST = ("quality_report", "quality_selection_calc", "quality", "quality_free")


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The quality page (every run in ``results``) and its headline, from the report run."""
    runs = sorted(
        (p.stem for p in results.glob("quality*.json") if "rows" in json.loads(p.read_text())),
        key=lambda stem: (FIRST.index(stem) if stem in FIRST else len(FIRST), stem),
    )
    parts = []
    for stem in runs:
        run = json.loads((results / f"{stem}.json").read_text())
        plot = f"![accuracy against tokens]({RESULTS_LINK}/{stem}.png)\n"
        body = R.tables(run) + "\n" + plot + "\n" + data_line(f"{stem}.json")
        parts.append((f"`--out {stem}`", body))
    data = json.loads((results / "quality_report.json").read_text())
    beat, worse, refused = data["targets"]
    return FamilyReport(
        family="quality",
        title="Quality of collaboration strategies per task family",
        headline=Headline(
            figure="`best` (the published configuration): families it beats greedy on",
            value=str(beat["measured"]),
            baseline="one greedy call (temperature 0)",
            target=">= 2 families by >= 8 points, p < 0.05: "
            + ("met" if beat["met"] else "not met"),
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"Every strategy against one greedy call on task families held out from the "
            f"selection, paired item by item. `best` beats greedy on {beat['measured']}; "
            f"worse on: {worse['measured']}; refused: {refused['measured']}. The page also "
            f"holds the selection runs ({len(runs)} runs in all)."
        ),
        page=page("Quality of collaboration strategies (`bench/quality.py`)", __doc__, parts),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} items per family")
    ap.add_argument("--items", type=int, default=0, help=f"items per family ({FULL_ITEMS})")
    ap.add_argument(
        "--families",
        default="",
        help=f"comma-separated subset of {[*PROBED, *FREE, *F.REPORT_FAMILIES]}; all (closed "
        "selection families), free (free selection families) or report (the frozen report "
        "families)",
    )
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--methods", default="", help=f"comma-separated subset of {list(ALL_METHODS)}")
    ap.add_argument("--out", default="")
    ap.add_argument("--update", action="store_true", help="rewrite the family page and row")
    ap.add_argument("--force", action="store_true", help="run even on a busy machine")
    ap.add_argument("--report-only", action="store_true", help="tables from the existing JSON")
    ap.add_argument(
        "--http",
        action="store_true",
        help="through microagent serve, started with the published files' serve_args",
    )
    ap.add_argument(
        "--engine", choices=("vllm", "scripted"), default="vllm", help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    args.items = args.items or (QUICK_ITEMS if args.quick else FULL_ITEMS)
    free = all(T.kind(f) != "closed" for f in parse_families(args.families))
    name = "quality_free" if free else "quality"  # a free-only run never replaces the closed one
    out = args.out or (f"{name}_quick" if args.quick else name)
    chosen = args.methods.split(",") if args.methods else None
    unknown = [m for m in chosen or () if m not in ALL_METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {list(ALL_METHODS)}")
    path = RESULTS / f"{out}.json"
    if args.report_only:
        data = json.loads(path.read_text())
    else:
        load = quiet_load(args.force, 1.0)
        if load is None:
            return 2
        started = time.time()
        data = asyncio.run(main_async(args, chosen))
        data["machine"] = machine(load, bool(args.force and load >= 1.0), started)
        data["targets"] = R.report_targets(data)
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, separators=(",", ":")))  # compact: per-item rows
    tables = R.tables(data)
    (RESULTS / f"{out}_tables.md").write_text(tables)
    R.plot(data, RESULTS / f"{out}.png")
    print(tables)
    if args.update:
        publish(HERE.parent, family_report())
        if data["settings"].get("report_families"):  # the page publishes report runs only
            R.update_quality_page(
                HERE.parent / "docs" / "quality.md", tables, f"bench/results/{out}.json"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
