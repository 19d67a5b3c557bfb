"""``bench/soak.py --chaos``: mixed traffic for a fixed time while the engine is killed.

The soak's request mix (plain completions, every collaboration mode, streams,
sessions, client and server tools, bad inputs, clients that leave or time out)
runs from ``--concurrency`` clients for ``--minutes``. Every 3–5 minutes the
EngineCore process under the server is SIGKILLed; the killer then waits for the
server to answer again (a one-token completion succeeds), pauses the traffic,
waits until the server is idle and samples it (memory, descriptors, asyncio
tasks), and lets the traffic go on.

A *kill window* runs from the kill until the first request after it succeeds,
plus ``WINDOW_GRACE`` seconds. Per request: its kind, start, end and outcome.
The checks (``chaos_targets``):

* hung requests: 0 (a request without a client timeout of its own that ran into
  the client's 300 s);
* 5xx outside the kill windows: 0;
* a non-streaming request that overlapped a kill window: 200 (the server ran it
  again) or a 503 with ``Retry-After``;
* streams cut without the error event: 0 (a stream ends with ``[DONE]``, an
  error event before it when it failed);
* after each recovery, the idle server's and engine's resident memory, open
  descriptors and asyncio tasks within ±5 % of the level before the first kill.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import _soak_requests as Q
from _sections import machine_sentence

#: seconds after a recovery during which failures still count to the kill
WINDOW_GRACE = 5.0
#: what must come back to its level after each recovery
MEASURES = ("rss_mb", "engine_rss_mb", "fds", "asyncio_tasks")
#: the client's own timeout: a request without one of its own that reaches it hung
CLIENT_TIMEOUT_S = 300.0


@dataclass
class Record:
    kind: str
    stream: bool
    start: float
    end: float
    outcome: str
    detail: str


@dataclass
class Chaos:
    """What one chaos run saw: the requests, the kills and the samples after each."""

    records: list[Record] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: when the traffic began (monotonic): kills' ``t_s`` count from here
    t0: float = 0.0


def engine_core(pid: int) -> int | None:
    """The pid of the EngineCore process under the server ``pid`` (None when there is none)."""
    import psutil

    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return int(child.pid)
        except psutil.Error:
            continue
    return None


async def _recovered(client: Any, deadline: float) -> float | None:
    """Monotonic time when a one-token completion first succeeds (None: not by ``deadline``)."""
    body = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    while time.monotonic() < deadline:
        try:
            r = await client.post("/v1/chat/completions", json=body, timeout=60)
            if r.status_code == 200:
                return time.monotonic()
        except Exception:  # the server is restarting its engine: ask again
            pass
        await asyncio.sleep(0.5)
    return None


async def run_chaos(
    client: Any,
    probe: Any,
    pid: int,
    *,
    minutes: float,
    concurrency: int,
    cancel_after: float,
    seed: int,
    kill_every: tuple[float, float],
    idle_sample: Any,
) -> Chaos:
    """Drive the mix for ``minutes`` and kill the engine every ``kill_every`` seconds."""
    chaos = Chaos()
    rng = random.Random(seed)
    t0 = chaos.t0 = time.monotonic()
    deadline = t0 + minutes * 60
    open_gate = asyncio.Event()
    open_gate.set()
    running = Counter[str]()
    counter = iter(range(10**9))
    kinds = Q.schedule(100_000, seed, Q.CHAOS_MIX)

    async def worker() -> None:
        while time.monotonic() < deadline:
            await open_gate.wait()
            i = next(counter)
            call = Q.make_call(kinds[i % len(kinds)], i, cancel_after)
            start = time.monotonic()
            running["n"] += 1
            try:
                outcome, detail = await Q.send(client, call)
            finally:
                running["n"] -= 1
            chaos.records.append(
                Record(call.kind, call.stream, start, time.monotonic(), outcome, detail[:200])
            )

    async def killer() -> None:
        while True:
            wait = rng.uniform(*kill_every)
            if time.monotonic() + wait > deadline - 60:  # leave time to recover and sample
                return
            await asyncio.sleep(wait)
            core = engine_core(pid)
            if core is None:
                chaos.kills.append({"t_s": round(time.monotonic() - t0, 1), "error": "no engine"})
                continue
            killed = time.monotonic()
            os.kill(core, signal.SIGKILL)
            back = await _recovered(probe, killed + 600)
            kill: dict[str, Any] = {
                "t_s": round(killed - t0, 1),
                "engine_pid": core,
                "recovered_s": None if back is None else round(back - killed, 1),
            }
            chaos.kills.append(kill)
            open_gate.clear()  # quiet the traffic to sample an idle server
            s, waited = await idle_sample(probe, pid, f"after kill {len(chaos.kills)}", 0, t0, 3.0)
            s["idle_wait_s"] = waited
            chaos.samples.append(s)
            open_gate.set()

    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
        tg.create_task(killer())
    return chaos


def windows(chaos: Chaos, t0: float) -> list[tuple[float, float]]:
    """Each kill's window in monotonic seconds: the kill until recovery plus the grace."""
    out = []
    for kill in chaos.kills:
        if "engine_pid" not in kill:
            continue
        start = t0 + kill["t_s"]
        recovered = kill["recovered_s"] if kill["recovered_s"] is not None else 600.0
        out.append((start, start + recovered + WINDOW_GRACE))
    return out


