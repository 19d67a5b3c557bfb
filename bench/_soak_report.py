"""Checks, tables, plot and the BENCHMARKS.md section of ``bench/soak.py``, all from its JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _sections import machine_sentence

#: how far from its starting level a measure may end (a level of 0 must end at 0)
TOLERANCE = 0.05
#: the measures that must come back to their starting level, and what they are
CHECKED: dict[str, str] = {
    "rss_mb": "server RSS (MiB)",
    "engine_rss_mb": "engine processes' RSS (MiB)",
    "processes": "processes under the server",
    "fds": "server open file descriptors",
    "asyncio_tasks": "server asyncio tasks",
    "engine_running": "engine requests running",
    "engine_waiting": "engine requests waiting",
    "engine_live": "engine requests live (bridge)",
    "retained_blocks": "retained KV blocks",
    "retentions": "live retentions",
}
#: sampled and shown, not checked (worker threads come and go with their idle timeout)
SHOWN = ("threads", "requests_running", "collaborations_running")
#: outcomes that are failures whatever the request expected
FAILURES = ("stream_cut", "transport_error", "client_timeout")


def within(baseline: float, final: float, tolerance: float = TOLERANCE) -> bool:
    """``final`` is ``baseline`` ± ``tolerance`` (relative; 0 must stay 0)."""
    return abs(final - baseline) <= tolerance * abs(baseline)


def checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per checked measure: starting level, final level, change, and whether it is back."""
    base = _phase(data, "baseline")
    final = _phase(data, "final")
    tolerance = data["settings"].get("tolerance", TOLERANCE)
    rows = []
    for key, label in CHECKED.items():
        b, f = float(base[key]), float(final[key])
        rows.append(
            {
                "measure": key,
                "label": label,
                "baseline": b,
                "final": f,
                "change": (f - b) / b if b else (0.0 if f == b else float("inf")),
                "peak": max(float(s[key]) for s in data["samples"]),
                "ok": within(b, f, tolerance) and not final.get("not_idle"),
            }
        )
    return rows


def five_xx(data: dict[str, Any]) -> int:
    """5xx answers, as the clients saw them and as the server counted them (the larger)."""
    clients = sum(n for status, n in data["statuses"].items() if status.startswith("5"))
    served = sum(
        n for labels, n in data.get("server_requests", {}).items() if 'status="5' in labels
    )
    return int(max(clients, served))


def stream_errors(data: dict[str, Any]) -> int:
    """Streams that ended with an error event, were cut, or requests that failed in transit."""
    return sum(
        n
        for status, n in data["statuses"].items()
        if status.startswith("stream_error") or status in FAILURES
    )


def passed(data: dict[str, Any]) -> bool:
    """Every measure back at its level, no 5xx, every request answered as it expects."""
    return (
        all(row["ok"] for row in checks(data))
        and five_xx(data) == 0
        and stream_errors(data) == 0
        and not data["unexpected"]
    )


def sample_line(s: dict[str, Any]) -> str:
    """One sample on one line (printed while the soak runs)."""
    return (
        f"{s['phase']:>8} {s['requests']:>5} req {s['t_s']:>7.1f} s  rss {s['rss_mb']:.0f} MiB "
        f"(engine {s['engine_rss_mb']:.0f} in {s.get('processes', 0)})  fds {s['fds']}  "
        f"tasks {s['asyncio_tasks']}  "
        f"threads {s['threads']}  running {s['engine_running']} waiting {s['engine_waiting']} "
        f"live {s['engine_live']}  retained {s['retained_blocks']} blocks / "
        f"{s['retentions']}  in flight {s['requests_running']}  load {s['loadavg']:.2f}"
    )


def _phase(data: dict[str, Any], phase: str) -> dict[str, Any]:
    return next(s for s in data["samples"] if s["phase"] == phase)


def _number(value: float) -> str:
    return f"{value:.1f}" if not float(value).is_integer() else f"{value:.0f}"


def _change(row: dict[str, Any]) -> str:
    if row["baseline"] == row["final"]:
        return "0"
    if row["change"] == float("inf"):
        return "from 0"
    return f"{row['change'] * 100:+.1f} %"


