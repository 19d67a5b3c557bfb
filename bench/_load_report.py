"""Tables, plot and the BENCHMARKS.md section of ``bench/load.py``, all from its JSON."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from _sections import machine_sentence

KEYS = (
    "per_min",
    "p50_s",
    "p95_s",
    "p99_s",
    "computed_tokens",
    "reusable_tokens",
    "recomputed_tokens",
    "retained_hit_tokens",
    "preemptions",
)


def medians(data: dict[str, Any]) -> dict[tuple[float, str], dict[str, Any]]:
    """Per (rate, system): the median of each measure over repetitions."""
    groups: dict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        groups[(run["rate_per_min"], run["system"])].append(run)
    out = {}
    for key, runs in sorted(groups.items()):
        row: dict[str, Any] = {}
        for k in KEYS:
            values = [r.get(k, 0) for r in runs]
            # None: a measure the system cannot report (printed as "–")
            row[k] = None if None in values else statistics.median(float(v) for v in values)
        row["reps"] = len(runs)
        row["completed"] = sum(r["completed"] for r in runs)
        row["failed"] = sum(r["failed"] for r in runs)
        row["loadavg"] = max(r["loadavg_before"] for r in runs)
        out[key] = row
    return out


#: Systems whose token numbers are their own counters, not the shared scoring.
OWN_COUNTERS = ("microagent-http",)


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def merge(first: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``first`` plus a supplementary run's runs (``load.py --append``), recorded as such."""
    if first["settings"]["kv_blocks"] != more["settings"]["kv_blocks"]:
        raise ValueError("a supplementary run must use the same engine settings")
    rates = set(first["settings"]["rates_per_min"])
    runs = [*first["runs"], *more["runs"]]
    supplements = [*first.get("supplements", []), {**more["machine"], **more["settings"]}]
    settings = {
        **first["settings"],
        "rates_per_min": sorted(rates | set(more["settings"]["rates_per_min"])),
    }
    return {**first, "runs": runs, "settings": settings, "supplements": supplements}


def _ratio(a: float, b: float) -> str:
    if b:
        return f"{a / b:.2f}×"
    return "0 = 0" if not a else "n/a"


def loaded_point(rows: dict[tuple[float, str], dict[str, float]], base: str) -> float | None:
    """The highest rate at which ``base``'s p95 stays <= 2x its p95 at the lowest rate."""
    rates = sorted(rate for rate, system in rows if system == base)
    if not rates:
        return None
    unloaded = rows[(rates[0], base)]["p95_s"]
    ok = [rate for rate in rates if rows[(rate, base)]["p95_s"] <= 2 * unloaded]
    return max(ok) if ok else rates[0]


def throughput_at_p95(
    rows: dict[tuple[float, str], dict[str, float]], system: str, p95: float
) -> float | None:
    """``system``'s completed collaborations/min where its p95 reaches ``p95`` (interpolated
    between measured rates; its highest measured throughput if it never reaches it)."""
    points = sorted((r["per_min"], r["p95_s"]) for (_, s), r in rows.items() if s == system)
    if not points:
        return None
    best = None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if y0 <= p95 < y1:
            return x0 + (x1 - x0) * (p95 - y0) / (y1 - y0)
    for x, y in points:
        if y <= p95:
            best = x
    return best


def targets(rows: dict[tuple[float, str], dict[str, float]]) -> list[dict[str, Any]]:
    """Issue 12's targets against the client, each with its measured number."""
    rate = loaded_point(rows, "client")
    ours, base = rows.get((rate, "microagent")), rows.get((rate, "client")) if rate else None
    if rate is None or ours is None or base is None:
        return []
    at_equal = throughput_at_p95(rows, "microagent", base["p95_s"])
    throughput = at_equal / base["per_min"] if at_equal and base["per_min"] else 0.0
    p95 = ours["p95_s"] / base["p95_s"] if base["p95_s"] else float("inf")
    vacuous = not base["recomputed_tokens"] and not ours["recomputed_tokens"]
    rec = (
        ours["recomputed_tokens"] / base["recomputed_tokens"]
        if base["recomputed_tokens"]
        else (0.0 if vacuous else float("inf"))
    )
    return [
        {
            "target": f"throughput at the client's p95 ({base['p95_s']:.1f} s, {rate:g}/min) >= 2x",
            "measured": throughput,
            "alt": p95,
            "met": throughput >= 2.0 or p95 <= 0.5,
            "text": f"{throughput:.2f}× the throughput; p95 {p95:.2f}× (alternative: <= 0.5×)",
        },
        {
            "target": f"tokens recomputed after eviction at {rate:g}/min <= 0.5x the client's",
            "measured": rec,
            "met": None if vacuous else rec <= 0.5,
            "text": (
                f"{ours['recomputed_tokens']:.0f} vs {base['recomputed_tokens']:.0f}: neither "
                "system recomputed anything at this rate (not a test)"
                if vacuous
                else f"{ours['recomputed_tokens']:.0f} vs {base['recomputed_tokens']:.0f} "
                f"({rec:.2f}×)"
            ),
        },
    ]


