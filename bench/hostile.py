"""Issue 36's two measured acceptance figures, on a real ``microagent serve``.

* **A client that stops reading.** The server's RSS after the same stream read
  to its end, then after 60 s of it sent to a client that reads nothing (its
  socket's receive buffer set small): the server holds at most its stream buffer
  and cuts the stream when it stays full (``server/_sse.py``), so memory stays
  flat. The server runs the ScriptedEngine, which outruns any socket buffer as
  the issue's repro did (the CPU engine's ~100 tokens/s would not test it).
  Target: RSS after within 5 % of RSS before.
* **The EngineCore killed under load.** 12 non-streaming vote collaborations
  (3 voters, 200 tokens) in flight; the EngineCore is SIGKILLed ``--kill-after``
  seconds after they were sent; each client waits 60 s. Reruns continue from the
  tokens the first run generated (``engine_bridge.resume_journal``). Target: at
  least 10 of 12 answer 200 within 60 s, in every repetition; the rest a JSON 503.

Writes ``bench/results/hostile.json`` (with ``targets``) and, with ``--update``,
its family page and headline row (``bench/report.py``). Refuses to start when the
1-minute load average is 1 or more (``--force`` to override; the report says so).

Usage: ``.venv/bin/python bench/hostile.py [--repeats N] [--update]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _sections import (  # noqa: E402
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine,
    machine_cell,
    machine_sentence,
    page,
    publish,
)
from _serve import MicroagentServe  # noqa: E402

RESULTS = HERE / "results"
VOTE = {
    "messages": [{"role": "user", "content": "Name one colour of the sky. Explain in detail."}],
    "max_tokens": 200,
    "agents": [{"name": "voter", "count": 3}],
    "collaboration": {"mode": "vote"},
}
CLIENT_TIMEOUT = 60.0


class Server(MicroagentServe):
    """``microagent serve`` (``_serve``), with what this bench reads of its processes."""

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def engine_cores(self) -> list[int]:
        found = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                    found.append(p.pid)
            except psutil.Error:
                continue
        return found


#: the stalled client's server: the ScriptedEngine decoding ~2 000 tokens/s per sequence,
#: so its stream (32 voters x 4 000 tokens, ~20 MB of events) outruns any socket buffer, as
#: the issue's repro did; the request budget is raised so the request is admitted at all
STALL_SERVER = (
    "--engine",
    "scripted",
    "--engine-arg",
    "reply_words=[4000,4000]",
    "--engine-arg",
    "decode_time_per_token=0.0005",
    "--max-request-tokens",
    "1000000",
)
STALL_BODY = {
    **VOTE,
    "stream": True,
    "max_tokens": 4000,
    "agents": [{"name": "voter", "count": 32}],
}


def stalled_client(srv: Server, seconds: float) -> dict[str, Any]:
    """RSS before and after ``seconds`` of a streaming client that reads nothing."""
    with httpx.stream(
        "POST", srv.url + "/v1/chat/completions", json=STALL_BODY, timeout=300
    ) as warm:  # the same stream, read to its end: what a reading client costs
        events = sum(1 for line in warm.iter_lines() if line.startswith("data: "))
    time.sleep(2.0)  # let the allocator settle after the warm-up (a measurement, not a sync)
    before = srv.rss()
    body = json.dumps(STALL_BODY).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", srv.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    samples = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(5.0)
        samples.append(round(srv.rss() / 2**20, 1))
    after = srv.rss()
    sock.close()
    return {
        "seconds": seconds,
        "rss_before_mib": round(before / 2**20, 1),
        "rss_after_mib": round(after / 2**20, 1),
        "rss_samples_mib": samples,
        "ratio": round(after / before, 4),
        "events_of_a_reading_client": events,
        "collaborations_running_after": srv.metric("microagent:collaborations_running"),
    }


def engine_kill(srv: Server, kill_after: float) -> dict[str, Any]:
    """12 vote collaborations, the EngineCore killed under them; what each client got."""
    outcomes: list[dict[str, Any]] = []
    resumed_before = srv.metric("microagent:engine_resumed_tokens_total")

    async def one(client: httpx.AsyncClient) -> None:
        start = time.monotonic()
        try:
            r = await client.post("/v1/chat/completions", json=VOTE, timeout=CLIENT_TIMEOUT)
            json_body = r.headers.get("content-type", "").startswith("application/json")
            outcomes.append(
                {"status": r.status_code, "json": json_body, "s": time.monotonic() - start}
            )
        except httpx.TimeoutException:
            outcomes.append({"status": "timeout", "json": False, "s": time.monotonic() - start})

    async def main() -> None:
        async with httpx.AsyncClient(base_url=srv.url) as client, anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(one, client)
            await anyio.sleep(kill_after)
            for pid in srv.engine_cores():
                os.kill(pid, signal.SIGKILL)

    anyio.run(main)
    ok = [o for o in outcomes if o["status"] == 200]
    return {
        "kill_after_s": kill_after,
        "answered_200": len(ok),
        "json_503": sum(o["status"] == 503 and o["json"] for o in outcomes),
        "other": sorted(str(o["status"]) for o in outcomes if o["status"] not in (200, 503)),
        "latest_200_s": round(max((o["s"] for o in ok), default=0.0), 1),
        "resumed_tokens": srv.metric("microagent:engine_resumed_tokens_total") - resumed_before,
        "restart_s": restart_seconds(srv),
    }


def restart_seconds(srv: Server) -> float | None:
    """The last restart's duration, from the bridge's log line."""
    found = None
    srv.log.flush()
    for line in Path(srv.log.name).read_text().splitlines():
        if "restarted (epoch" in line and " s after its death" in line:
            found = float(line.split(")")[-1].split(" s after")[0])
    return found


def report(data: dict[str, Any]) -> str:
    """The family page's tables, every number from ``data``."""
    stall, kills = data["stalled_client"], data["engine_kill"]
    lines = [
        f"Machine: {machine_sentence(data['machine'])}.",
        "",
        "| figure | measured | target | met |",
        "|---|---|---|---|",
    ]
    for t in data["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {t['target']} | {t['met']} |")
    lines += [
        "",
        f"Stalled client (a ScriptedEngine server, a stream of "
        f"{stall['events_of_a_reading_client']} events when read): "
        f"RSS {stall['rss_before_mib']} MiB before, "
        f"{stall['rss_after_mib']} MiB after {stall['seconds']:.0f} s "
        f"(samples every 5 s: {', '.join(map(str, stall['rss_samples_mib']))} MiB); "
        f"collaborations still running after it: {stall['collaborations_running_after']:.0f}.",
        "",
        "| repetition | 200 within 60 s | JSON 503 | other | latest 200 | restart | "
        "tokens kept by reruns |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(kills, 1):
        lines.append(
            f"| {i} | {k['answered_200']}/12 | {k['json_503']} | {', '.join(k['other']) or '-'} "
            f"| {k['latest_200_s']} s | {k['restart_s']} s | {k['resumed_tokens']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The hostile-clients page and headline, from ``hostile.json`` in ``results``."""
    data = json.loads((results / "hostile.json").read_text())
    kills = data["engine_kill"]
    worst = min(k["answered_200"] for k in kills)
    stall = data["stalled_client"]
    return FamilyReport(
        family="hostile",
        title="Hostile clients and engine death",
        headline=Headline(
            figure="collaborations answered 200 within 60 s of an EngineCore kill",
            value=f"{worst}/12 (worst of {len(kills)} kills)",
            baseline="no kill: 12/12",
            target=f">= 10/12: {'met' if worst >= 10 else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"A client that stops reading leaves the server's RSS at {stall['ratio']:.3f}x its "
            f"size before; an EngineCore SIGKILLed under 12 vote collaborations still answers "
            f"at worst {worst}/12 with 200 within 60 s (reruns continue from the tokens the "
            "first run generated)."
        ),
        page=page(
            "Hostile clients and engine death (`bench/hostile.py`)",
            __doc__,
            [("Results", report(data) + "\n" + data_line("hostile.json"))],
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="engine kills (default 2)")
    parser.add_argument("--kill-after", type=float, default=8.0, help="seconds (default 8)")
    parser.add_argument("--stall-seconds", type=float, default=60.0)
    parser.add_argument("--force", action="store_true", help="run on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if load >= 1 and not args.force:
        raise SystemExit(f"load average {load:.2f} >= 1: not a quiet machine (--force)")
    started = time.time()
    RESULTS.mkdir(exist_ok=True)
    scripted = Server(RESULTS / "hostile_scripted.log", *STALL_SERVER)
    try:
        stall = stalled_client(scripted, args.stall_seconds)
    finally:
        scripted.stop()
    srv = Server(RESULTS / "hostile_serve.log")
    try:
        kills = [engine_kill(srv, args.kill_after) for _ in range(args.repeats)]
    finally:
        srv.stop()
    worst = min(k["answered_200"] for k in kills)
    rest_ok = all(k["answered_200"] + k["json_503"] == 12 for k in kills)
    targets = [
        {
            "name": "server RSS after 60 s of a client that stops reading",
            "measured": f"{stall['ratio']:.3f}x",
            "target": "within 5 % of before",
            "met": abs(stall["ratio"] - 1) <= 0.05,
        },
        {
            "name": "EngineCore killed under 12 vote collaborations: 200 within 60 s",
            "measured": f"{worst}/12 (worst of {len(kills)})",
            "target": ">= 10/12, the rest a JSON 503",
            "met": worst >= 10 and rest_ok,
        },
    ]
    data = {
        "machine": machine(load, args.force, started),
        "stalled_client": stall,
        "engine_kill": kills,
        "targets": targets,
    }
    out = RESULTS / "hostile.json"
    out.write_text(json.dumps(data, indent=2) + "\n")
    table = report(data)
    print(table)
    if args.update:
        publish(ROOT, family_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
