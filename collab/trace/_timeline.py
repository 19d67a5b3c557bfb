"""The timeline figure of a collaboration trace: one lane per agent, turns coloured by phase."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._recorder import _COLLAB_TID, _US, PHASES, TraceRecorder

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASE_COLORS = {"mailbox wait": "#c7c7c7", "queued+prefill": "#f28e2b", "decode": "#4e79a7"}
PRUNED_COLOR = "#d62728"
FINAL_COLOR = "#2ca02c"


def plot_timeline(
    trace: TraceRecorder | Mapping[str, Any], path: str | os.PathLike[str] | None = None
) -> Figure:
    """Draw a collaboration timeline: one lane per agent, its turns coloured by phase.

    Pruned (or aborted) turns are hatched red and marked with a red cross, and
    the lane's label says "(pruned)"; dashed lines mark rounds, a green line the
    final answer. Needs matplotlib (``pip install 'microagent[server]'``); uses
    the Agg backend through ``matplotlib.figure.Figure`` (no pyplot state).

    Args:
        trace: a ``TraceRecorder`` or a trace dict (``to_chrome_trace()`` or a loaded trace file).
        path: where to save the figure as PNG (not saved if None).

    Returns:
        The figure.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = trace.to_chrome_trace() if isinstance(trace, TraceRecorder) else trace
    t = _extract(data)
    fig = Figure(figsize=(10.0, 1.6 + 0.45 * max(len(t.order), 1)), layout="constrained")
    FigureCanvasAgg(fig)
    _draw(fig, fig.add_subplot(), t)
    if path is not None:
        fig.savefig(path, format="png", dpi=120)
    return fig


@attrs.define
class _Timeline:
    """What the figure shows, read from a trace's events (times already in ``unit``)."""

    meta: Mapping[str, Any]
    lanes: dict[int, Mapping[str, Any]]
    order: list[int]
    row: dict[int, int]
    total: float
    scale: float
    unit: str
    pruned_lanes: set[int]
    segments: dict[tuple[int, str], list[tuple[float, float]]]
    failed: dict[int, list[tuple[float, float]]]
    turn_labels: dict[int, list[tuple[tuple[float, float], str]]]
    marks: list[tuple[float, int]]
    votes: list[tuple[float, int]]
    vlines: list[tuple[float, str, str]]


