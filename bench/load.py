"""Collaborations under load: microagent against client code on vLLM's own server.

Open-loop Poisson arrivals of a workload mix (vote-5 reason-then-answer,
debate 3×2, aggregate 3+1), each collaboration on its own ~1 500-token
context, on engines whose KV cache is sized so that the live working set is
larger than the cache. Systems on identical engine settings (scheduler
limits, KV blocks, model, dtype), each on its own engine, interleaved and
paired (the same arrival times and contexts):

* ``microagent``: one in-process vLLM engine, KV retention on (half the
  cache) and collaboration scheduling (``ServicePolicy()``);
* ``client``: the same prompts as OpenAI-SDK client code, one HTTP call per
  role (``bench/_collab_client.py``), against ``vllm serve`` with prefix
  caching on and vLLM's own scheduling;
* ``microagent-http``: ``microagent serve``, one OpenAI-SDK call per
  collaboration (HTTP in, everything in-engine);
* ``langgraph``: the same graphs built with the real ``langgraph`` package
  (``bench/_collab_peer.py`` in ``bench/.venv-peers``, created on first use),
  each role one OpenAI-SDK call, against its own ``vllm serve``;
* ablations on request: ``ablation`` (in-process, vLLM's LRU cache and the
  modes' critical-path priorities only), ``in-engine-fcfs`` (in-process,
  vLLM's LRU cache and first-come-first-served requests: no priorities),
  ``retention-only``, ``scheduling-only``.

Per system and rate: collaborations/min, p50/p95/p99 latency, prompt tokens
computed and tokens recomputed after eviction (both scored from the recorded
token ids and cached counts by one function, ``_load_accounting``, for every
system), preemptions, retained-hit tokens. Writes
``bench/results/load[_quick].json``, a Markdown table with the targets of
issue 12 and a latency-vs-throughput PNG; ``--update`` rewrites its family
page and headline row (``bench/report.py``).

Refuses to start when the 1-minute load average is above 0.5 (``--force``
to override; then the table says so).

Usage: ``.venv/bin/python bench/load.py [--quick] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _collab_client as C  # noqa: E402
import _load_report as R  # noqa: E402
from _load_accounting import RequestRecord, prefill  # noqa: E402
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

RESULTS = HERE / "results"
WORDS = [
    "river", "mountain", "lantern", "harbor", "copper", "meadow", "orbit", "signal", "cedar",
    "quartz", "falcon", "ember", "glacier", "prairie", "beacon", "willow", "canyon", "marble",
    "thistle", "comet",
]  # fmt: skip
MIX = ("vote5-reason", "debate3x2", "aggregate3+1")
CHOICES = ["yes", "no"]
#: The workloads, in ``bench/collab.py``'s form (``_collab_client.run_workload`` reads them).
WORKLOADS: dict[str, dict[str, Any]] = {
    "vote5-reason": {"kind": "vote", "n": 5, "style": "reason"},
    "debate3x2": {"kind": "debate", "agents": 3, "rounds": 2},
    "aggregate3+1": {"kind": "aggregate", "proposers": 3},
}
COMMON = {"max_tokens": 40, "answer_tokens": 4, "temperature": 0.7}
ENGINE = {"max_num_seqs": 8, "max_model_len": 4096, "max_num_batched_tokens": 2048}
IN_PROCESS = ("microagent", "ablation", "retention-only", "scheduling-only", "in-engine-fcfs")
SYSTEMS = (*IN_PROCESS, "microagent-http", "client", "langgraph")


def context_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return (
        f"Incident report {seed}. {body}.\n\n"
        "Question: is the incident above resolved, yes or no? Explain briefly."
    )


def arrivals(rate_per_s: float, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


async def one(bridge: Any, kind: str, context: str, policy: Any) -> None:
    """One collaboration in-process, as ``bench/collab.py`` runs it, with ``policy``."""
    from microagent.collab import AgentSpec, collaborate

    wl = {**WORKLOADS[kind], **COMMON}
    messages: Any = C.P.context(context)  # the same messages the client code sends first
    common: dict[str, Any] = {
        "max_tokens": wl["max_tokens"],
        "temperature": wl["temperature"],
        "scheduling": policy,
    }
    if wl["kind"] == "vote":
        specs = [AgentSpec("voter", count=wl["n"])]
        extra: dict[str, Any] = {
            "answer": {"choices": CHOICES},
            "style": wl["style"],
            "answer_tokens": wl["answer_tokens"],
            "early_stop": False,  # the client cannot stop a voter: compare like with like
        }
        await collaborate(bridge, "vote", messages, specs, **extra, **common)
    elif wl["kind"] == "debate":
        specs = [AgentSpec("debater", count=wl["agents"])]
        extra = {"rounds": wl["rounds"], "early_stop": False, "answer": {"choices": CHOICES}}
        await collaborate(bridge, "debate", messages, specs, **extra, **common)
    else:
        specs = [
            AgentSpec("proposer", count=wl["proposers"]),
            AgentSpec("aggregator", role="aggregator"),
        ]
        await collaborate(bridge, "aggregate", messages, specs, **common)


async def one_client(caller: C.RecordingCaller, kind: str, context: str) -> None:
    """One collaboration as client code: every role its own HTTP call."""
    await C.run_workload(caller, {**WORKLOADS[kind], **COMMON}, context, CHOICES)


def bridge_records(bridge: Any, since: int) -> list[RequestRecord]:
    """The in-process engine requests started since ``since``, as ``RequestRecord``s."""
    out = []
    for gen in bridge.generations[since:]:
        result = gen.result
        if result is None:
            continue
        out.append(
            RequestRecord(
                submitted=result.timings.submitted,
                finished=result.timings.finished,
                prompt=tuple(result.prompt.token_ids),
                output=tuple(result.output_ids),
                cached=result.cached_tokens,
            )
        )
    return out


class InProcess:
    """A system on one in-process engine (``microagent`` and its ablations)."""

    def __init__(
        self, name: str, retention: float, policy: Any, blocks: int, fcfs: bool = False
    ) -> None:
        from _collab_engines import RecordingBridge

        self.name = name
        self.policy = policy
        self.bridge = RecordingBridge(
            **ENGINE, engine_args={"num_gpu_blocks_override": blocks}, retention=retention,
            scheduling_policy="fcfs" if fcfs else "priority", progress=False,
        )  # fmt: skip

    async def open(self) -> None:
        await self.bridge.open()

    async def close(self) -> None:
        await self.bridge.close()

    async def collaboration(self, kind: str, context: str) -> None:
        await one(self.bridge, kind, context, self.policy)

    async def mark(self) -> dict[str, Any]:
        return {"stats": self.bridge.stats(), "since": len(self.bridge.generations)}

    async def measure(self, mark: dict[str, Any]) -> dict[str, Any]:
        after = self.bridge.stats()
        retention = await self.bridge.retention_stats()
        return {
            "records": bridge_records(self.bridge, mark["since"]),
            "preemptions": after.preemptions - mark["stats"].preemptions,
            "retained_hit_tokens": after.retained_hit_tokens - mark["stats"].retained_hit_tokens,
            "released": dict(retention.released),
        }


class Client:
    """Client code (openai SDK) against ``vllm serve`` with prefix caching, same settings."""

    name = "client"

    def __init__(self, blocks: int, port: int) -> None:
        self.blocks, self.port = blocks, port
        self.server: Any = None
        self.caller: C.RecordingCaller | None = None

    async def open(self) -> None:
        import microagent
        from _collab_engines import SERVED_NAME, Server
        from openai import AsyncOpenAI

        self.server = Server(
            microagent.resolve_model("default"),
            self.port,
            prefix_caching=True,
            log=RESULTS / f"load-{self.name}.log.tmp",
            extra_args=[
                "--max-num-seqs", str(ENGINE["max_num_seqs"]),
                "--max-model-len", str(ENGINE["max_model_len"]),
                "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
                "--num-gpu-blocks-override", str(self.blocks),
                "--enable-prompt-tokens-details",
            ],
        )  # fmt: skip
        await asyncio.to_thread(self.server.wait_healthy)
        # the SDK's default retries: a keep-alive connection the server closed is retried
        client = AsyncOpenAI(base_url=self.server.base_url, api_key="unused", max_retries=2)
        self.caller = C.RecordingCaller(client, SERVED_NAME)

    async def close(self) -> None:
        if self.caller is not None:
            await self.caller.client.close()
        if self.server is not None:
            self.server.stop()

    async def collaboration(self, kind: str, context: str) -> None:
        assert self.caller is not None
        await one_client(self.caller, kind, context)

    async def mark(self) -> dict[str, Any]:
        assert self.caller is not None and self.server is not None
        metrics = await asyncio.to_thread(self.server.metrics)
        return {"since": len(self.caller.records), "preemptions": _preemptions(metrics)}

    async def measure(self, mark: dict[str, Any]) -> dict[str, Any]:
        assert self.caller is not None and self.server is not None
        metrics = await asyncio.to_thread(self.server.metrics)
        return {
            "records": self.caller.records[mark["since"] :],
            "preemptions": _preemptions(metrics) - mark["preemptions"],
            "retained_hit_tokens": 0,
            "released": {},
        }


class LangGraph(Client):
    """The same collaborations as graphs of the real ``langgraph`` package (its own venv,
    ``bench/.venv-peers``), each role one OpenAI-SDK call, against its own ``vllm serve``."""

    name = "langgraph"

    async def open(self) -> None:
        import collab as B  # ensure_peers_venv: one place creates the peers' venv

        self.version = await asyncio.to_thread(B.ensure_peers_venv)
        await super().open()

    async def run_schedule(self, schedule: list[tuple[float, str, str]]) -> dict[str, Any]:
        """Run the whole schedule in the peer process (one event loop, like the client)."""
        from _collab_engines import SERVED_NAME

        assert self.server is not None
        job = {
            "mode": "load",
            "system": C.P.SYSTEM,
            "base_url": self.server.base_url,
            "model": SERVED_NAME,
            "choices": CHOICES,
            "schedule": [(at, {**WORKLOADS[kind], **COMMON}, ctx) for at, kind, ctx in schedule],
        }
        peer = HERE / ".venv-peers" / "bin" / "python"
        proc = await asyncio.create_subprocess_exec(
            str(peer), str(HERE / "_collab_peer.py"), "-", cwd=str(HERE),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(json.dumps(job).encode())
        if proc.returncode != 0:
            raise RuntimeError(f"langgraph peer failed: {err.decode()[-2000:]}")
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        for failure in result["failures"]:
            print(f"  failed: {failure}", flush=True)
        assert self.caller is not None  # the peer's requests join the client's records
        self.caller.records += [
            RequestRecord(at, done, tuple(prompt), tuple(output), cached)
            for at, done, prompt, output, cached in result["records"]
        ]
        return result


#: The server's own counters the ``microagent-http`` system reads (``/metrics``).
HTTP_METRICS = (
    "microagent:prompt_tokens_total",
    "microagent:cached_tokens_total",
    "microagent:engine_recomputed_tokens_total",
    "microagent:engine_retained_hit_tokens_total",
)


def http_body(kind: str) -> dict[str, Any]:
    """The ``agents`` + ``collaboration`` fields of one workload over microagent's HTTP API."""
    wl = WORKLOADS[kind]
    if wl["kind"] == "vote":
        agents: list[dict[str, Any]] = [{"name": "voter", "count": wl["n"]}]
        collaboration: dict[str, Any] = {
            "mode": "vote",
            "answer": {"choices": CHOICES},
            "style": wl["style"],
            "answer_tokens": COMMON["answer_tokens"],
            "early_stop": False,
        }
    elif wl["kind"] == "debate":
        agents = [{"name": "debater", "count": wl["agents"]}]
        collaboration = {
            "mode": "debate",
            "rounds": wl["rounds"],
            "early_stop": False,
            "answer": {"choices": CHOICES},
        }
    else:
        agents = [
            {"name": "proposer", "count": wl["proposers"]},
            {"name": "aggregator", "role": "aggregator"},
        ]
        collaboration = {"mode": "aggregate"}
    return {"agents": agents, "collaboration": collaboration}


