"""Issue 40's quality report, run through ``microagent eval``: does a collaboration pay?

The benchmark is a user of ``microagent.evaluation`` (the code path of
``microagent eval``): its questions are an items list, its configurations
candidates, and ``evaluate()`` runs them in process on one ``VLLMBridge`` (the
default model, the bench engine settings), chooses on the selection part and
reports on the report part. Nothing here scores or chooses by itself.

- **Report part** (pinned ``part: report``): the frozen report families, 120
  items each: the first four (``_quality_report_families``: product, convert,
  shopping, passage) and issue 40's five (``_quality_report_checks``: steps,
  factor, dates, count and the control plural), hashes checked before a run.
- **Selection part** (pinned ``part: selection``): other draws of the same
  generators (another seed; any question equal to a reported one dropped), where
  ``evaluate()`` chooses the published configuration, among the candidates within
  3x greedy's completion tokens there (``max_token_ratio``). Nothing else is chosen.
  ``convert`` and the control have few distinct questions, nearly all reported, so
  they contribute few or no selection items.
- **Candidates**: ``compute`` (one greedy solver, one expression, the verifier on)
  and ``compute-steps`` (the same solver writing up to three named steps); the
  published one is ``evaluate()``'s choice among them on the selection part.
- **Abstainers**: five sampled voters with an agreement gate (0.6 or 0.8) that
  abstain below it: the abstention cell, never published; the gate reported is
  chosen on the selection part (``choose_abstainer``).
- **Stages** (one journal): everything on the selection part; then greedy and the
  published choice on every item; then greedy and the abstainer on every item.
  Each stage's report is replayed from the journal at the end.

Targets (issue 40), computed per family for the chosen configuration against
greedy: ≥ 8 points on ≥ 2 families, each significant after a Holm correction over
all nine; on every family the lower bound of the 95 % interval of the difference
(Newcombe's paired hybrid score) above −3 points and nothing refused; completion
tokens ≤ 3x greedy's; with abstention, accuracy when answered ≥ greedy + 10 points
at ≥ 70 % coverage on ≥ 2 families and above greedy's own log-probability
cut-off at the same coverage; a replay of the recorded journal reproduces the
report exactly.

Usage: ``.venv/bin/python bench/quality_checks.py [--items 120] [--select 20]
[--out quality_checks] [--force] [--report-only] [--update]``. Writes
``bench/results/<out>.json`` (settings, machine, the eval report, per-family
rows, targets), the journal ``<out>_journal.jsonl`` (every reply: what a replay
reads) and ``<out>_tables.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import _quality_report_checks as C
import _quality_report_families as F
import attrs
from _accuracy_tasks import Item
from _collab_engines import SETTINGS
from _sections import (
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine,
    machine_cell,
    page,
    publish,
)
from microagent.evaluation import (
    BUILTIN,
    GREEDY_CANDIDATE,
    BridgeRunner,
    Candidate,
    Choice,
    EvalItem,
    EvalReport,
    PairedTable,
    candidate_from_dict,
    choose,
    evaluate,
    holm,
    paired_difference_interval,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: the completion budget of configurations that set none (a free answer's number)
MAX_TOKENS = 12
#: collaborations in flight (the engine batches up to max_num_seqs requests)
CONCURRENCY = 12
#: the published configuration's token budget (issue 40: <= 3x greedy's), applied by the
#: selection rule on the selection part
TOKEN_BUDGET = 3.0
#: the old report families' selection draws use this seed (their reports use theirs)
OLD_SELECTION_SEED = 41
FAMILIES = (*F.REPORT_FAMILIES, *C.CHECKS_FAMILIES)
#: the abstaining candidates' names start so: reported for coverage, never published
ABSTAINER = "vote5-abstain"
#: the abstention target's least coverage (also what an abstainer must reach on selection)
MIN_COVERAGE = 0.70
SOURCE = "bench/quality_checks.py"


def candidates() -> list[Candidate]:
    """The configurations the published one is chosen from (see the module docstring)."""
    steps = candidate_from_dict(
        {
            "agents": [{"name": "solver", "count": 1, "temperature": 0.0}],
            "collaboration": {"mode": "compute", "steps": 3},
            "serve_args": ["--calculator"],
        },
        SOURCE,
        "compute-steps",
    )
    return [BUILTIN["compute"], steps]


def abstainers() -> list[Candidate]:
    """Five sampled voters with an agreement gate that abstains below it (two gates: the
    one reported is chosen on the selection part)."""
    return [
        candidate_from_dict(
            {
                "agents": [{"name": "voter", "count": 5}],
                "collaboration": {
                    "mode": "vote",
                    "style": "direct",
                    "gate": gate,
                    "below": "abstain",
                },
                "temperature": 0.7,
            },
            SOURCE,
            f"{ABSTAINER}-{int(gate * 100)}",
        )
        for gate in (0.6, 0.8)
    ]


def choose_abstainer(selection_rows: list[dict[str, Any]]) -> str:
    """The abstainer reported: on the selection part, the highest accuracy when answered
    among those answering at least ``MIN_COVERAGE`` (the highest coverage if none does)."""
    names = sorted({r["config"] for r in selection_rows if r["config"].startswith(ABSTAINER)})

    def numbers(name: str) -> tuple[float, float]:
        mine = [r for r in selection_rows if r["config"] == name]
        answered = [r for r in mine if _answered(r)]
        coverage = len(answered) / len(mine) if mine else 0.0
        right = sum(bool(r["correct"]) for r in answered) / len(answered) if answered else 0.0
        return coverage, right

    covering = [n for n in names if numbers(n)[0] >= MIN_COVERAGE]
    if covering:
        return max(covering, key=lambda n: (numbers(n)[1], n))
    return max(names, key=lambda n: (numbers(n)[0], n))


def _answered(row: dict[str, Any]) -> bool:
    return not row["abstained"] and row["refused"] is None and row["failed"] is None


def _old_selection(family: str, n: int) -> list[Item]:
    _, make = F.REPORT_FAMILIES[family]
    rng = random.Random(f"{OLD_SELECTION_SEED}-{family}")
    reported = {i.question for i in F.report_family_items(family, F.REPORT_ITEMS)}
    drawn = [make(rng, i) for i in range(4 * n)]
    return [i for i in drawn if i.question not in reported][:n]


def items(report: int, select: int) -> list[EvalItem]:
    """The run's items: the frozen report items, then the selection draws, pinned."""
    for name, got, want in (
        ("report", F.items_hash(F.report_items()), F.REPORT_HASH),
        ("checks", C.items_hash(C.checks_items()), C.CHECKS_HASH),
    ):
        if got != want:
            raise SystemExit(f"the {name} families' items hash to {got}, not the frozen {want}")
    reported = [
        *F.report_items(report),
        *C.checks_items(report),
    ]
    chosen_on = [
        *(i for f in F.REPORT_FAMILIES for i in _old_selection(f, select)),
        *C.selection_items(select),
    ]
    out: list[EvalItem] = []
    for part, group in (("report", reported), ("selection", chosen_on)):
        for item in group:
            out.append(
                EvalItem(
                    line=len(out) + 1,
                    question=item.question,
                    answers=(item.answer,),
                    choices=item.choices,
                    family=item.family,
                    part=part,
                )
            )
    return out