def _extract(data: Mapping[str, Any]) -> _Timeline:
    """The lanes, turns, phases and marks of a trace dict (``to_chrome_trace()``'s form)."""
    events: list[Mapping[str, Any]] = list(data.get("traceEvents", ()))
    meta: Mapping[str, Any] = data.get("metadata", {}) or {}
    lanes: dict[int, Mapping[str, Any]] = {
        int(e["tid"]): e.get("args", {})
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("tid") != _COLLAB_TID
    }
    order = sorted(lanes)
    row = {tid: i for i, tid in enumerate(order)}
    total = float(meta.get("total_time_s") or 0.0)
    total = max(
        [
            total,
            *(
                (float(e["ts"]) + float(e.get("dur", 0))) / _US
                for e in events
                if e.get("ph") in ("X", "i")
            ),
        ]
    )
    scale, unit = (1000.0, "ms") if total < 1.0 else (1.0, "s")

    def x(ts_us: float) -> float:
        return ts_us / _US * scale

    pruned_lanes: set[int] = {tid for tid, args in lanes.items() if args.get("pruned")}
    segments: dict[tuple[int, str], list[tuple[float, float]]] = {}
    failed: dict[int, list[tuple[float, float]]] = {}
    turn_labels: dict[int, list[tuple[tuple[float, float], str]]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("tid") not in row:
            continue
        span = (x(float(e["ts"])), x(float(e["dur"])))
        if e.get("cat") == "turn" and e.get("name") not in ("pruned", "aborted", "error"):
            turn_labels.setdefault(int(e["tid"]), []).append(
                (span, str(e.get("args", {}).get("label", e["name"])))
            )
        if e.get("cat") == "phase":
            segments.setdefault((int(e["tid"]), str(e["name"])), []).append(span)
        elif e.get("cat") == "turn" and e.get("name") in ("pruned", "aborted", "error"):
            turn_labels.setdefault(int(e["tid"]), []).append((span, str(e["name"])))
            failed.setdefault(int(e["tid"]), []).append(span)
            pruned_lanes.add(int(e["tid"]))
    marks: list[tuple[float, int]] = []
    votes: list[tuple[float, int]] = []
    tid_of_agent = {str(args.get("agent")): tid for tid, args in lanes.items()}
    vlines: list[tuple[float, str, str]] = []
    for e in events:
        if e.get("ph") != "i":
            continue
        name, track, at = str(e.get("name")), e.get("tid"), x(float(e["ts"]))
        if name in ("pruned", "aborted") and track in row:
            marks.append((at, row[int(track)]))
            pruned_lanes.add(int(track))
        elif name == "vote":
            voter = tid_of_agent.get(str(e.get("args", {}).get("agent")))
            if voter is not None:
                votes.append((at, row[voter]))
        elif name == "round":
            vlines.append((at, f"round {e.get('args', {}).get('round', '')} done", "#555555"))
        elif name == "final":
            vlines.append((at, "final", FINAL_COLOR))
    return _Timeline(
        meta=meta,
        lanes=lanes,
        order=order,
        row=row,
        total=total,
        scale=scale,
        unit=unit,
        pruned_lanes=pruned_lanes,
        segments=segments,
        failed=failed,
        turn_labels=turn_labels,
        marks=marks,
        votes=votes,
        vlines=vlines,
    )


def _draw(fig: Figure, ax: Axes, t: _Timeline) -> None:
    """Draw ``t`` on ``ax`` (bars, marks, lines, labels) and its legend on ``fig``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    row, total, scale, unit, order = t.row, t.total, t.scale, t.unit, t.order
    lanes, pruned_lanes, failed, marks, votes, vlines = (
        t.lanes,
        t.pruned_lanes,
        t.failed,
        t.marks,
        t.votes,
        t.vlines,
    )
    height = 0.6
    for (tid, phase), spans in t.segments.items():
        ax.broken_barh(
            spans,
            (row[tid] - height / 2, height),
            facecolors=PHASE_COLORS.get(phase, "#999999"),
            edgecolor="white",
            linewidth=0.5,
            label=f"_phase {phase}",
        )
    for tid, spans in failed.items():
        ax.broken_barh(
            spans,
            (row[tid] - height / 2, height),
            facecolors="none",
            edgecolor=PRUNED_COLOR,
            hatch="////",
            linewidth=1.0,
            label="_pruned",
        )

    if marks:
        ax.plot(
            [m[0] for m in marks],
            [m[1] for m in marks],
            linestyle="none",
            marker="X",
            markersize=11,
            color=PRUNED_COLOR,
            markeredgecolor="white",
            zorder=5,
            gid="pruned-marker",
        )
    if votes:
        ax.plot(
            [v[0] for v in votes],
            [v[1] for v in votes],
            linestyle="none",
            marker="d",
            markersize=7,
            color="black",
            zorder=5,
            gid="vote-marker",
        )
    # end-of-round and final lines; labels at (almost) the same time are merged
    merged: list[tuple[float, list[str], str]] = []
    for at, text, color in sorted(vlines):
        ax.axvline(
            at, color=color, linestyle="-" if text == "final" else "--", linewidth=1.2, zorder=1
        )
        if merged and at - merged[-1][0] < 0.04 * total * scale:
            merged[-1][1].append(text)
            if text == "final":
                merged[-1] = (merged[-1][0], merged[-1][1], color)
        else:
            merged.append((at, [text], color))
    for at, texts, color in merged:
        right = at > 0.85 * total * scale
        ax.annotate(
            " · ".join(texts),
            (at, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-2 if right else 2, 2),
            textcoords="offset points",
            fontsize=8,
            color=color,
            va="bottom",
            ha="right" if right else "left",
        )
    for lane, labelled in t.turn_labels.items():  # each turn's label, where the bar is wide enough
        for (start, width), label in labelled:
            if width > 0.07 * total * scale:
                ax.text(
                    start + width / 2,
                    row[lane],
                    label,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="#222222",
                    bbox={
                        "boxstyle": "round,pad=0.15",
                        "facecolor": "white",
                        "alpha": 0.75,
                        "linewidth": 0,
                    },
                )

    ax.set_yticks(range(len(order)))
    labels = [
        str(lanes[tid].get("agent") or lanes[tid].get("name"))
        + (" (pruned)" if tid in pruned_lanes else "")
        for tid in order
    ]
    ax.set_yticklabels(labels)
    for tick, tid in zip(ax.get_yticklabels(), order, strict=True):
        if tid in pruned_lanes:
            tick.set_color(PRUNED_COLOR)
    ax.set_ylim(len(order) - 0.5, -0.5)  # first agent on top
    ax.set_xlim(0, total * scale * 1.02 or 1.0)
    ax.set_xlabel(f"time since the collaboration started ({unit})")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.set_axisbelow(True)
    mode = t.meta.get("mode") or "collaboration"
    title = f"{mode}: {len(order)} agents, {total * scale:.3g} {unit}"
    answer = t.meta.get("answer")
    if isinstance(answer, str) and answer.strip():
        short = " ".join(answer.split())
        if len(short) > 48:
            short = short[:47] + "\u2026"
        title += f" \u2014 answer: {short}"
    ax.set_title(title, loc="left", pad=14)

    handles: list[Any] = [Patch(facecolor=PHASE_COLORS[p], label=p) for p in PHASES]
    if failed:
        handles.append(
            Patch(
                facecolor="none",
                edgecolor=PRUNED_COLOR,
                hatch="////",
                label="pruned / aborted turn",
            )
        )
    if marks:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="X",
                color=PRUNED_COLOR,
                markersize=9,
                label="pruned",
            )
        )
    if votes:
        handles.append(Line2D([], [], linestyle="none", marker="d", color="black", label="vote"))
    if any(t != "final" for _, t, _ in vlines):
        handles.append(Line2D([], [], linestyle="--", color="#555555", label="round"))
    if any(t == "final" for _, t, _ in vlines):
        handles.append(Line2D([], [], color=FINAL_COLOR, label="final answer"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 4),
        fontsize=8,
        frameon=False,
    )