class Http:
    """``microagent serve`` (everything in-engine, HTTP in): one OpenAI-SDK call per
    collaboration. Its engine requests are not visible from outside, so computed and
    recomputed tokens are the server's own counters (``/metrics``), not the shared scoring."""

    name = "microagent-http"

    def __init__(self, blocks: int, port: int) -> None:
        self.blocks, self.port = blocks, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Any = None

    async def open(self) -> None:
        from openai import AsyncOpenAI

        command = [
            sys.executable, "-m", "microagent", "serve", "--port", str(self.port),
            "--max-num-seqs", str(ENGINE["max_num_seqs"]),
            "--max-model-len", str(ENGINE["max_model_len"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--engine-arg", f"num_gpu_blocks_override={self.blocks}",
        ]  # fmt: skip
        from microagent.testing import wait_healthy

        log = RESULTS / "load-microagent.log.tmp"
        self.proc = await asyncio.to_thread(_start, command, log)
        url = f"http://127.0.0.1:{self.port}"
        await asyncio.to_thread(wait_healthy, url, self.proc, "microagent serve", log)
        self.client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def collaboration(self, kind: str, context: str) -> None:
        await self.client.chat.completions.create(
            model="default",
            messages=C.P.context(context),
            max_tokens=COMMON["max_tokens"],
            temperature=COMMON["temperature"],
            extra_body=http_body(kind),
        )

    async def _metrics(self) -> dict[str, float]:
        from microagent.testing import fetch_metrics

        return await asyncio.to_thread(fetch_metrics, f"http://127.0.0.1:{self.port}", HTTP_METRICS)

    async def mark(self) -> dict[str, Any]:
        return {"metrics": await self._metrics()}

    async def measure(self, mark: dict[str, Any]) -> dict[str, Any]:
        after, before = await self._metrics(), mark["metrics"]

        def delta(name: str) -> int:
            return int(after[name] - before[name])

        prompt = delta("microagent:prompt_tokens_total")
        return {
            "records": [],
            "prompt_tokens": prompt,
            "computed_tokens": prompt - delta("microagent:cached_tokens_total"),
            "reusable_tokens": None,
            "recomputed_tokens": delta("microagent:engine_recomputed_tokens_total"),
            "retained_hit_tokens": delta("microagent:engine_retained_hit_tokens_total"),
            "preemptions": None,
            "released": {},
        }


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A child in its own process group, its output in ``log`` (the child keeps the file)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd="/", start_new_session=True
        )


def _preemptions(metrics: dict[str, float]) -> int:
    return int(metrics["vllm:num_preemptions_total"])


async def run_config(system: Any, schedule: list[tuple[float, str, str]]) -> dict[str, Any]:
    """Launch ``schedule`` (arrival offset, workload, context) open-loop on ``system``."""
    mark = await system.mark()
    if hasattr(system, "run_schedule"):  # a peer process runs the whole schedule itself
        done = await system.run_schedule(schedule)
        return await _result(system, mark, done["latencies"], len(done["failures"]), done["wall"])
    latencies: list[float] = []
    failures = 0
    t0 = time.monotonic()

    async def launch(at: float, kind: str, context: str) -> None:
        nonlocal failures
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        start = time.monotonic()
        try:
            await system.collaboration(kind, context)
            latencies.append(time.monotonic() - start)
        except Exception as exc:  # counted and reported, never hidden
            failures += 1
            print(f"  failed: {type(exc).__name__}: {exc}", flush=True)

    await asyncio.gather(*(launch(*item) for item in schedule))
    return await _result(system, mark, latencies, failures, time.monotonic() - t0)


async def _result(
    system: Any, mark: dict[str, Any], latencies: list[float], failures: int, wall: float
) -> dict[str, Any]:
    """One run's measures: latencies, throughput, and the prefill scored from its records."""
    measured = await system.measure(mark)
    scored = prefill(measured.pop("records"))
    own = {k: measured.pop(k) for k in list(measured) if k.endswith("_tokens")}
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [0.0] * 99
    return {
        "completed": len(latencies),
        "failed": failures,
        "wall_s": wall,
        "per_min": 60.0 * len(latencies) / wall if wall else 0.0,
        "p50_s": statistics.median(latencies) if latencies else 0.0,
        "p95_s": q[94],
        "p99_s": q[98],
        "prompt_tokens": scored.prompt_tokens,
        "computed_tokens": scored.computed_tokens,
        "reusable_tokens": scored.reusable_tokens,
        "recomputed_tokens": scored.recomputed_tokens,
        **measured,
        **own,  # a system that cannot be scored from token ids reports its own counters
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from microagent.collab import ServicePolicy

    variants = {
        "microagent": (0.5, ServicePolicy()),
        "ablation": (0.0, ServicePolicy(enabled=False)),
        "retention-only": (0.5, ServicePolicy(enabled=False)),
        "scheduling-only": (0.0, ServicePolicy()),
        "in-engine-fcfs": (0.0, ServicePolicy(enabled=False)),
    }
    systems: dict[str, Any] = {}
    for name in args.systems:
        if name == "client":
            systems[name] = Client(args.blocks, args.port)
        elif name == "microagent-http":
            systems[name] = Http(args.blocks, args.port + 1)
        elif name == "langgraph":
            systems[name] = LangGraph(args.blocks, args.port + 2)
        else:
            retention, policy = variants[name]
            fcfs = name == "in-engine-fcfs"  # vLLM's own order: no priorities at all
            systems[name] = InProcess(name, retention, policy, args.blocks, fcfs)
    runs: list[dict[str, Any]] = []
    try:
        for name, system in systems.items():
            t = time.monotonic()
            await system.open()
            print(f"{name}: engine started in {time.monotonic() - t:.0f} s", flush=True)
        for rep in range(args.reps):
            for rate in args.rates:
                seed = 1000 * rep + int(rate * 100)
                times = arrivals(rate / 60.0, args.count, seed)
                kinds = [MIX[i % len(MIX)] for i in range(args.count)]
                schedule = [
                    (at, kind, context_text(seed * 100 + i, args.words))
                    for i, (at, kind) in enumerate(zip(times, kinds, strict=True))
                ]
                names = list(systems)
                order = names[rep % len(names) :] + names[: rep % len(names)]  # rotated
                for name in order:  # each system its own engine: the same arrivals and contexts
                    load = os.getloadavg()[0]
                    result = await run_config(systems[name], schedule)
                    result.update(system=name, rate_per_min=rate, rep=rep, loadavg_before=load)
                    runs.append(result)
                    print(
                        f"rep {rep} rate {rate}/min {name}: {result['completed']} done, "
                        f"p50 {result['p50_s']:.1f} s, p95 {result['p95_s']:.1f} s, "
                        f"computed {result['computed_tokens']}, "
                        f"recomputed {result['recomputed_tokens']}, "
                        f"preempted {result['preemptions']}",
                        flush=True,
                    )
    finally:
        for system in systems.values():
            await system.close()
    return {
        "runs": runs,
        "settings": {
            "systems": list(systems),
            "rates_per_min": args.rates,
            "collaborations_per_run": args.count,
            "reps": args.reps,
            "kv_blocks": args.blocks,
            "block_tokens": 128,
            "context_words": args.words,
            "mix": list(MIX),
            "engine": ENGINE,
            "sampling": COMMON,
        },
    }


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The load page and headline, from ``load.json`` (and ``load_quick.json``) in ``results``."""
    data = json.loads((results / "load.json").read_text())
    found = R.targets(R.medians(data))
    parts = []
    for stem, heading in (("load", "Results"), ("load_quick", "The `--quick` run")):
        if (results / f"{stem}.json").exists():
            run = data if stem == "load" else json.loads((results / f"{stem}.json").read_text())
            plot = f"![latency against throughput]({RESULTS_LINK}/{stem}.png)\n"
            parts.append((heading, R.tables(run) + "\n" + plot + "\n" + data_line(f"{stem}.json")))
    if (results / "load_diagnosis.md").exists():
        parts.append(("Diagnosis", f"[`load_diagnosis.md`]({RESULTS_LINK}/load_diagnosis.md)"))
    throughput = found[0] if found else None
    return FamilyReport(
        family="load",
        title="Collaborations under load",
        headline=Headline(
            figure="collaborations/min at the client's p95, past the client's knee",
            value="–" if throughput is None else throughput["text"],
            baseline="openai-SDK client code on vLLM's server (prefix caching)",
            target=">= 2x: " + ("met" if throughput and throughput["met"] else "not met"),
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            "Poisson arrivals of votes, debates and aggregations on a KV cache smaller than "
            "the live working set, paired across microagent (in process and over HTTP), "
            "client code on vLLM's server and LangGraph: "
            + "; ".join(f"{t['target']}: {t['text']}" for t in found)
            + "."
        ),
        page=page("Collaborations under load (`bench/load.py`)", __doc__, parts),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rates, 9 collaborations, 1 rep")
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="per minute")
    parser.add_argument("--count", type=int, default=None, help="collaborations per run")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=40, help="KV cache blocks (128 tokens)")
    parser.add_argument("--words", type=int, default=700, help="context words (~1.5k tokens)")
    parser.add_argument(
        "--systems",
        nargs="+",
        default=["microagent", "client", "ablation"],
        choices=SYSTEMS,
    )
    parser.add_argument("--port", type=int, default=8471, help="the client's vLLM server")
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add this run's runs (other rates) to the existing JSON, as a supplementary run",
    )
    parser.add_argument("--report-only", action="store_true", help="tables from the existing JSON")
    args = parser.parse_args()
    args.rates = args.rates or ([6.0, 40.0] if args.quick else [6.0, 24.0, 48.0, 96.0])
    args.count = args.count or (9 if args.quick else 10)
    args.reps = args.reps or (1 if args.quick else 3)
    stem = "load_quick" if args.quick else "load"
    path = RESULTS / f"{stem}.json"
    if args.report_only:
        data = json.loads(path.read_text())
    else:
        load = quiet_load(args.force, 0.5)
        if load is None:
            return 2
        started = time.time()
        data = asyncio.run(main_async(args))
        data["machine"] = machine(load, bool(args.force and load > 0.5), started)
        if args.append:
            data = R.merge(json.loads(path.read_text()), data)
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
    tables = R.tables(data)
    (RESULTS / f"{stem}_tables.md").write_text(tables)
    R.plot(data, RESULTS / f"{stem}.png")
    print(tables)
    if args.update and stem == "load":
        publish(HERE.parent, family_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
