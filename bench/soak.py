"""Soak: thousands of mixed requests against one server process, then back to where it started.

One ``microagent serve`` process (the real vLLM engine by default, or the
ScriptedEngine with ``--engine scripted``), started with a server tool
(``--tool lookup=_soak_requests:lookup``), gets ``--requests`` small requests
(``max_tokens`` 8–16; longer only where a request is meant to be cut) from
``--concurrency`` clients: plain completions (``n``, logprobs, JSON output,
client function calls), every collaboration mode (vote, debate, reflect,
aggregate, cascade, graph, best_of, auto), streams read to the end, streams
the client leaves after a few events, requests the client gives up on (a
client timeout: the server must cancel the work), bad inputs (400s, a 404)
and collaborations whose agents call the server tool.

Every ``--every`` requests it samples the server: resident memory (the server
process and the EngineCore under it), open file descriptors
(``/proc/PID/fd``), the event loop's asyncio tasks
(``microagent:asyncio_tasks``), the engine's running, waiting and live
requests, retained KV blocks and retentions (``/metrics``).

**Starting level** = the sample taken after a warm-up, once the server is
idle. The warm-up first prefills unique prompts of many lengths, up to the
longest step the scheduler runs (``--fill-tokens`` in all: the engine worker's
memory follows the sizes of the steps it has run, per-shape kernels and the
allocator's high-water mark, and repeated sizes add nothing), then runs
``--warmup`` requests of the same mix (the first requests allocate caches
legitimately: compiled grammars, tokenizer and template caches, vLLM's buffers). After the
run, once the server is idle again, every checked measure must be back at that
level ± 5 % (a level of 0 must be 0 again). Idle = no request, collaboration or
engine request in flight, no live retention (the server runs with
``--session-ttl-max`` of ``--session-ttl`` seconds, so every retained turn ends),
file descriptors steady, then a settling pause. No
response may be a 5xx and every bad input must get the status it expects.

Writes ``bench/results/soak[_quick].json``, a Markdown table of the checks and
the samples, a PNG of the curves; ``--update`` rewrites its family page
and headline row (``bench/_soak_report.py``, ``bench/report.py``). Exit status 1
when a check fails. Refuses to start when the 1-minute load average is above
0.5 (``--force`` overrides; the table says so).

``--chaos`` (``bench/_soak_chaos.py``): ``--minutes`` of the same mix plus
sessions while the EngineCore is SIGKILLed every 3–5 minutes, with its own
checks (hung requests, 5xx outside the kill windows, streams cut without the
error event, memory and descriptors after each recovery), on the same family page.

Usage: ``.venv/bin/python bench/soak.py [--quick | --chaos] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _soak_chaos as C  # noqa: E402
import _soak_report as R  # noqa: E402
import _soak_requests as Q  # noqa: E402
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
from _serve import free_port  # noqa: E402

RESULTS = HERE / "results"
#: the ScriptedEngine's settings unless ``--engine-arg`` gives others
SCRIPTED_ARGS = ("decode_time_per_token=0.005", "history_limit=64")
# -- the server and its samples ----------------------------------------------------------------


class SoakServer:
    """``microagent serve`` as a child process (its own process group), with the soak's tool."""

    def __init__(
        self, engine: str, port: int, log: Path, engine_args: list[str], session_ttl: float
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = [
            sys.executable,
            "-m",
            "microagent",
            "serve",
            "--engine",
            engine,
            "--port",
            str(port),
            "--tool",
            "lookup=_soak_requests:lookup",
            "--calculator",  # the compute mode's sandboxed calculator
            # every retained turn (tool calls, prompt_cache_*) ends within this: an idle
            # server holds no retention, so a retention that never ends shows as a leak
            "--session-ttl-max",
            str(session_ttl),
        ]
        for arg in engine_args:
            self.command += ["--engine-arg", arg]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        self.log = log
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",  # nothing in the working directory shadows a module
            start_new_session=True,
        )

    async def wait_healthy(self, client: Any, timeout: float = 900.0) -> float:
        """Seconds until ``/health`` answers 200 (the engine has started)."""
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/health", timeout=5)).status_code == 200:
                    return time.monotonic() - t0
            await asyncio.sleep(0.5)
        raise TimeoutError(f"server not healthy after {timeout} s; see {self.log}")

    def stop(self) -> int | None:
        """SIGTERM (a graceful drain), then the whole group is killed; the exit status."""
        code = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            code = self.proc.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # an EngineCore left behind
        self._log_file.close()
        return code


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text, summed over label sets, by family name."""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        out[name_labels.split("{", 1)[0]] += float(value)
    return dict(out)


def labelled(text: str, family: str) -> dict[str, float]:
    """The samples of one family by their label text (``{kind="x",status="200"}``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            labels, _, value = line[len(family) :].rpartition(" ")
            out[labels] = float(value)
    return out


async def sample(client: Any, pid: int, phase: str, done: int, t0: float) -> dict[str, Any]:
    """One sample of the server: its process (psutil) and its ``/metrics``."""
    import psutil

    text = (await client.get("/metrics", timeout=60)).text
    m = parse_metrics(text)
    proc = psutil.Process(pid)
    children = proc.children(recursive=True)
    return {
        "phase": phase,
        "requests": done,
        "t_s": round(time.monotonic() - t0, 1),
        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
        "engine_rss_mb": round(sum(c.memory_info().rss for c in children) / 2**20, 1),
        "processes": len(children),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": proc.num_threads(),
        "asyncio_tasks": int(m.get("microagent:asyncio_tasks", -1)),
        "engine_running": int(m.get("microagent:engine_requests_running", 0)),
        "engine_waiting": int(m.get("microagent:engine_requests_waiting", 0)),
        "engine_live": int(m.get("microagent:engine_requests_live", 0)),
        "retained_blocks": int(m.get("microagent:engine_retained_blocks", 0)),
        "retentions": int(m.get("microagent:engine_retentions", 0)),
        "requests_running": int(m.get("microagent:requests_running", 0)),
        "collaborations_running": int(m.get("microagent:collaborations_running", 0)),
        "loadavg": round(os.getloadavg()[0], 2),
    }


async def idle_sample(
    client: Any, pid: int, phase: str, done: int, t0: float, settle: float, timeout: float = 180.0
) -> tuple[dict[str, Any], float]:
    """The sample once nothing is in flight and the descriptors are steady; seconds waited."""
    start = time.monotonic()
    previous: dict[str, Any] | None = None
    while True:
        s = await sample(client, pid, phase, done, t0)
        busy = any(
            s[k]
            for k in (
                "requests_running",
                "collaborations_running",
                "engine_running",
                "engine_waiting",
                "engine_live",
                "retentions",  # every retention ends by its TTL (--session-ttl-max)
            )
        )
        if not busy and previous is not None and previous["fds"] == s["fds"]:
            break
        previous = None if busy else s
        if time.monotonic() - start > timeout:
            s["not_idle"] = True
            return s, time.monotonic() - start
        await asyncio.sleep(0.5)
    await asyncio.sleep(settle)
    s = await sample(client, pid, phase, done, t0)
    return s, round(time.monotonic() - start, 1)


def _client(url: str, concurrency: int) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    log = args.out / f"{args.stem}_server.log"
    server = SoakServer(
        args.engine, args.port or free_port(), log, args.engine_arg, args.session_ttl
    )
    samples: list[dict[str, Any]] = []
    # the sampler's own connection stays open all along: the same descriptor in every sample
    probe = httpx.AsyncClient(base_url=server.url, timeout=60.0)
    try:
        start_s = await server.wait_healthy(probe)
        print(f"server up in {start_s:.0f} s (pid {server.proc.pid})", flush=True)
        pid = server.proc.pid
        t0 = time.monotonic()
        warm = [
            Q.make_call(k, Q.WARMUP_INDEX + i, args.cancel_after)
            for i, k in enumerate(Q.schedule(args.warmup, args.seed + 1))
        ]
        async with _client(server.url, args.concurrency) as client:
            filled = await Q.fill_cache(client, args.fill_tokens)
            fill_s = time.monotonic() - t0
            print(f"KV cache filled: {filled} prompt tokens in {fill_s:.0f} s", flush=True)
            warm_tally, warm_s = await Q.drive(client, warm, args.concurrency)
        print(f"warm-up: {len(warm)} requests in {warm_s:.0f} s", flush=True)
        baseline, waited = await idle_sample(probe, pid, "baseline", 0, t0, args.settle)
        idle_waits = {"baseline": waited}
        samples.append(baseline)
        print(R.sample_line(baseline), flush=True)

        if args.chaos:  # a fixed time of traffic while the engine is killed
            async with _client(server.url, args.concurrency) as client:
                chaos = await C.run_chaos(
                    client,
                    probe,
                    pid,
                    minutes=args.minutes,
                    concurrency=args.concurrency,
                    cancel_after=args.cancel_after,
                    seed=args.seed,
                    kill_every=(args.kill_every[0] * 60, args.kill_every[1] * 60),
                    idle_sample=idle_sample,
                )
            summary = C.summarize(chaos, baseline)
            return {
                "settings": {
                    "engine": args.engine,
                    "engine_args": args.engine_arg,
                    "minutes": args.minutes,
                    "kill_every_min": list(args.kill_every),
                    "concurrency": args.concurrency,
                    "cancel_after_s": args.cancel_after,
                    "seed": args.seed,
                    "mix": Q.CHAOS_MIX,
                    "vllm": _vllm_version() if args.engine == "vllm" else None,
                },
                "server": {"command": " ".join(server.command[2:]), "start_s": round(start_s, 1)},
                "chaos": summary,
                "targets": C.chaos_targets(summary),
            }
        calls = [
            Q.make_call(k, i, args.cancel_after)
            for i, k in enumerate(Q.schedule(args.requests, args.seed))
        ]
        pending: set[asyncio.Task[None]] = set()

        async def take(done: int) -> None:
            s = await sample(probe, pid, "run", done, t0)
            samples.append(s)
            print(R.sample_line(s), flush=True)

        def on_done(tally: Q.Tally) -> None:
            if tally.done % args.every == 0:
                task = asyncio.create_task(take(tally.done))
                pending.add(task)
                task.add_done_callback(pending.discard)

        async with _client(server.url, args.concurrency) as client:
            tally, run_s = await Q.drive(client, calls, args.concurrency, on_done)
        await asyncio.gather(*pending)
        final, waited = await idle_sample(probe, pid, "final", tally.done, t0, args.settle)
        idle_waits["final"] = waited
        samples.append(final)
        print(R.sample_line(final), flush=True)
        metrics_text = (await probe.get("/metrics")).text
        served = labelled(metrics_text, "microagent:requests_total")
        collaborations = labelled(metrics_text, "microagent:collaborations_total")
    finally:
        await probe.aclose()
        exit_code = server.stop()
    statuses: Counter[str] = Counter()
    for counts in tally.by_kind.values():
        statuses.update(counts)
    return {
        "settings": {
            "engine": args.engine,
            "engine_args": args.engine_arg,
            "session_ttl": args.session_ttl,
            "requests": args.requests,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "every": args.every,
            "seed": args.seed,
            "max_tokens": Q.MAX_TOKENS,
            "long_tokens": Q.LONG_TOKENS,
            "tool_tokens": Q.TOOL_TOKENS,
            "cancel_after_s": args.cancel_after,
            "settle_s": args.settle,
            "fill_tokens": args.fill_tokens,
            "tolerance": R.TOLERANCE,
            "mix": Q.MIX,
            "vllm": _vllm_version() if args.engine == "vllm" else None,
        },
        "server": {
            "command": " ".join(server.command[2:]),
            "start_s": round(start_s, 1),
            "exit_code": exit_code,
        },
        "warmup": {
            "seconds": round(warm_s, 1),
            "statuses": _flat(warm_tally),
            "fill_tokens": filled,
            "fill_s": round(fill_s, 1),
        },
        "run_s": round(run_s, 1),
        "idle_wait_s": idle_waits,
        "samples": samples,
        "statuses": dict(sorted(statuses.items())),
        "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(tally.by_kind.items())},
        "seconds_p50": {
            k: round(statistics.median(v), 3) for k, v in sorted(tally.seconds.items())
        },
        "unexpected": tally.unexpected,
        "server_requests": served,
        "server_collaborations": collaborations,
    }


def _flat(tally: Q.Tally) -> dict[str, int]:
    out: Counter[str] = Counter()
    for counts in tally.by_kind.values():
        out.update(counts)
    return dict(sorted(out.items()))


def _vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "?"))
    except ImportError:
        return "?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 requests after 100 of warm-up")
    parser.add_argument("--requests", type=int, default=None, help="measured requests (2000)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up requests (200)")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="clients at once (6; 8 with --chaos)"
    )
    parser.add_argument("--every", type=int, default=None, help="requests per sample (50)")
    parser.add_argument("--engine", choices=("vllm", "scripted"), default="vllm")
    parser.add_argument(
        "--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="to the server"
    )
    parser.add_argument(
        "--cancel-after",
        type=float,
        default=None,
        help="client timeout of the cancels (s; default 0.5, 0.1 on the ScriptedEngine)",
    )
    parser.add_argument(
        "--fill-tokens",
        type=int,
        default=None,
        help="prompt tokens of long prompts of many lengths prefilled first (default 60 000, "
        "more than the 1 GiB KV cache of the default model holds; 0 on the ScriptedEngine)",
    )
    parser.add_argument("--settle", type=float, default=3.0, help="idle pause before a sample")
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=3.0,
        help="the server's --session-ttl-max: idle waits until every retention ended",
    )
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="--minutes of traffic while the EngineCore is SIGKILLed every --kill-every minutes",
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="the chaos run's length")
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(3.0, 5.0), metavar=("MIN", "MAX"),
        help="minutes between engine kills, drawn uniformly (3 5)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args(argv)
    args.requests = args.requests or (150 if args.quick else 2000)
    args.warmup = args.warmup if args.warmup is not None else (100 if args.quick else 200)
    args.every = args.every or (10 if args.quick else 50)
    args.concurrency = args.concurrency or (8 if args.chaos else 6)
    args.stem = "soak_chaos" if args.chaos else ("soak_quick" if args.quick else "soak")
    scripted = args.engine == "scripted"
    if args.fill_tokens is None:
        args.fill_tokens = 0 if scripted else 60_000
    if args.cancel_after is None:
        args.cancel_after = 0.1 if scripted else 0.5
    if scripted:  # tokens take time (so cancels cut work); the double's request log is bounded
        given = {arg.split("=", 1)[0] for arg in args.engine_arg}
        args.engine_arg += [a for a in SCRIPTED_ARGS if a.split("=", 1)[0] not in given]
    return args


