"""Rows, targets, tables, plot and the BENCHMARKS.md section of ``bench/agents.py``.

Everything here is computed from the JSON's cells (one per system, shape,
pressure, rate and repetition, each with its programs' per-turn records), so a
resumed or partial run reports exactly what it holds. Per (shape, pressure, rate,
system) the programs of all repetitions are pooled for the percentiles
(nearest rank: a failed or unfinished program counts as infinitely late);
throughput is the median over repetitions of completed programs/min.

**Workload floor**: each program's initial context once, each new message and
tool result once and its generated tokens once, which is its last turn's prompt
plus that turn's output (every earlier message and output is in that prompt).
*Prompt computed* is the sum over turns of prompt minus cached tokens, so
computed / floor is what re-sending the conversation cost in prefill (~1 when
every turn hits the previous one, but for block granularity).

**Block floor**: what a perfect cache of the engine's KV blocks must still compute:
the first prompt, then per later turn everything after the last whole block the
previous turn left (vLLM caches whole blocks only, and recomputes a prompt's last
token). With 128-token blocks (the CPU's) and turns that add about a block each,
this alone is ~1.4x the workload floor, so *x block floor* is the measure of the
policy, *x floor* of the workload.

The plain client is ``vllm``; a run without it (``--engine scripted``) compares
against ``microagent-http-nokey``, the same unmodified loop on microagent's server
without any hint, and each target names the baseline it used.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from _sections import machine_sentence

HEADLINE = 1.6
#: Systems with targets (issue 26's two; issue 38's tiered ones where they ran).
OURS = ("microagent", "microagent-http", "microagent-tier", "microagent-http-tier")
#: Baselines in order of preference: the first one present in the run is used.
PLAIN = ("vllm", "microagent-http-nokey")
PRIORITY = ("vllm-priority", "microagent-http-nokey")
SHAPES = ("bfcl", "swe")
INF = float("inf")

Key = tuple[str, float, float, str]  # shape, pressure, rate, system


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``inf`` allowed; NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def block_floor(turns: Sequence[dict[str, Any]], block: int) -> int:
    """Prompt tokens a perfect cache of ``block``-token blocks computes for ``turns``."""
    if not turns:
        return 0
    total = turns[0]["prompt"]
    for before, turn in itertools.pairwise(turns):
        kept = min(before["prompt"] + before["completion"], turn["prompt"] - 1)
        total += turn["prompt"] - (kept // block) * block if block else turn["prompt"] - kept
    return total


def program_measures(p: dict[str, Any], block: int = 0) -> dict[str, Any]:
    """One program's latency (inf unless it finished), time without tools, tokens."""
    turns = p["turns"]
    ok = bool(p["ok"])
    latency = p["finish_s"] - p["arrival_s"] if ok else INF
    return {
        "ok": ok,
        "latency": latency,
        "work": latency - p["tool_s"] if ok else INF,
        "computed": sum(t["prompt"] - t["cached"] for t in turns),
        "prompt": sum(t["prompt"] for t in turns),
        "floor": turns[-1]["prompt"] + turns[-1]["completion"] if ok and turns else 0,
        "block_floor": block_floor(turns, block) if ok else 0,
        "first_ttft": [t["ttft_s"] for t in turns[:1] if t["ttft_s"] is not None],
        "later_ttft": [t["ttft_s"] for t in turns[1:] if t["ttft_s"] is not None],
    }


def _median(values: Iterable[float | None]) -> float | None:
    got = list(values)
    if not got or any(v is None for v in got):
        return None  # a measure the system cannot report
    return float(statistics.median(v for v in got if v is not None))