def _logprob(row: dict[str, Any]) -> float:
    """A greedy reply's answer log-probability (none recorded: ranked last)."""
    value = row.get("logprob")
    return float("-inf") if value is None else float(value)


def family_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family and configuration on the report part: accuracy, coverage, the paired
    comparison with greedy (difference, its interval, McNemar p and Holm-adjusted p),
    tokens against greedy's, and greedy's accuracy at the configuration's coverage when
    ranked by its own log-probability."""
    abstention = data.get("abstention", {"rows": [], "candidates": []})
    rows = [r for r in (*data["report"]["rows"], *abstention["rows"]) if r["part"] == "report"]
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["config"], r["family"]), {})[r["line"]] = r
    configs = list(
        dict.fromkeys(c["name"] for c in (*data["report"]["candidates"], *abstention["candidates"]))
    )
    out: list[dict[str, Any]] = []
    for config in configs:
        per: list[dict[str, Any]] = []
        for family in FAMILIES:
            mine, base = by.get((config, family), {}), by.get(("greedy", family), {})
            lines = sorted(base)
            if not lines:
                continue
            right = [bool(mine[k]["correct"]) for k in lines]
            greedy = [bool(base[k]["correct"]) for k in lines]
            table = PairedTable.of(right, greedy)
            answered = [
                ok
                for ok, k in zip(right, lines, strict=True)
                if not mine[k]["abstained"]
                and mine[k]["refused"] is None
                and mine[k]["failed"] is None
            ]
            n = len(lines)
            coverage = len(answered) / n
            ranked = sorted(lines, key=lambda k: -_logprob(base[k]))
            top = ranked[: round(coverage * n)]
            greedy_tokens = sum(base[k]["completion_tokens"] for k in lines)
            low, high = paired_difference_interval(table)
            per.append(
                {
                    "config": config,
                    "family": family,
                    "n": n,
                    "accuracy": sum(right) / n,
                    "greedy": sum(greedy) / n,
                    "difference": (sum(right) - sum(greedy)) / n,
                    "interval": [low, high],
                    "paired": [table.both, table.only_greedy, table.only_candidate, table.neither],
                    "p": table.p,
                    "coverage": coverage,
                    "accuracy_when_answered": sum(answered) / len(answered) if answered else None,
                    "greedy_at_coverage": (
                        sum(bool(base[k]["correct"]) for k in top) / len(top) if top else None
                    ),
                    "greedy_has_logprobs": all(base[k].get("logprob") is not None for k in lines),
                    "refused": sum(mine[k]["refused"] is not None for k in lines),
                    "tokens_vs_greedy": (
                        sum(mine[k]["completion_tokens"] for k in lines) / greedy_tokens
                        if greedy_tokens
                        else None
                    ),
                }
            )
        for row, adjusted in zip(per, holm([r["p"] for r in per]), strict=True):
            row["p_holm"] = adjusted
        out += per
    return out


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 40's targets, from the JSON alone."""
    chosen = data["published"]["name"]
    rows = [r for r in data["families"] if r["config"] == chosen]
    report = {r["name"]: r for r in data["report"]["report"]}
    if chosen == "greedy":
        beat_text = "nothing beat greedy on the selection part: greedy is the published choice"
        beat: list[str] = []
    else:
        beat = [
            f"{r['family']} ({100 * r['difference']:+.1f} points, Holm p={r['p_holm']:.2g})"
            for r in rows
            if r["difference"] >= 0.08 and r["p_holm"] < 0.05
        ]
        beat_text = ", ".join(beat) or "none"
    refused = sum(r["refused"] for r in rows)
    if chosen == "greedy":
        worst_text, worst_met = "greedy is the published configuration: no difference", True
    else:
        worst = min(rows, key=lambda r: r["interval"][0])
        worst_text = (
            f"lowest bound {100 * worst['interval'][0]:+.1f} points ({worst['family']}); "
            f"{refused} refused"
        )
        worst_met = worst["interval"][0] > -0.03 and refused == 0
    tokens = report[chosen]["tokens_vs_greedy"] if chosen != "greedy" else 1.0
    abstainer = data.get("abstainer", ABSTAINER)
    gated = [r for r in data["families"] if r["config"] == abstainer]
    confident = [
        r
        for r in gated
        if r["coverage"] >= 0.70
        and r["accuracy_when_answered"] is not None
        and r["accuracy_when_answered"] >= r["greedy"] + 0.10
        and r["greedy_at_coverage"] is not None
        and r["accuracy_when_answered"] > r["greedy_at_coverage"]
    ]
    replay = data.get("replay", {})
    return [
        {
            "target": f"the published configuration ({chosen}) beats greedy by >= 8 points on "
            ">= 2 families, each significant after a Holm correction over all families",
            "measured": beat_text,
            "met": len(beat) >= 2,
        },
        {
            "target": "on every family (the control included) the 95 % interval of the "
            "difference from greedy has its lower bound above -3 points; nothing refused",
            "measured": worst_text,
            "met": worst_met,
        },
        {
            "target": "completion tokens <= 3x greedy's",
            "measured": f"{tokens:.2f}x" if tokens is not None else "n/a",
            "met": tokens is not None and tokens <= 3.0,
        },
        {
            "target": f"with abstention ({abstainer}): accuracy when answered >= greedy + 10 "
            "points at >= 70 % coverage on >= 2 families, and above greedy's log-probability "
            "cut-off at the same coverage",
            "measured": ", ".join(
                f"{r['family']} ({r['accuracy_when_answered']:.3f} at {r['coverage']:.0%} vs "
                f"greedy {r['greedy']:.3f}, cut-off {r['greedy_at_coverage']:.3f})"
                for r in confident
            )
            or "none",
            "met": len(confident) >= 2,
        },
        {
            "target": "a replay of the recorded replies reproduces the report exactly",
            "measured": replay.get("measured", "not run"),
            "met": bool(replay.get("identical")),
        },
    ]