def run(args: argparse.Namespace, load: float, forced: bool) -> dict[str, Any]:
    """Run the soak and write its JSON, tables and plot under ``args.out``."""
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    data = asyncio.run(main_async(args))
    data["machine"] = machine(load, forced, started)
    (args.out / f"{args.stem}.json").write_text(json.dumps(data, indent=1))
    if args.chaos:
        tables = C.chaos_tables(data)
        (args.out / f"{args.stem}_tables.md").write_text(tables)
        print(tables)
        return data
    tables = R.tables(data)
    (args.out / f"{args.stem}_tables.md").write_text(tables)
    R.plot(data, args.out / f"{args.stem}.png")
    print(tables)
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = quiet_load(args.force, 0.5)
    if load is None:
        return 2
    data = run(args, load, bool(args.force and load > 0.5))
    if args.update and args.stem in ("soak", "soak_chaos"):
        publish(HERE.parent, family_report(args.out))
    if args.chaos:
        return 0 if all(t["met"] for t in data["targets"]) else 1
    return 0 if R.passed(data) else 1


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The soak page and headline, from ``soak.json`` and ``soak_chaos.json`` in ``results``."""
    data = json.loads((results / "soak.json").read_text())
    rows = R.checks(data)
    back = sum(row["ok"] for row in rows)
    worst = max(rows, key=lambda row: abs(row["change"]))
    plot = f"![soak curves]({RESULTS_LINK}/soak.png)\n"
    parts = [("Soak", R.tables(data) + "\n" + plot + "\n" + data_line("soak.json"))]
    chaos = results / "soak_chaos.json"
    summary = (
        f"{data['settings']['requests']} mixed requests (every mode, streams cut, clients "
        f"giving up, bad inputs) against one server: {back}/{len(rows)} measures back at "
        f"their starting level, {R.five_xx(data)} 5xx."
    )
    if chaos.exists():
        wild = json.loads(chaos.read_text())
        met = sum(t["met"] for t in wild["targets"])
        parts.append(
            ("Chaos soak (`--chaos`)", C.chaos_tables(wild) + "\n" + data_line("soak_chaos.json"))
        )
        summary += (
            f" With the EngineCore SIGKILLed every 3-5 minutes (`--chaos`): {met}/"
            f"{len(wild['targets'])} targets met."
        )
    return FamilyReport(
        family="soak",
        title="Soak",
        headline=Headline(
            figure=f"measures back at their starting level after {data['settings']['requests']}"
            " requests",
            value=f"{back}/{len(rows)} (worst {worst['label']}: {worst['change']:+.1%})",
            baseline="the server's own level after the warm-up",
            target=f"all within ±5 %, no 5xx: {'met' if R.passed(data) else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=summary,
        page=page("Soak (`bench/soak.py`)", __doc__, parts),
    )


if __name__ == "__main__":
    sys.exit(main())
