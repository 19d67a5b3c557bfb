"""Tables, the plot and the BENCHMARKS.md section of ``bench/quality.py``, all from its JSON.

No number is written by hand: every figure comes from the per-item rows through
the accuracy benchmark's statistics (``_accuracy_report.summarize``: accuracy,
Wilson 95 % intervals, exact McNemar tests on the same items, tokens per
question). The target of issue 14 is checked here, per method: a significant
win (McNemar p < 0.05, more items won than lost) over a baseline on at least
``TARGET_FAMILIES`` families at no more than ``TOKEN_BUDGET`` times the
baseline's completion tokens on each of them.

Free-answer families (items without choices) have chance 0, so a single call is
above chance on them as soon as it gets anything right (its Wilson lower bound is
then above 0); their rows carry the grade of ``_quality_tasks.grade`` (``correct``
and, on ``extract``, ``valid`` and ``fields``), and the position-bias and soft-vote
tables, which are about choices, leave them out.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from _accuracy_report import mcnemar_cell, position_bias, soft_and_judge, summarize
from _sections import replace_section

BASELINES = ("greedy", "single")
ALPHA = 0.05
TOKEN_BUDGET = 3.0
TARGET_FAMILIES = 2


def answered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of collaborations that ran (not refused by their configuration)."""
    return [r for r in rows if "refused" not in r]


def refusals(data: dict[str, Any]) -> dict[tuple[str, str], tuple[int, str]]:
    """(family, method) -> (refused items, the first reason) for refused configurations."""
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for r in data["rows"]:
        if "refused" in r:
            key = (r["family"], r["method"])
            count, reason = out.get(key, (0, r["refused"]))
            out[key] = (count + 1, reason)
    return out


def chance(data: dict[str, Any], family: str) -> float:
    """The mean chance accuracy (1 / number of choices) of a family's items; 0 for free
    answers (no choices: a guess is almost never the answer)."""
    items = [i for i in data["items"] if i["family"] == family]
    return statistics.fmean(1 / len(i["choices"]) if i["choices"] else 0.0 for i in items)


def closed(data: dict[str, Any], family: str) -> bool:
    """Whether a family's items are closed questions (they have choices)."""
    return all(i["choices"] for i in data["items"] if i["family"] == family)


def extraction(rows: list[dict[str, Any]], family: str) -> dict[str, dict[str, float]]:
    """Per method on a JSON family: items answered, the share valid against the schema, the
    mean share of fields right, and the share with every field right."""
    out: dict[str, dict[str, float]] = {}
    for method in dict.fromkeys(r["method"] for r in rows if r["family"] == family):
        mine = [r for r in rows if r["family"] == family and r["method"] == method]
        if not mine or "valid" not in mine[0]:
            continue
        out[method] = {
            "n": len(mine),
            "valid": statistics.fmean(bool(r["valid"]) for r in mine),
            "fields": statistics.fmean(r["fields"] for r in mine),
            "correct": statistics.fmean(bool(r["correct"]) for r in mine),
        }
    return out


def wins(entry: dict[str, Any], base: str) -> bool:
    """Whether a method beats ``base`` significantly (McNemar p < ALPHA, more items won)."""
    test: dict[str, float] | None = entry.get(f"vs_{base}")
    return test is not None and test["p"] < ALPHA and test["a_only"] > test["b_only"]


def above_chance(data: dict[str, Any], summary: dict[str, dict[str, Any]]) -> set[str]:
    """The families where a single call (greedy or sampled) is above chance: its Wilson 95 %
    lower bound above the family's chance accuracy."""
    out = set()
    for family, table in summary.items():
        c = chance(data, family)
        if any(table[b]["wilson"][0] > c for b in BASELINES if b in table):
            out.add(family)
    return out