def tables(data: dict[str, Any]) -> str:
    """The family table of the chosen and the abstaining configuration, and the targets."""
    chosen = data["published"]["name"]
    lines = [
        f"Chosen on the selection part: **{chosen}** ({data['published']['reason']}). "
        f"Abstainer: **{data.get('abstainer', ABSTAINER)}**.",
        "",
        "| configuration | family | greedy | accuracy | difference (95 % CI) | McNemar p "
        "| Holm p | coverage | when answered | greedy at coverage | tokens vs greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["families"]:
        if r["config"] == "greedy":
            continue
        awa = r["accuracy_when_answered"]
        cut = r["greedy_at_coverage"]
        cost = r["tokens_vs_greedy"]
        lines.append(
            f"| {r['config']} | {r['family']} | {r['greedy']:.3f} | {r['accuracy']:.3f} | "
            f"{100 * r['difference']:+.1f} ({100 * r['interval'][0]:+.1f}, "
            f"{100 * r['interval'][1]:+.1f}) | {r['p']:.2g} | {r['p_holm']:.2g} | "
            f"{r['coverage']:.0%} | {'-' if awa is None else f'{awa:.3f}'} | "
            f"{'-' if cut is None else f'{cut:.3f}'} | "
            f"{'-' if cost is None else f'{cost:.2f}x'} |"
        )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [
        f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |"
        for t in data["targets"]
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, journal: Path) -> dict[str, Any]:
    """The evaluation on the real engine in three ``evaluate()`` calls sharing one journal,
    then their replay from the journal alone.

    1. every candidate and abstainer on the selection part only: the published choice
       (``evaluate``'s rule, within ``TOKEN_BUDGET``) and the abstainer
       (``choose_abstainer``) are made there;
    2. greedy and the chosen configuration on every item (the selection replies reused):
       the report;
    3. greedy and the chosen abstainer on every item: the abstention cell.
    """
    from microagent.engine_bridge import VLLMBridge

    os.environ["VLLM_CPU_KVCACHE_SPACE"] = SETTINGS["kv_cache_gib"]
    todo = items(args.items, args.select)
    selection = [i for i in todo if i.part == "selection"]
    bridge = VLLMBridge(
        "default",
        max_num_batched_tokens=SETTINGS["max_num_batched_tokens"],
        max_num_seqs=SETTINGS["max_num_seqs"],
        max_model_len=SETTINGS["max_model_len"],
        progress=False,
    )
    options: dict[str, Any] = {
        "max_tokens": MAX_TOKENS,
        "journal": journal,
        "max_token_ratio": TOKEN_BUDGET,
    }
    loads: dict[str, list[float]] = {}

    async def stage(name: str, on: list[EvalItem], tried: list[Candidate]) -> EvalReport:
        before = os.getloadavg()[0]
        out = await evaluate(on, tried, runner, concurrency=CONCURRENCY, **options)
        loads[name] = [round(before, 2), round(os.getloadavg()[0], 2)]
        return out

    async with bridge:
        runner = BridgeRunner(bridge)
        chosen_on = await stage("selection", selection, [*candidates(), *abstainers()])
        by_name = {c.name: c for c in (*candidates(), *abstainers())}
        selection_rows = list(chosen_on.rows)
        choice = choose_published(chosen_on)
        published = [c for c in candidates() if c.name == choice.name]
        abstainer = by_name[choose_abstainer(selection_rows)]
        report = await stage("report", todo, published)
        abstention = await stage("abstention", todo, [abstainer])
    replays = [
        await evaluate(on, tried, None, replay=True, progress=None, **options)
        for on, tried in ((todo, published), (todo, [abstainer]))
    ]
    first = [report.to_dict(), abstention.to_dict()]
    again = [r.to_dict() for r in replays]
    identical = json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    return {
        "selection": chosen_on.to_dict(),
        "report": first[0],
        "abstention": first[1],
        "published": attrs.asdict(choice),
        "abstainer": abstainer.name,
        "loadavg_per_stage": loads,
        "replay": {
            "identical": identical,
            "measured": "identical report.json (both runs)"
            if identical
            else "the replayed report differs",
        },
    }


def choose_published(chosen_on: EvalReport) -> Choice:
    """``evaluate``'s rule on the selection part among the candidates (the abstainers,
    which answer "no confident answer", are not publishable: their own choice is
    ``choose_abstainer``'s)."""
    scores = {k: v for k, v in chosen_on.selection.items() if not k.startswith(ABSTAINER)}
    return choose(scores, TOKEN_BUDGET)


def family_report(results: Path = RESULTS, stem: str = "quality_checks") -> FamilyReport:
    """The quality-checks page and its headline row, from the JSON."""
    data = json.loads((results / f"{stem}.json").read_text())
    beat, worst, tokens, abstain, replay = data["targets"]
    return FamilyReport(
        family="quality_checks",
        title="Quality through microagent eval on frozen families (issue 40)",
        headline=Headline(
            figure=f"published ({data['published']['name']}): families beating greedy "
            "by >= 8 points (Holm)",
            value=str(beat["measured"]),
            baseline="one greedy call (temperature 0)",
            target=">= 2 families: " + ("met" if beat["met"] else "not met"),
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"Nine frozen families through `microagent eval`, chosen on other draws of the same "
            f"generators. Beats greedy on: {beat['measured']}. Worst interval: "
            f"{worst['measured']}. Tokens: {tokens['measured']}. Abstention: "
            f"{abstain['measured']}. Replay: {replay['measured']}."
        ),
        page=page(
            "Quality through microagent eval (`bench/quality_checks.py`)",
            __doc__,
            [("Results", tables(data) + "\n" + data_line(f"{stem}.json", f"{stem}_journal.jsonl"))],
        ),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=C.CHECKS_ITEMS, help="report items per family")
    ap.add_argument("--select", type=int, default=20, help="selection items per family")
    ap.add_argument("--out", default="quality_checks")
    ap.add_argument("--force", action="store_true", help="run even on a busy machine")
    ap.add_argument("--report-only", action="store_true", help="targets and tables from the JSON")
    ap.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = ap.parse_args()
    path = RESULTS / f"{args.out}.json"
    journal = RESULTS / f"{args.out}_journal.jsonl"
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
        measured = asyncio.run(run(args, journal))
        data = {
            "settings": {
                "model": "default (SmolLM2-135M-Instruct, embedded)",
                "engine": SETTINGS,
                "max_tokens": MAX_TOKENS,
                "concurrency": CONCURRENCY,
                "token_budget": TOKEN_BUDGET,
                "report_items_per_family": args.items,
                "selection_items_per_family": args.select,
                "families": list(FAMILIES),
                "report_seed": F.REPORT_SEED,
                "report_hash": F.REPORT_HASH,
                "checks_seed": C.CHECKS_SEED,
                "checks_hash": C.CHECKS_HASH,
                "selection_seeds": {"old": OLD_SELECTION_SEED, "checks": C.SELECTION_SEED},
                "greedy": GREEDY_CANDIDATE.closed.to_dict(),
                "path": "in-process (microagent.evaluation.evaluate, BridgeRunner)",
            },
            **measured,
            "command": "python bench/quality_checks.py " + " ".join(sys.argv[1:]),
            "machine": machine(load, bool(args.force and load >= 1.0), started),
        }
    data["families"] = family_rows(data)
    data["targets"] = targets(data)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":")))
    text = tables(data)
    (RESULTS / f"{args.out}_tables.md").write_text(text)
    print(text)
    if args.update:
        publish(HERE.parent, family_report(RESULTS, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