def tables(data: dict[str, Any]) -> str:
    s = data["settings"]
    m = data.get("machine", {})
    rows = medians(data)
    engine = s.get("engine", {})
    lines = [
        f"Settings: {s['collaborations_per_run']} collaborations per run (mix: "
        f"{', '.join(s['mix'])}), Poisson arrivals, {s['reps']} repetition(s), "
        f"KV cache {s['kv_blocks']} blocks × {s['block_tokens']} tokens"
        + (f", max_num_seqs {engine['max_num_seqs']}" if engine else "")
        + f", contexts of ~{s['context_words']} words each. Machine: {machine_sentence(m)}."
        + "".join(
            f" Supplementary run (`--append`) at {', '.join(f'{r:g}' for r in x['rates_per_min'])}"
            f"/min, {', '.join(x['systems'])}, {x['reps']} repetition(s): "
            f"{machine_sentence(x)}."
            for x in data.get("supplements", [])
        )
        + " Medians over repetitions. *Could be cached*: prompt tokens that an earlier request "
        "of the run had computed (whole blocks); *recomputed*: of those, what the engine "
        "computed again (evicted in between) — both scored from the recorded token ids by "
        "the same function for every system.",
        "",
        "| rate /min | system | done (failed) | collab/min | p50 s | p95 s | p99 s "
        "| prompt computed | could be cached | recomputed after eviction | retained hits "
        "| preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (rate, system), r in rows.items():
        lines.append(
            f"| {rate:g} | {system} | {r['completed']:.0f} ({r['failed']:.0f}) | "
            f"{r['per_min']:.2f} | {r['p50_s']:.1f} | {r['p95_s']:.1f} | {r['p99_s']:.1f} | "
            f"{r['computed_tokens']:.0f} | {_n(r['reusable_tokens'])} | "
            f"{'–¹' if system in OWN_COUNTERS else _n(r['recomputed_tokens'])} | "
            f"{r['retained_hit_tokens']:.0f} | {_n(r['preemptions'])} |"
        )
    systems = {system for _, system in rows}
    if systems & set(OWN_COUNTERS):
        lines += [
            "",
            "¹ `microagent serve` over HTTP: its engine requests are not visible from outside, "
            "so its prompt tokens computed are the server's own counters (`/metrics`: prompt "
            "minus cached, the same quantity), and its recomputed tokens cannot be scored "
            "like the others (the server's own counter, a different definition, is in the JSON).",
        ]
    for base in ("client", "langgraph", "ablation"):
        if base not in systems or "microagent" not in systems:
            continue
        lines += [
            "",
            f"| rate /min | p50 microagent / {base} | p95 microagent / {base} "
            f"| computed microagent / {base} | recomputed microagent / {base} |",
            "|---|---|---|---|---|",
        ]
        for rate in sorted({rate for rate, _ in rows}):
            ours, other = rows.get((rate, "microagent")), rows.get((rate, base))
            if ours is None or other is None:
                continue
            lines.append(
                f"| {rate:g} | {_ratio(ours['p50_s'], other['p50_s'])} | "
                f"{_ratio(ours['p95_s'], other['p95_s'])} | "
                f"{_ratio(ours['computed_tokens'], other['computed_tokens'])} | "
                f"{_ratio(ours['recomputed_tokens'], other['recomputed_tokens'])} |"
            )
    goals = targets(rows)
    if goals:
        lines += ["", "| target (issue 12) | measured | met |", "|---|---|---|"]
        met = {True: "yes", False: "no", None: "n/a"}
        lines += [f"| {g['target']} | {g['text']} | {met[g['met']]} |" for g in goals]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = medians(data)
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    styles = {"microagent": "o-", "client": "^-", "ablation": "s--"}
    for system in sorted({s for _, s in rows}):
        style = styles.get(system, "x:")
        points = sorted((r["per_min"], r["p95_s"]) for (_, s), r in rows.items() if s == system)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=system)
    ax.set_xlabel("collaborations per minute (completed)")
    ax.set_ylabel("p95 latency (s)")
    ax.set_title("Latency vs throughput under load (median of repetitions)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