def tables(data: dict[str, Any]) -> str:
    """The soak's Markdown: settings, the checks, the outcomes per kind, every sample."""
    s = data["settings"]
    m = data.get("machine", {})
    idle = data["idle_wait_s"]
    engine = "the real vLLM engine" if s["engine"] == "vllm" else "the ScriptedEngine"
    lines = [
        f"{s['requests']} requests (after {s['warmup']} of warm-up) from {s['concurrency']} "
        f"concurrent clients against one `{data['server']['command']}` process on "
        f"{engine}{' (vllm ' + s['vllm'] + ')' if s.get('vllm') else ''}; `max_tokens` "
        f"{s['max_tokens']}–16 ({s['long_tokens']} for requests cut on purpose, "
        f"{s['tool_tokens']} for tool calls); cancels time out after {s['cancel_after_s']} s; "
        f"a sample every {s['every']} requests. Run {data['run_s']:.0f} s "
        f"(warm-up {data['warmup']['seconds']:.0f} s, server start {data['server']['start_s']:.0f}"
        f" s); machine: {machine_sentence(m)}.",
        "",
        "**Starting level** = the sample after the warm-up, once the server was idle (no "
        "request, collaboration or engine request in flight, file descriptors steady, then "
        f"{s['settle_s']:g} s); **final** = the same after the run (idle after "
        f"{idle['baseline']:.1f} s and {idle['final']:.1f} s). Back = within "
        f"± {s['tolerance'] * 100:.0f} % (a level of 0 must be 0 again).",
        "",
        "| measure | starting level | peak during the run | final | change | back |",
        "|---|---|---|---|---|---|",
    ]
    for row in checks(data):
        lines.append(
            f"| {row['label']} | {_number(row['baseline'])} | {_number(row['peak'])} | "
            f"{_number(row['final'])} | {_change(row)} | {'yes' if row['ok'] else '**NO**'} |"
        )
    served = data.get("server_requests", {})
    lines += [
        "",
        f"5xx: {five_xx(data)}; streams ended by an error event or cut: {stream_errors(data)}; "
        f"answers other than expected: {len(data['unexpected'])}; server exit status after "
        f"SIGTERM: {data['server'].get('exit_code')}. "
        + ("**All checks passed.**" if passed(data) else "**Some checks FAILED.**"),
        "",
        "| kind | requests | outcomes | p50 s |",
        "|---|---|---|---|",
    ]
    for kind, outcomes in data["by_kind"].items():
        text = ", ".join(f"{o} × {n}" for o, n in outcomes.items())
        lines.append(
            f"| {kind} | {sum(outcomes.values())} | {text} | "
            f"{data['seconds_p50'].get(kind, 0):.2f} |"
        )
    lines += [
        "",
        "Outcomes: an HTTP status; `left` = the client disconnected mid-stream as planned; "
        "`cancelled` = the client's timeout fired and it closed the connection. As the server "
        "counted them (`microagent:requests_total`): "
        + ", ".join(f"`{k}` {v:.0f}" for k, v in sorted(served.items()))
        + ".",
    ]
    if data["unexpected"]:
        lines += ["", "Unexpected answers (first 10):", ""]
        for u in data["unexpected"][:10]:
            lines.append(
                f"- {u['kind']} ({u['variant']}): expected {u['expected']}, got {u['got']}: "
                f"`{u['detail'][:160]}`"
            )
    lines += [
        "",
        "| phase | requests | t s | RSS MiB | engine MiB | processes | fds | threads "
        "| asyncio tasks | running | waiting | live | retained blocks | retentions | in flight |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in data["samples"]:
        lines.append(
            f"| {x['phase']} | {x['requests']} | {x['t_s']:.0f} | {x['rss_mb']:.1f} | "
            f"{x['engine_rss_mb']:.1f} | {x.get('processes', 0)} | {x['fds']} | {x['threads']} | "
            f"{x['asyncio_tasks']} | "
            f"{x['engine_running']} | {x['engine_waiting']} | {x['engine_live']} | "
            f"{x['retained_blocks']} | {x['retentions']} | {x['requests_running']} |"
        )
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    """The curves: each measure against requests done, its starting level and the ± band."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    panels = (
        ("rss_mb", "server RSS (MiB)"),
        ("engine_rss_mb", "engine processes' RSS (MiB)"),
        ("fds", "open fds"),
        ("asyncio_tasks", "asyncio tasks"),
        ("engine_running", "engine running / waiting"),
        ("retained_blocks", "retained KV blocks"),
    )
    samples = data["samples"]
    base = _phase(data, "baseline")
    final = _phase(data, "final")
    tolerance = data["settings"].get("tolerance", TOLERANCE)
    fig = Figure(figsize=(11, 6))
    for n, (key, title) in enumerate(panels, start=1):
        ax = fig.add_subplot(2, 3, n)
        run = [s for s in samples if s["phase"] == "run"]
        ax.plot([s["requests"] for s in run], [s[key] for s in run], ".-", label="during")
        if key == "engine_running":
            ax.plot([s["requests"] for s in run], [s["engine_waiting"] for s in run], "x:")
        level = base[key]
        ax.axhline(level, color="grey", lw=0.8)
        if level:
            ax.axhspan(level * (1 - tolerance), level * (1 + tolerance), color="grey", alpha=0.2)
        ax.plot([0], [level], "go", label="start (idle)")
        ax.plot([final["requests"]], [final[key]], "rs", label="end (idle)")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("requests", fontsize=8)
        ax.tick_params(labelsize=7)
        if n == 1:
            ax.legend(fontsize=7)
    fig.suptitle(f"soak: {data['settings']['requests']} mixed requests, one server")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