def rows(data: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    """Per (shape, pressure, rate, system): pooled percentiles and medians of repetitions."""
    groups: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for cell in data.get("cells", []):
        key = (cell["shape"], cell["pressure"], cell["rate_per_min"], cell["system"])
        groups[key].append(cell)
    configs = data.get("settings", {}).get("configs", [])
    block = int(next((c["block_tokens"] for c in configs if c.get("block_tokens")), 0))
    out: dict[Key, dict[str, Any]] = {}
    for key, cells in sorted(groups.items()):
        progs = [program_measures(p, block) for c in cells for p in c["programs"]]
        ok = [m for m in progs if m["ok"]]
        lat = [m["latency"] for m in progs]
        work = [m["work"] for m in progs]
        later = [t for m in progs for t in m["later_ttft"]]
        first = [t for m in progs for t in m["first_ttft"]]
        floor = sum(m["floor"] for m in ok)
        floor_blocks = sum(m["block_floor"] for m in ok)
        computed_ok = sum(m["computed"] for m in ok)
        reps = len(cells)
        out[key] = {
            "reps": reps,
            "programs": len(progs),
            "failed": len(progs) - len(ok),
            "p50_s": percentile(lat, 50),
            "p95_s": percentile(lat, 95),
            "p99_s": percentile(lat, 99),
            "work_p50_s": percentile(work, 50),
            "work_p95_s": percentile(work, 95),
            "work_p99_s": percentile(work, 99),
            "ttft_first_p95_s": percentile(first, 95),
            "ttft_later_p95_s": percentile(later, 95),
            "per_min": statistics.median(
                60.0 * sum(p["ok"] for p in c["programs"]) / c["wall_s"] if c["wall_s"] else 0.0
                for c in cells
            ),
            "computed_tokens": sum(m["computed"] for m in progs) / reps,
            "floor_tokens": floor / reps,
            "x_floor": computed_ok / floor if floor else math.nan,
            "x_block_floor": computed_ok / floor_blocks if floor_blocks else math.nan,
            "preemptions": _median(c.get("preemptions") for c in cells),
            "queue_s": _median(c.get("queue_s") for c in cells),
            "retained_hit_tokens": _median(c.get("retained_hit_tokens") for c in cells),
            "tier_ram_bytes": _median(c.get("tier_ram_bytes") for c in cells),
            "tier_loaded_blocks": _median(c.get("tier_loaded_blocks") for c in cells),
            "pressure_at_rate": cells[0].get("pressure_at_rate"),
            "clamped": any(c.get("clamped") for c in cells),
            "blocks": cells[0].get("blocks"),
            "loadavg": max(c.get("loadavg_before", 0.0) for c in cells),
        }
    return out


def cell_line(cell: dict[str, Any]) -> str:
    """One finished cell as a progress line."""
    r = rows({"cells": [cell]})
    row = next(iter(r.values()))
    return (
        f"{cell['shape']} {cell['pressure']:g}x rate {cell['rate_per_min']:g}/min "
        f"rep {cell['rep']} "
        f"{cell['system']}: {row['programs'] - row['failed']}/{row['programs']} done, "
        f"p50 {row['p50_s']:.1f} s, p95 {row['p95_s']:.1f} s, "
        f"later TTFT p95 {row['ttft_later_p95_s']:.2f} s, "
        f"computed {row['computed_tokens']:.0f} ({row['x_floor']:.2f}x floor, "
        f"{row['x_block_floor']:.2f}x block floor)"
    )


# -- targets -------------------------------------------------------------------------------------


def _present(table: dict[Key, dict[str, Any]], chain: Sequence[str]) -> str | None:
    systems = {k[3] for k in table}
    return next((s for s in chain if s in systems), None)


def _at(table: dict[Key, dict[str, Any]], shape: str, system: str) -> dict[float, dict[str, Any]]:
    """``system``'s rows of ``shape`` at the headline pressure, by rate."""
    return {k[2]: r for k, r in table.items() if k[:2] == (shape, HEADLINE) and k[3] == system}


def loaded_rate(table: dict[Key, dict[str, Any]], shape: str, base: str) -> float | None:
    """The client's loaded point: its highest rate (headline pressure) with a finite p95."""
    finite = [rate for rate, r in _at(table, shape, base).items() if math.isfinite(r["p95_s"])]
    return max(finite) if finite else None


def throughput_at(points: Sequence[tuple[float, float]], p95: float) -> float | None:
    """Programs/min at which a curve of (programs/min, p95) reaches ``p95`` (interpolated;
    its highest throughput with a p95 at most ``p95`` when it never reaches it)."""
    pts = sorted(points)
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if y0 <= p95 < y1 and math.isfinite(y1):
            return x0 + (x1 - x0) * (p95 - y0) / (y1 - y0)
    within = [x for x, y in pts if y <= p95]
    return max(within) if within else None


def _ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 1.0  # both failed: not worse
    if b == 0 or math.isinf(b):
        return 0.0 if a < b or a == 0 else INF
    return a / b


def _target(
    name: str, measured: float | None, ok: bool | None, text: str, baseline: str | None = None
) -> dict[str, Any]:
    finite = measured is not None and math.isfinite(measured)
    met = ok if finite else (None if measured is None else False)
    return {
        "target": name,
        "measured": round(measured, 4) if finite and measured is not None else None,
        "met": met,
        "baseline": baseline,
        "text": text,
    }


def _worst(values: Iterable[tuple[float, str]], high: bool = True) -> tuple[float | None, str]:
    got = [v for v in values if not math.isnan(v[0])]
    if not got:
        return None, "no data"
    return (max if high else min)(got, key=lambda v: v[0])


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26's targets for ``microagent`` and ``microagent-http``, each with its measure."""
    table = rows(data)
    plain = _present(table, PLAIN)
    prio = _present(table, PRIORITY)
    out: list[dict[str, Any]] = []
    for ours in OURS:
        if ours in OURS[2:] and not any(k[3] == ours for k in table):
            continue  # the tiered systems' targets only where they ran
        for shape in SHAPES:
            rates = _at(table, shape, ours)
            value, where = _worst((r["x_floor"], f"{rate:g}/min") for rate, r in rates.items())
            blocks, _ = _worst((r["x_block_floor"], f"{k:g}") for k, r in rates.items())
            out.append(
                _target(
                    f"{ours}: prompt computed <= 1.3x the floor at 1.6x pressure ({shape})",
                    value,
                    value is not None and value <= 1.3,
                    f"worst {value:.2f}x at {where}; worst {blocks:.2f}x the block floor"
                    if value is not None and blocks is not None
                    else "not run",
                )
            )
        # later-turn TTFT at the client's loaded point, worst shape
        pairs = []
        for shape in SHAPES:
            rate = loaded_rate(table, shape, plain) if plain else None
            mine = _at(table, shape, ours).get(rate) if rate is not None else None
            if plain and rate is not None and mine is not None:
                base = _at(table, shape, plain)[rate]
                pairs.append(
                    (
                        _ratio(mine["ttft_later_p95_s"], base["ttft_later_p95_s"]),
                        f"{shape} at {rate:g}/min: {mine['ttft_later_p95_s']:.2f} s vs "
                        f"{base['ttft_later_p95_s']:.2f} s",
                    )
                )
        value, where = _worst(pairs)
        out.append(
            _target(
                f"{ours}: later-turn TTFT p95 <= 0.5x the plain client's",
                value,
                value is not None and value <= 0.5,
                f"worst {value:.2f}x ({where})" if value is not None else where,
                plain,
            )
        )
        for label, base_name in (("vllm", plain), ("vllm-priority", prio)):
            pairs = []
            for shape in SHAPES:
                rate = loaded_rate(table, shape, base_name) if base_name else None
                if base_name is None or rate is None:
                    continue
                base = _at(table, shape, base_name)[rate]
                curve = [(r["per_min"], r["p95_s"]) for r in _at(table, shape, ours).values()]
                if not curve or not base["per_min"]:
                    continue
                tp = throughput_at(curve, base["p95_s"])
                pairs.append(
                    (
                        (tp or 0.0) / base["per_min"],
                        f"{shape}: {tp or 0.0:.2f} vs {base['per_min']:.2f}/min at "
                        f"p95 {base['p95_s']:.1f} s ({rate:g}/min)",
                    )
                )
            value, where = _worst(pairs, high=False)
            out.append(
                _target(
                    f"{ours}: >= 2x programs/min at equal p95 vs {label}",
                    value,
                    value is not None and value >= 2.0,
                    f"worst {value:.2f}x ({where})" if value is not None else where,
                    base_name,
                )
            )
        pairs = [
            (_ratio(r["work_p99_s"], r["work_p50_s"]), f"{k[0]} at {k[2]:g}/min")
            for k, r in table.items()
            if k[3] == ours and k[1] == HEADLINE
        ]
        value, where = _worst(pairs)
        out.append(
            _target(
                f"{ours}: program latency without tool time p99 <= 3x p50",
                value,
                value is not None and value <= 3.0,
                f"worst {value:.2f}x ({where})" if value is not None else where,
            )
        )
        pairs = []
        for shape in SHAPES:
            base_rows = _at(table, shape, plain) if plain else {}
            for rate, mine in _at(table, shape, ours).items():
                if rate in base_rows:
                    pairs.append(
                        (
                            _ratio(mine["p95_s"], base_rows[rate]["p95_s"]),
                            f"{shape} at {rate:g}/min",
                        )
                    )
        value, where = _worst(pairs)
        out.append(
            _target(
                f"{ours}: program p95 no worse than the plain client's at any rate",
                value,
                value is not None and value <= 1.0,
                f"worst {value:.2f}x ({where})" if value is not None else where,
                plain,
            )
        )
    return out + tier_targets(table)


def tier_targets(table: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 38's targets for the tiered systems that ran, and what the sessions' policy
    adds over the same tier under vLLM's LRU and over vLLM given the same RAM as cache."""
    out: list[dict[str, Any]] = []
    for ours in ("microagent-tier", "microagent-http-tier"):
        mine = {k: r for k, r in table.items() if k[3] == ours}
        if not mine:
            continue
        value, where = _worst(
            (r["x_block_floor"], f"{k[0]} {k[1]:g}x at {k[2]:g}/min") for k, r in mine.items()
        )
        out.append(
            _target(
                f"{ours}: prompt computed <= 1.1x the block floor (issue 38)",
                value,
                value is not None and value <= 1.1,
                f"worst {value:.2f}x ({where})" if value is not None else where,
            )
        )
        for other, claim in (
            ("microagent-tier-lru", "computes no more than the same tier under vLLM's LRU"),
            ("vllm-equal-ram", "computes no more than vLLM given the same RAM as device cache"),
        ):
            pairs = [
                (_ratio(r["computed_tokens"], table[(*k[:3], other)]["computed_tokens"]),
                 f"{k[0]} {k[1]:g}x at {k[2]:g}/min")
                for k, r in mine.items()
                if (*k[:3], other) in table
            ]  # fmt: skip
            value, where = _worst(pairs)
            out.append(
                _target(
                    f"{ours}: {claim} (issue 38)",
                    value,
                    value is not None and value <= 1.0,
                    f"worst {value:.2f}x ({where})" if value is not None else where,
                    other,
                )
            )
    return out


# -- tables and plot ---------------------------------------------------------------------------


def _s(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}"


def _mib(value: float | None) -> float | None:
    return None if value is None else value / 2**20


def tables(data: dict[str, Any]) -> str:
    s = data.get("settings", {})
    m = data.get("machine", {})
    table = rows(data)
    scale = s.get("scale", {})
    engine = s.get("engine_settings", {})
    loads = ", ".join(str(c.get("loadavg_before")) for c in data.get("cells", []))
    where = (
        machine_sentence(m)
        if m
        else "the run was interrupted before its machine record; each cell's load average "
        f"before it: {loads}"
    )
    lines = [
        f"Settings: engine {s.get('engine', '?')}, max_model_len {engine.get('max_model_len')}, "
        f"max_num_seqs {engine.get('max_num_seqs')}, {s.get('reps')} repetition(s), "
        f"up to {scale.get('max_tokens')} generated tokens per turn, scale: contexts "
        f"x{scale.get('context')}, turns x{scale.get('turns')}, "
        f"tool durations x{scale.get('time')}. "
        f"Open-loop Poisson arrivals, paired across systems. Machine: {where}. "
        "Latency percentiles pool the repetitions' programs (nearest rank; a failed program "
        "counts as infinitely late); *x floor*: prompt tokens computed over the workload floor "
        "(each context, message and output once); *x block floor*: over what a perfect cache "
        "of the engine's blocks must compute (whole blocks only). *Pressure*: the nominal "
        "working set / cache at the shape's sizing rate, and in brackets the estimate at the "
        "row's rate; "
        "* = the cache is at vLLM's floor (one max_model_len sequence), so the nominal "
        "pressure is not reached.",
    ]
    for shape in sorted({k[0] for k in table}):
        lines += [
            "",
            f"**{shape}**",
            "",
            "| pressure | rate /min | system | done (failed) | programs/min | latency p50 / p95 / "
            "p99 s | without tools p50 / p95 / p99 s | later-turn TTFT p95 s | prompt computed "
            "| x floor | x block floor | preemptions | queue s | retained hits "
            "| tier RAM MiB | tier blocks loaded |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (sh, pressure, rate, system), r in table.items():
            if sh != shape:
                continue
            at = r["pressure_at_rate"]
            lines.append(
                f"| {pressure:g}x ({_s(at)}x){'*' if r['clamped'] else ''} | {rate:g} | {system} "
                f"| {r['programs'] - r['failed']} ({r['failed']}) | {_s(r['per_min'], 2)} "
                f"| {_s(r['p50_s'])} / {_s(r['p95_s'])} / {_s(r['p99_s'])} "
                f"| {_s(r['work_p50_s'])} / {_s(r['work_p95_s'])} / {_s(r['work_p99_s'])} "
                f"| {_s(r['ttft_later_p95_s'], 2)} | {_s(r['computed_tokens'], 0)} "
                f"| {_s(r['x_floor'], 2)} | {_s(r['x_block_floor'], 2)} "
                f"| {_s(r['preemptions'], 0)} | {_s(r['queue_s'])} "
                f"| {_s(r['retained_hit_tokens'], 0)} "
                f"| {_s(_mib(r['tier_ram_bytes']), 0)} | {_s(r['tier_loaded_blocks'], 0)} |"
            )
    goals = data.get("targets") or targets(data)
    met = {True: "yes", False: "no", None: "n/a"}
    lines += ["", "| target (issues 26, 38) | measured | met |", "|---|---|---|"]
    for g in goals:
        base = f" (baseline {g['baseline']})" if g.get("baseline") else ""
        lines.append(f"| {g['target']}{base} | {g['text']} | {met[g['met']]} |")
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    """p95 program latency against programs/min at the headline pressure, one panel a shape."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    table = rows(data)
    shapes = sorted({k[0] for k in table}) or ["(no cells)"]
    fig = Figure(figsize=(5.5 * len(shapes), 4))
    styles = {
        "microagent": "o-",
        "microagent-http": "s-",
        "microagent-http-nokey": "s:",
        "microagent-tier": "D-",
        "microagent-tier-lru": "d:",
        "microagent-http-tier": "P-",
        "vllm-equal-ram": "<--",
        "vllm": "^--",
        "vllm-priority": "v--",
    }
    for i, shape in enumerate(shapes):
        ax = fig.add_subplot(1, len(shapes), i + 1)
        for system in sorted({k[3] for k in table if k[0] == shape}):
            pts = sorted(
                (r["per_min"], r["p95_s"])
                for k, r in table.items()
                if k[0] == shape and k[3] == system and k[1] == HEADLINE
                and math.isfinite(r["p95_s"])
            )  # fmt: skip
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(system, "x:"),
                        label=system)  # fmt: skip
        ax.set_xlabel("programs per minute (completed)")
        ax.set_ylabel("p95 program latency (s)")
        ax.set_title(f"{shape} at {HEADLINE:g}x pressure")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