def summarize(chaos: Chaos, baseline: dict[str, Any]) -> dict[str, Any]:
    """The chaos run as JSON: counts, the checks' measures, the kills, the samples and every
    request's record (so the checks can be recomputed from the file)."""
    t0 = chaos.t0
    spans = windows(chaos, t0)

    def in_window(r: Record) -> bool:
        return any(r.start <= end and r.end >= start for start, end in spans)

    hung = [r for r in chaos.records if r.outcome == "client_timeout"]
    five_out = [r for r in chaos.records if r.outcome.startswith("5") and not in_window(r)]
    plain_in = [
        r for r in chaos.records if not r.stream and in_window(r) and r.kind not in ("cancel",)
    ]
    bad_in = [
        r
        for r in plain_in
        if not (
            r.outcome in ("200", "400", "404", "413")
            or (r.outcome == "503" and "retry-after=" in r.detail)
        )
    ]
    cut = [r for r in chaos.records if r.stream and r.outcome in ("stream_cut", "transport_error")]
    # the first restart may add what a restarted engine keeps (its new sockets, the
    # restart watcher): that step is reported against the level before any kill; flat
    # means every later recovery comes back to the first recovery's level
    drift = []
    first = chaos.samples[0] if chaos.samples else None
    for n, s in enumerate(chaos.samples):
        ref = baseline if n == 0 or first is None else first
        against = "before the first kill" if n == 0 else "after the first recovery"
        for key in MEASURES:
            base = ref.get(key) or 0
            ratio = (s[key] / base) if base else (1.0 if s[key] == 0 else float("inf"))
            drift.append(
                {"sample": s["phase"], "measure": key, "against": against, "ratio": round(ratio, 3)}
            )
    return {
        "requests": len(chaos.records),
        "outcomes": dict(Counter(r.outcome for r in chaos.records).most_common()),
        "kills": chaos.kills,
        "windows_s": [[round(a - t0, 1), round(b - t0, 1)] for a, b in spans],
        "hung": len(hung),
        "five_xx_outside_windows": [(r.kind, r.outcome, r.detail) for r in five_out][:20],
        "non_streaming_in_windows": dict(Counter(r.outcome for r in plain_in)),
        "non_streaming_in_windows_bad": [(r.kind, r.outcome, r.detail) for r in bad_in][:20],
        "streams_cut": [(r.kind, r.outcome, r.detail) for r in cut][:20],
        "streams_cut_count": len(cut),
        "baseline": baseline,
        "samples": chaos.samples,
        "drift": drift,
        "records": [
            [r.kind, r.stream, round(r.start - t0, 3), round(r.end - t0, 3), r.outcome, r.detail]
            for r in chaos.records
        ],
    }


def chaos_targets(summary: dict[str, Any], tolerance: float = 0.05) -> list[dict[str, Any]]:
    """The issue's targets, each with its measure and whether it was met."""
    later = [d for d in summary["drift"] if d["against"] == "after the first recovery"]
    worst = max((abs(d["ratio"] - 1) for d in later), default=None)
    bad_in = len(summary["non_streaming_in_windows_bad"])
    kills = sum(1 for k in summary["kills"] if "engine_pid" in k)
    return [
        {"target": "at least 3 000 requests", "measured": summary["requests"],
         "met": summary["requests"] >= 3000},
        {"target": "the engine killed every 3-5 minutes", "measured": kills, "met": kills >= 1},
        {"target": "hung requests: 0", "measured": summary["hung"], "met": summary["hung"] == 0},
        {"target": "5xx outside the kill windows: 0",
         "measured": len(summary["five_xx_outside_windows"]),
         "met": not summary["five_xx_outside_windows"]},
        {"target": "non-streaming requests in a kill window: 200 after the retry, or 503 "
         "with Retry-After", "measured": f"{bad_in} otherwise "
         f"({summary['non_streaming_in_windows']})", "met": bad_in == 0},
        {"target": "streams cut without the error event: 0",
         "measured": summary["streams_cut_count"], "met": summary["streams_cut_count"] == 0},
        {"target": "server and engine RSS, fds and asyncio tasks flat (±5 %) from one "
         "recovery to the next", "measured": None if worst is None else f"worst {worst:.1%}",
         "met": worst is not None and worst <= tolerance},
    ]  # fmt: skip


def chaos_tables(data: dict[str, Any]) -> str:
    """Markdown: the run, the kills and the targets."""
    c = data["chaos"]
    m = data["machine"]
    lines = [
        f"{c['requests']} requests from {data['settings']['concurrency']} clients over "
        f"{data['settings']['minutes']:g} minutes on the {data['settings']['engine']} engine; "
        f"machine: {machine_sentence(m)}. "
        f"Outcomes: {', '.join(f'{k} {v}' for k, v in c['outcomes'].items())}.",
        "",
        "| kill | at (s) | recovered after (s) |",
        "|---|---|---|",
    ]
    for i, k in enumerate(c["kills"], 1):
        lines.append(f"| {i} | {k['t_s']} | {k.get('recovered_s', k.get('error'))} |")
    lines += [
        "",
        "| measure, idle after each recovery | against | ratio |",
        "|---|---|---|",
    ]
    for d in c["drift"]:
        lines.append(f"| {d['sample']}: {d['measure']} | {d['against']} | {d['ratio']:.3f} |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in data["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"
