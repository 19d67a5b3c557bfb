"""Tables and the BENCHMARKS.md section of ``bench/tools.py``, all from its JSON."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from _sections import machine_sentence


def medians(data: dict[str, Any]) -> dict[tuple[int, str], dict[str, float]]:
    """Per (load, system): medians over repetitions of wall time and computed prompt tokens."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        groups[(run["load"], run["system"])].append(run)
    out = {}
    for key, runs in sorted(groups.items()):
        later = [
            sum(r["computed_per_step"][1:]) / max(1, len(r["computed_per_step"]) - 1) for r in runs
        ]
        out[key] = {
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "computed_after_first": statistics.median(later),
            "computed_total": statistics.median(sum(r["computed_per_step"]) for r in runs),
            "tool_calls": statistics.median(r["tool_calls"] for r in runs),
            "invalid_calls": sum(r.get("invalid_calls", 0) for r in runs),
            "steps": statistics.median(r["steps"] for r in runs),
            "runs": len(runs),
            "loadavg": max(r["loadavg_before"] for r in runs),
        }
    return out


def tables(data: dict[str, Any]) -> str:
    s = data["settings"]
    m = data.get("machine", {})
    rows = medians(data)
    lines = [
        f"Settings: one agent, {s['steps']} tool calls of {s['tool_seconds'] * 1000:.0f} ms, "
        f"context ~{s['context_words']} words, KV cache {s['kv_blocks']} blocks × 128 tokens, "
        f"{s['reps']} repetition(s), background load = concurrent requests on fresh contexts. "
        f"Machine: {machine_sentence(m)}. Medians over repetitions.",
        "",
        "| background load | system | loop wall s | tool calls | invalid arguments (all runs) "
        "| computed / step after the first | computed in all |",
        "|---|---|---|---|---|---|---|",
    ]
    for (load, system), r in rows.items():
        lines.append(
            f"| {load} | {system} | {r['wall_s']:.2f} | {r['tool_calls']:.0f} | "
            f"{r['invalid_calls']:.0f} | {r['computed_after_first']:.0f} | "
            f"{r['computed_total']:.0f} |"
        )
    lines += ["", "| background load | wall microagent / client | computed microagent / client |"]
    lines.append("|---|---|---|")
    for load in sorted({load for load, _ in rows}):
        ours, base = rows.get((load, "microagent")), rows.get((load, "client"))
        if ours is None or base is None:
            continue
        lines.append(
            f"| {load} | {ours['wall_s'] / base['wall_s']:.2f}× | "
            f"{ours['computed_total'] / max(1.0, base['computed_total']):.2f}× |"
        )
    return "\n".join(lines)
