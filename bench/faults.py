"""Latency envelopes under faults: abort, engine death, restart, on one in-process vLLM engine.

Three figures the tests only bound generously (``< 1 s``), measured here over
many trials (p50 / p95 / max):

* **abort → scheduler running 0**: a generation is aborted after a few tokens
  (``bridge.abort``); the time until the EngineCore's scheduler reports no
  running request (read from the bridge's stat logger, polled every 2 ms);
* **death → typed error**: the EngineCore is SIGKILLed mid-generation; the time
  until the consumer gets ``EngineDied``;
* **restart → first success**: from the same kill, the time until a new request
  succeeds on the restarted engine (the engine start is most of it).

Writes ``bench/results/faults[_quick].json`` and a Markdown table; ``--update``
rewrites its family page and headline row (``bench/report.py``). Refuses to start when the
1-minute load average is 1 or more (``--force`` to override; the table says so).

Usage: ``.venv/bin/python bench/faults.py [--quick] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _faults_report as R  # noqa: E402
from _sections import (  # noqa: E402
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

RESULTS = HERE / "results"
MAX_TOKENS = 400
ABORT_AFTER = 4
KILL_AFTER = 4


def _prompt(bridge: Any) -> Any:
    text = f"Write a very long story about a lighthouse ({uuid.uuid4().hex[:8]})."
    return bridge.chat.prompt([{"role": "user", "content": text}])


async def abort_trial(bridge: Any) -> float | None:
    """Milliseconds from ``abort`` to a scheduler with nothing running (None: it ended first)."""
    from microagent.engine_bridge import Sampling

    async with bridge.stream(
        _prompt(bridge), Sampling(max_tokens=MAX_TOKENS, temperature=0.8)
    ) as g:
        n = 0
        async for _ in g:
            n += 1
            if n == ABORT_AFTER:
                break
        else:
            return None
        t0 = time.perf_counter()
        await bridge.abort(g.request_id)
    while bridge.stats().scheduler_running:  # noqa: ASYNC110 (stat logger: no event)
        await asyncio.sleep(0.002)
    return (time.perf_counter() - t0) * 1000


async def kill_trial(bridge: Any) -> tuple[float, float] | None:
    """(ms from SIGKILL to ``EngineDied``, s from SIGKILL to the first success after it)."""
    from microagent.engine_bridge import EngineDied, Sampling

    pids = bridge.engine_core_pids()
    killed = 0.0
    try:
        async with bridge.stream(
            _prompt(bridge), Sampling(max_tokens=MAX_TOKENS, temperature=0.8)
        ) as g:
            n = 0
            async for _ in g:
                n += 1
                if n == KILL_AFTER:
                    killed = time.perf_counter()
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
        return None  # finished before the kill took: not a trial
    except EngineDied:
        died = time.perf_counter()
    result = await bridge.generate(_prompt(bridge), Sampling(max_tokens=2))
    ok = time.perf_counter()
    assert result.finish_reason in ("stop", "length"), result.finish_reason
    return (died - killed) * 1000, ok - killed


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import vllm
    from microagent.engine_bridge import VLLMBridge

    trials: dict[str, list[float]] = {key: [] for key in R.ENVELOPES}
    async with VLLMBridge("default", progress=False, max_restarts=5) as bridge:
        while len(trials["abort_to_idle_ms"]) < args.aborts:
            ms = await abort_trial(bridge)
            if ms is not None:
                trials["abort_to_idle_ms"].append(round(ms, 2))
        while len(trials["death_to_error_ms"]) < args.kills:
            got = await kill_trial(bridge)
            if got is not None:
                trials["death_to_error_ms"].append(round(got[0], 2))
                trials["restart_to_success_s"].append(round(got[1], 3))
                print(f"kill {len(trials['death_to_error_ms'])}: {got[0]:.0f} ms, {got[1]:.1f} s")
        model = bridge.model
    return {
        "settings": {
            "model": model,
            "vllm": getattr(vllm, "__version__", "?"),
            "max_tokens": MAX_TOKENS,
            "abort_after_tokens": ABORT_AFTER,
            "kill_after_tokens": KILL_AFTER,
        },
        "trials": trials,
    }


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The faults page and headline, from ``faults.json`` in ``results``."""
    data = json.loads((results / "faults.json").read_text())
    rows = R.summarize(data)
    death, abort = rows["death_to_error_ms"], rows["abort_to_idle_ms"]
    return FamilyReport(
        family="faults",
        title="Latency envelopes under faults",
        headline=Headline(
            figure="EngineCore killed → `EngineDied` in the consumer, p95",
            value=f"{death['p95']:.0f} ms",
            baseline="the tests' bound: 1 000 ms",
            target=f"< 1 000 ms: {'met' if death['p95'] < 1000 else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"Over {abort['n']:.0f} aborts and {death['n']:.0f} EngineCore kills: an abort "
            f"empties the scheduler in {abort['p95']:.0f} ms (p95), a killed engine reaches "
            f"the consumer as `EngineDied` in {death['p95']:.0f} ms (p95)."
        ),
        page=page(
            "Latency envelopes under faults (`bench/faults.py`)",
            __doc__,
            [("Results", R.table(data) + "\n" + data_line("faults.json"))],
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 aborts, 3 kills")
    parser.add_argument("--aborts", type=int, default=None, help="abort trials (default 40)")
    parser.add_argument("--kills", type=int, default=None, help="kill trials (default 20)")
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args()
    args.aborts = args.aborts or (5 if args.quick else 40)
    args.kills = args.kills or (3 if args.quick else 20)
    load = quiet_load(args.force, 1.0)
    if load is None:
        return 2
    started = time.time()
    data = asyncio.run(main_async(args))
    data["machine"] = machine(load, bool(args.force and load >= 1.0), started)
    RESULTS.mkdir(exist_ok=True)
    stem = "faults_quick" if args.quick else "faults"
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2))
    table = R.table(data)
    (RESULTS / f"{stem}_tables.md").write_text(table)
    print(table)
    if args.update and not args.quick:
        publish(HERE.parent, family_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