def target(
    summary: dict[str, dict[str, Any]], base: str, eligible: set[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per method: the families it beats ``base`` on within the token budget, and whether the
    target (at least TARGET_FAMILIES of them, counting only ``eligible`` families when
    given) is met."""
    out: dict[str, dict[str, Any]] = {}
    for family, table in summary.items():
        if base not in table:
            continue
        budget = TOKEN_BUDGET * table[base]["completion_tokens"]
        for method, entry in table.items():
            e = out.setdefault(method, {"families": [], "over_budget": []})
            if wins(entry, base):
                cheap = entry["completion_tokens"] <= budget
                e["families" if cheap else "over_budget"].append(family)
    for e in out.values():
        counted = [f for f in e["families"] if eligible is None or f in eligible]
        e["met"] = len(counted) >= TARGET_FAMILIES
    return out


#: issue 30: the published configuration beats greedy by this many points on report families
MARGIN = 0.08


def report_targets(data: dict[str, Any], method: str = "best") -> list[dict[str, Any]]:
    """Issue 30's targets for ``method`` on the run's report families, against greedy:
    ``{target, measured, met}`` each ([] when the run has no report family)."""
    report = [f for f in data["settings"].get("report_families", [])]
    summary = summarize(data, answered(data["rows"]))
    report = [f for f in report if f in summary and method in summary[f]]
    if not report:
        return []
    won, worse = [], []
    for family in report:
        table = summary[family]
        e, g = table[method], table["greedy"]
        test = e.get("vs_greedy") or {"p": 1.0, "a_only": 0, "b_only": 0}
        gain = e["accuracy"] - g["accuracy"]
        cheap = e["completion_tokens"] <= TOKEN_BUDGET * g["completion_tokens"]
        if gain >= MARGIN and test["p"] < ALPHA and test["a_only"] > test["b_only"] and cheap:
            won.append(f"{family} (+{gain * 100:.1f} points, p={test['p']:.2g})")
        if test["p"] < ALPHA and test["b_only"] > test["a_only"]:
            worse.append(f"{family} ({gain * 100:+.1f} points, p={test['p']:.2g})")
    refused = sum(n for (f, m), (n, _) in refusals(data).items() if m == method and f in report)
    return [
        {
            "target": f"`{method}` beats greedy by >= {MARGIN * 100:.0f} points (McNemar "
            f"p < {ALPHA}) on >= {TARGET_FAMILIES} report families at <= {TOKEN_BUDGET:g}x "
            "greedy's completion tokens",
            "measured": ", ".join(won) or "none",
            "met": len(won) >= TARGET_FAMILIES,
        },
        {
            "target": f"`{method}` is significantly worse than greedy on no report family",
            "measured": ", ".join(worse) or "none worse",
            "met": not worse,
        },
        {
            "target": f"`{method}` refuses no question of the report families",
            "measured": f"{refused} refused",
            "met": refused == 0,
        },
    ]


def tables(data: dict[str, Any]) -> str:
    s = data["settings"]
    m = data.get("machine", {})
    summary = summarize(data, answered(data["rows"]))
    refused = refusals(data)
    loads = [x for v in data.get("loadavg_per_method", {}).values() for x in v]
    families = [f for f in s["families"] if f in summary]
    closed_families = [f for f in families if closed(data, f)]
    free_families = [f for f in families if not closed(data, f)]
    budgets = s.get("max_tokens_per_family", {})
    forms = []
    if closed_families:
        forms.append(
            ("on " + ", ".join(f"`{f}`" for f in closed_families) + ": " if free_families else "")
            + f"every answer constrained to the item's choices, at most {s['max_tokens']} tokens"
        )
    if free_families:
        forms.append(
            "free answers (no choices, chance 0) on "
            + ", ".join(f"`{f}` (at most {budgets.get(f, s['max_tokens'])} tokens)"
                        for f in free_families)
            + ", graded on the reply (a capital: it names the right city and no other; a sum: "
            "its last number is the sum; JSON: every field right)"
        )  # fmt: skip
    baselines = (
        "one constrained call (one voter)"
        if not free_families
        else "one unconstrained sample (`auto` with one agent)"
        if not closed_families
        else "one call (one constrained voter on closed families, one unconstrained sample "
        "on free ones)"
    )
    lines = [
        f"Model: {s['model']}. {s['items_per_family']} items per family (seed {s['seed']}), "
        f"{'; '.join(forms)}; "
        f"temperature {s['temperature']} unless a method says otherwise (greedy: 0). "
        f"Baselines: `greedy` and `single` are {baselines} through the "
        "same path as every method. Sampling is not seeded (pairs are the same items). "
        f"Machine: {m.get('cpus')} CPUs, load average {m.get('loadavg_at_start', 0):.2f} at the "
        f"start ({min(loads, default=0):.2f}–{max(loads, default=0):.2f} between methods; "
        f"accuracy does not depend on it){', forced' if m.get('forced') else ''}, "
        f"{m.get('seconds', 0)} s in all.",
        "",
        "Is a single call above chance? (Wilson 95 % lower bound above chance)",
        "",
        "| family | chance | greedy | single | above chance |",
        "|---|---|---|---|---|",
    ]
    for family in families:
        table = summary[family]
        c = chance(data, family)
        cells = []
        above = False
        for base in BASELINES:
            e = table.get(base)
            if e is None:
                cells.append("–")
                continue
            cells.append(f"{e['accuracy']:.3f} ({e['wilson'][0]:.3f}–{e['wilson'][1]:.3f})")
            above = above or e["wilson"][0] > c
        lines.append(f"| {family} | {c:.3f} | {' | '.join(cells)} | {'yes' if above else 'no'} |")
    report = set(s.get("report_families", []))
    lines += [
        "",
        "McNemar columns: items only this method got right / only the baseline got right, "
        "exact two-sided p. Tokens: completion tokens per question, and as a multiple of "
        "`greedy`'s. Greedy (temperature 0) is listed first: every claim is against it.",
    ]
    if report:
        lines += [
            "",
            "Report families (" + ", ".join(f"`{f}`" for f in families if f in report) + "): "
            f"generated from their own seed ({s.get('report_seed')}), frozen (items hash "
            f"`{str(s.get('report_hash'))[:12]}…`) before any configuration was chosen, and "
            "never used to choose one. Selection families: "
            + (", ".join(f"`{f}`" for f in families if f not in report) or "none in this run")
            + ".",
        ]
    ordered = ["greedy", *(m for m in s["methods"] if m != "greedy")]
    for family in families:
        table = summary[family]
        greedy_tokens = table.get("greedy", {}).get("completion_tokens")
        where = "report" if family in report else "selection"
        lines += [
            "",
            f"**{family}** ({where} family, {table[next(iter(table))]['n']} items, chance "
            f"{chance(data, family):.3f})",
            "",
            "| method | accuracy | 95 % CI | vs greedy | vs single | tokens / q | × greedy |",
            "|---|---|---|---|---|---|---|",
        ]
        for method in ordered:
            if (family, method) in refused and method not in table:
                count, reason = refused[(family, method)]
                lines.append(f"| {method} | refused ({count} items: {reason}) | | | | | |")
                continue
            if method not in table:
                continue
            e = table[method]
            lo, hi = e["wilson"]
            ratio = f"{e['completion_tokens'] / greedy_tokens:.2f}" if greedy_tokens else "–"
            partly = (
                f" ({refused[(family, method)][0]} refused)" if (family, method) in refused else ""
            )
            lines.append(
                f"| {method}{partly} | {e['accuracy']:.3f} | {lo:.3f}–{hi:.3f} | "
                f"{mcnemar_cell(e.get('vs_greedy'))} | {mcnemar_cell(e.get('vs_single'))} | "
                f"{e['completion_tokens']:.1f} | {ratio} |"
            )
    for family in free_families:
        ext = extraction(answered(data["rows"]), family)
        if not ext:
            continue
        lines += [
            "",
            f"**{family}**: JSON valid against the request's schema, and the fields right "
            "(read from any JSON object in the answer, valid or not)",
            "",
            "| method | items | schema-valid | fields right (mean share) | all fields right |",
            "|---|---|---|---|---|",
        ]
        for method in s["methods"]:
            if method in ext:
                e = ext[method]
                lines.append(
                    f"| {method} | {e['n']:.0f} | {e['valid']:.3f} | {e['fields']:.3f} "
                    f"| {e['correct']:.3f} |"
                )
    eligible = above_chance(data, summary)
    lines += [
        "",
        f"Target (issue 14): a significant win (p < {ALPHA}, more items won than lost) on at "
        f"least {TARGET_FAMILIES} families at ≤ {TOKEN_BUDGET:g}× the baseline's completion "
        "tokens. Families won, per baseline (over the token budget in brackets; * where a "
        "single call is not above chance). *met*: on all families; **met**: counting only "
        "families where a single call is above chance.",
        "",
        "| method | vs greedy | vs single |",
        "|---|---|---|",
    ]
    for method in s["methods"]:
        cells = []
        for base in BASELINES:
            e = target(summary, base).get(method)
            strict = target(summary, base, eligible).get(method)
            if e is None or strict is None or method == base:
                cells.append("–")
                continue
            won = ", ".join(f + ("" if f in eligible else "*") for f in e["families"]) or "none"
            over = f" [{', '.join(e['over_budget'])}]" if e["over_budget"] else ""
            met = " — **met**" if strict["met"] else " — *met*" if e["met"] else ""
            cells.append(f"{won}{over}{met}")
        lines.append(f"| {method} | {' | '.join(cells)} |")
    goals = report_targets(data)
    if goals:
        lines += [
            "",
            "Targets (issue 30), for the published configuration (`best`) on the report "
            "families, against greedy:",
            "",
            "| target | measured | met |",
            "|---|---|---|",
            *(
                f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |"
                for t in goals
            ),
        ]
    ran = {**data, "rows": answered(data["rows"])}
    bias_lines: list[str] = []
    for family in closed_families:
        for method, b in position_bias(ran, family).items():
            yes = "–" if b["yes"] != b["yes"] else f"{b['yes']:.2f}"
            bias_lines.append(
                f"| {family} | {method} | {b['canonical_first']:.2f} | {b['shown_first']:.2f} "
                f"| {yes} |"
            )
    if bias_lines:
        lines += [
            "",
            "Bias: share of votes naming the choice listed first (canonically / as the voter "
            'saw it) and, on yes/no items, "yes" (the answers are balanced: 0.50 is unbiased):',
            "",
            "| family | method | canonical first | first shown | yes |",
            "|---|---|---|---|---|",
            *bias_lines,
        ]
    soft_lines: list[str] = []
    for family in closed_families:
        for method, e in soft_and_judge(ran, family).items():
            if e["mass"]:
                top = statistics.fmean(e["top"])
                soft_lines.append(
                    f"| {family} | {method} | {statistics.fmean(e['mass']):.3f} | "
                    f"{e['fallbacks'] / e['n']:.2f} | {top:.3f} |"
                )
    if soft_lines:
        lines += [
            "",
            "Soft votes: probability of the allowed answers as the engine reported it (before "
            "renormalisation), fallbacks to the sample per question, the winner's share:",
            "",
            "| family | method | mass | fallbacks / q | winner's share |",
            "|---|---|---|---|---|",
            *soft_lines,
        ]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    """Accuracy (with Wilson 95 % intervals) vs completion tokens per question, one panel
    per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(data, answered(data["rows"]))
    families = [f for f in data["settings"]["families"] if f in summary]
    if not families:
        return
    cols = min(3, len(families))
    rows = -(-len(families) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families, strict=False):
        table = summary[family]
        for method, e in table.items():
            lo, hi = e["wilson"]
            x, y = e["completion_tokens"], e["accuracy"]
            ax.errorbar(x, y, yerr=[[y - lo], [hi - y]], fmt="o", capsize=3)
            ax.annotate(method, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(chance(data, family), color="grey", linestyle=":", label="chance")
        ax.set_xscale("log")
        ax.set_title(f"{family} (n={table[next(iter(table))]['n']})")
        ax.set_xlabel("completion tokens / question")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: docs/quality.md's generated part: the report families' tables of the latest report run
PAGE_BEGIN = "<!-- quality-report:begin (generated by bench/quality.py --update; do not edit) -->"
PAGE_END = "<!-- quality-report:end -->"


def update_quality_page(path: Path, tables_md: str, json_path: str) -> None:
    """Put a report run's tables (``--families report``) into docs/quality.md, from its JSON."""
    body = f"{tables_md}\nData: `{json_path}` (the plot: docs/benchmarks/quality.md).\n"
    heading = "Report families against greedy (generated)"
    replace_section(path, PAGE_BEGIN, PAGE_END, heading, body)


__all__ = [
    "above_chance",
    "answered",
    "chance",
    "closed",
    "extraction",
    "plot",
    "refusals",
    "report_targets",
    "tables",
    "target",
    "update_quality_page",
    "wins",
]
