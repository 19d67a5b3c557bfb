"""Actor runtime micro-benchmark: tell throughput and ask round-trip latency.

Measures, in one run:

* microagent actors on anyio's asyncio, asyncio+uvloop and trio backends;
* the raw anyio memory object stream on the same backends (the floor: a
  bounded queue with nothing on top);
* autogen-core's ``SingleThreadedAgentRuntime`` doing the same work
  (``publish_message`` for fire-and-forget, ``send_message`` for
  request/reply). autogen-core conflicts with vLLM's protobuf pin, so it runs
  from its own virtual environment (``bench/.venv-autogen``, created on first
  use) as a subprocess that prints JSON.

Usage: ``python bench/actors.py [--tells N] [--asks N] [--no-autogen]``.
Prints a table and writes ``bench/results/actors.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import venv
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
AUTOGEN_VENV = HERE / ".venv-autogen"
AUTOGEN_VERSION = "0.7.5"
RESULTS = HERE / "results" / "actors.json"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50_us": at(0.50) * 1e6,
        "p99_us": at(0.99) * 1e6,
        "mean_us": statistics.fmean(ordered) * 1e6,
    }


# -- microagent and the raw stream (in this interpreter) ------------------------------------


async def raw_stream(tells: int, asks: int) -> dict[str, Any]:
    import anyio

    send, receive = anyio.create_memory_object_stream[int](1024)
    done = anyio.Event()

    async def consume() -> None:
        count = 0
        async for _ in receive:
            count += 1
            if count == tells:
                done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        start = time.perf_counter()
        for i in range(tells):
            await send.send(i)
        await done.wait()
        elapsed = time.perf_counter() - start
        send.close()

    req_send, req_recv = anyio.create_memory_object_stream[int](1)
    rep_send, rep_recv = anyio.create_memory_object_stream[int](1)

    async def serve() -> None:
        async for item in req_recv:
            await rep_send.send(item)

    latencies: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        for i in range(asks):
            t0 = time.perf_counter()
            await req_send.send(i)
            await rep_recv.receive()
            latencies.append(time.perf_counter() - t0)
        req_send.close()
    return {"tell_msgs_per_s": tells / elapsed, **percentiles(latencies)}


async def microagent_actors(tells: int, asks: int) -> dict[str, Any]:
    from microagent.actors import Actor, Runtime

    class Sink(Actor):
        def __init__(self) -> None:
            self.count = 0

        async def receive(self, message: Any) -> Any:
            self.count += 1
            return message

    async with Runtime() as rt:
        ref = rt.spawn(Sink)
        await ref.ask(-1)  # started
        start = time.perf_counter()
        for i in range(tells):
            await ref.tell(i)
        await ref.ask(-1)  # FIFO: every tell before it was handled
        elapsed = time.perf_counter() - start
        latencies: list[float] = []
        for i in range(asks):
            t0 = time.perf_counter()
            await ref.ask(i)
            latencies.append(time.perf_counter() - t0)
    return {"tell_msgs_per_s": tells / elapsed, **percentiles(latencies)}


def run_anyio(
    fn: Callable[[int, int], Awaitable[dict[str, Any]]], backend: str, tells: int, asks: int
) -> dict[str, Any]:
    import anyio

    if backend == "uvloop":
        return anyio.run(fn, tells, asks, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(fn, tells, asks, backend=backend)


# -- autogen-core (in its own venv) ------------------------------------------------------------


async def autogen_worker(tells: int, asks: int) -> dict[str, Any]:
    from dataclasses import dataclass

    from autogen_core import (
        AgentId,
        MessageContext,
        RoutedAgent,
        SingleThreadedAgentRuntime,
        TopicId,
        TypeSubscription,
        message_handler,
    )

    @dataclass
    class Msg:
        n: int

    async def on_msg(self: Any, message: Msg, ctx: MessageContext) -> int:
        self.count += 1
        return message.n

    # autogen reads the handler's type hints; this module's annotations are strings
    on_msg.__annotations__ = {"message": Msg, "ctx": MessageContext, "return": int}

    class Sink(RoutedAgent):
        def __init__(self) -> None:
            super().__init__("sink")
            self.count = 0

        handle = message_handler(on_msg)

    async def fresh() -> SingleThreadedAgentRuntime:
        runtime = SingleThreadedAgentRuntime()
        await Sink.register(runtime, "sink", Sink)
        await runtime.add_subscription(TypeSubscription("bench", "sink"))
        runtime.start()
        return runtime

    target = AgentId("sink", "default")
    # fire-and-forget: publish_message, then wait until every message was handled
    runtime = await fresh()
    await runtime.send_message(Msg(-1), target)
    start = time.perf_counter()
    for i in range(tells):
        await runtime.publish_message(Msg(i), TopicId("bench", "default"))
    await runtime.stop_when_idle()
    publish_elapsed = time.perf_counter() - start
    # request/reply: send_message, sequential (its round trip), and its throughput
    runtime = await fresh()
    await runtime.send_message(Msg(-1), target)
    latencies: list[float] = []
    for i in range(asks):
        t0 = time.perf_counter()
        await runtime.send_message(Msg(i), target)
        latencies.append(time.perf_counter() - t0)
    start = time.perf_counter()
    for i in range(tells // 4):
        await runtime.send_message(Msg(i), target)
    send_elapsed = time.perf_counter() - start
    await runtime.stop_when_idle()
    return {
        "tell_msgs_per_s": tells / publish_elapsed,
        "send_message_msgs_per_s": (tells // 4) / send_elapsed,
        **percentiles(latencies),
    }


def ensure_autogen_venv() -> Path:
    python = AUTOGEN_VENV / "bin" / "python"
    if python.exists():
        check = subprocess.run(
            [str(python), "-c", "import autogen_core; print(autogen_core.__version__)"],
            capture_output=True,
            text=True,
        )
        if check.returncode == 0 and check.stdout.strip() == AUTOGEN_VERSION:
            return python
    print(f"creating {AUTOGEN_VENV} with autogen-core=={AUTOGEN_VERSION} ...", flush=True)
    venv.create(AUTOGEN_VENV, with_pip=True, clear=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"autogen-core=={AUTOGEN_VERSION}"],
        check=True,
    )
    return python


def run_autogen(tells: int, asks: int) -> dict[str, Any]:
    python = ensure_autogen_venv()
    out = subprocess.run(
        [
            str(python),
            str(Path(__file__).resolve()),
            "--autogen-worker",
            "--tells",
            str(tells),
            "--asks",
            str(asks),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- report -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tells", type=int, default=50_000)
    parser.add_argument("--asks", type=int, default=5_000)
    parser.add_argument("--no-autogen", action="store_true")
    parser.add_argument("--autogen-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.autogen_worker:
        print(json.dumps(asyncio.run(autogen_worker(args.tells, args.asks))))
        return

    rows: dict[str, dict[str, Any]] = {}
    for backend in ("asyncio", "uvloop", "trio"):
        rows[f"raw stream / {backend}"] = run_anyio(raw_stream, backend, args.tells, args.asks)
        rows[f"microagent / {backend}"] = run_anyio(
            microagent_actors, backend, args.tells, args.asks
        )
    if not args.no_autogen:
        rows[f"autogen-core {AUTOGEN_VERSION} / asyncio"] = run_autogen(args.tells, args.asks)

    print(f"\n{'system / backend':34} {'tell msgs/s':>12} {'ask p50 us':>11} {'ask p99 us':>11}")
    for name, r in rows.items():
        print(f"{name:34} {r['tell_msgs_per_s']:12,.0f} {r['p50_us']:11.1f} {r['p99_us']:11.1f}")
    ratios: dict[str, dict[str, float]] = {}
    autogen = rows.get(f"autogen-core {AUTOGEN_VERSION} / asyncio")
    for backend in ("asyncio", "uvloop", "trio"):
        ours, raw = rows[f"microagent / {backend}"], rows[f"raw stream / {backend}"]
        r = {
            "raw_over_ours_tell": raw["tell_msgs_per_s"] / ours["tell_msgs_per_s"],
            "ours_over_raw_ask_p50": ours["p50_us"] / raw["p50_us"],
        }
        if autogen is not None:
            r["ours_over_autogen_tell"] = ours["tell_msgs_per_s"] / autogen["tell_msgs_per_s"]
            r["ours_over_autogen_send_message"] = (
                ours["tell_msgs_per_s"] / autogen["send_message_msgs_per_s"]
            )
            r["ours_over_autogen_ask_p50"] = ours["p50_us"] / autogen["p50_us"]
        ratios[backend] = r
    print("\nratios (targets: >= 10x autogen throughput, <= 0.25 of its p50, within 3x of raw):")
    for backend, r in ratios.items():
        print(f"  {backend:8} " + "  ".join(f"{k}={v:.2f}" for k, v in r.items()))
    if autogen is not None:
        print(
            f"  (autogen send_message throughput: {autogen['send_message_msgs_per_s']:,.0f} msgs/s)"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "tells": args.tells,
                "asks": args.asks,
                "python": sys.version.split()[0],
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "rows": rows,
                "ratios": ratios,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {RESULTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
