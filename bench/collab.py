"""In-engine collaboration vs client-side orchestration on the same engine (issue 6).

Runs the same collaborations (vote, debate, aggregate, reflect) four ways on
the same model (the embedded SmolLM2-135M-Instruct) and machine:

1. ``microagent``: the Python API on one in-process vLLM engine (``VLLMBridge``);
2. ``client``: plain OpenAI-SDK code, one HTTP call per role, against vLLM's
   own OpenAI server with prefix caching on;
3. ``client-nocache``: the same code against a server with prefix caching off;
4. ``langgraph``: the same graphs built with the real ``langgraph`` package
   (its own virtual environment, ``bench/.venv-peers``), against server 2.

Every engine gets the same scheduler settings and KV cache size. Within a
repetition systems run one after another (never two at once); the order
rotates across repetitions, and every (repetition, workload) has its own
context, so every engine starts cold on it. Writes ``bench/results/collab.json``,
``collab_tables.md`` and PNG plots.

Every run also records its workload floor (``_collab_floor``): the prefill
the workload needs from its own texts, whatever system runs it.

Usage: ``.venv/bin/python bench/collab.py [--quick] [--reps N] [--items N] [--update]``;
``--report-only bench/results/NAME.json [--update]`` regenerates the summary,
tables and plots of an earlier run (and, with ``--update``, the family page and
headline row) without running anything.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _collab_client as C  # noqa: E402
import _collab_floor as F  # noqa: E402
import _collab_prompts as P  # noqa: E402
import _collab_report as R  # noqa: E402
from _collab_tasks import (  # noqa: E402
    Task,
    ideal_prefill,
    majority,
    task_set,
    time_split,
    workload_context,
)
from _sections import (  # noqa: E402
    RESULTS_LINK,
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine_cell,
    page,
    publish,
    x,
)

RESULTS = HERE / "results"
PEERS_VENV = HERE / ".venv-peers"
PEER_PACKAGES = ["langgraph", "openai"]

COMMON = {"max_tokens": 48, "answer_tokens": 8, "temperature": 0.7}
WORKLOADS: dict[str, dict[str, Any]] = {
    "vote5-direct": {"kind": "vote", "n": 5, "style": "direct", **COMMON},
    "vote5-reason": {"kind": "vote", "n": 5, "style": "reason", **COMMON},
    "vote9-direct": {"kind": "vote", "n": 9, "style": "direct", **COMMON},
    "vote9-reason": {"kind": "vote", "n": 9, "style": "reason", **COMMON},
    "debate3x2": {"kind": "debate", "agents": 3, "rounds": 2, "layout": "auto", **COMMON},
    # five debaters: the shared transcript (auto) against a thread per agent
    "debate5x2": {"kind": "debate", "agents": 5, "rounds": 2, "layout": "auto", **COMMON},
    "debate5x2-threads": {
        "kind": "debate",
        "agents": 5,
        "rounds": 2,
        "layout": "threads",
        **COMMON,
    },
    "aggregate3+1": {"kind": "aggregate", "proposers": 3, **COMMON},
    "reflect2": {"kind": "reflect", "rounds": 2, **{**COMMON, "temperature": 0.0}},
}
QUICK_WORKLOADS = ["vote5-direct", "vote9-reason", "debate3x2", "aggregate3+1", "reflect2"]


def plan(quick: bool) -> dict[str, list[str]]:
    """workload -> systems that run it (quick mode: caching-off and LangGraph on vote-5 only)."""
    names = QUICK_WORKLOADS if quick else list(WORKLOADS)
    out = {}
    for w in names:
        systems = ["microagent", "client"]
        if WORKLOADS[w]["kind"] == "vote":
            systems.insert(1, "microagent-full")
        if w.startswith("vote9"):  # voters started 3 at a time: later waves skipped once decided
            systems.insert(1, "microagent-wave3")
        if not quick or w == "vote5-direct":
            systems += ["client-nocache", "langgraph"]
        out[w] = systems
    return out


# -- microagent ------------------------------------------------------------------------


async def run_micro(
    bridge: Any, wl: dict[str, Any], ctx: str, choices: list[str], early_stop: bool, wave: int = 0
) -> dict[str, Any]:
    import microagent as M

    ctx_in: Any = P.context(ctx)  # the same messages the client code sends first
    n0, s0 = len(bridge.generations), bridge.stats()
    t0c, t0 = bridge.clock(), time.monotonic()
    kind = wl["kind"]
    if kind == "vote":
        out = await M.vote(
            bridge,
            ctx_in,
            voters=wl["n"],
            choices=choices,
            style=wl["style"],
            temperature=wl["temperature"],
            max_tokens=wl["max_tokens"],
            answer_tokens=wl["answer_tokens"],
            early_stop=early_stop,
            wave=wave,
        )
    elif kind == "debate":
        out = await M.debate(
            bridge,
            ctx_in,
            agents=wl["agents"],
            rounds=wl["rounds"],
            max_tokens=wl["max_tokens"],
            temperature=wl["temperature"],
            early_stop=False,
            answer={"choices": choices},
            layout=wl.get("layout", "auto"),
        )
    elif kind == "aggregate":
        out = await M.aggregate(
            bridge,
            ctx_in,
            proposers=wl["proposers"],
            max_tokens=wl["max_tokens"],
            temperature=wl["temperature"],
        )
    else:
        out = await M.reflect(
            bridge,
            ctx_in,
            validator=C.format_validator(choices),
            rounds=wl["rounds"],
            drafter=P.FIRST_PROMPT,
            max_tokens=wl["max_tokens"],
            temperature=wl["temperature"],
        )
    wall = time.monotonic() - t0
    t1c = bridge.clock()
    await bridge.wait_idle(10.0)
    s1 = bridge.stats()
    results = sorted(
        (g.result for g in bridge.generations[n0:] if g.result is not None),
        key=lambda r: r.timings.submitted,
    )
    intervals = [(r.timings.submitted, r.timings.first_token, r.timings.finished) for r in results]
    answers = [a.answer or "" for a in out.agents if a.role in ("voter", "debater")]
    return {
        "wall": wall,
        "answer": out.answer,
        "answers": answers,
        "prompt_tokens": s1.prompt_tokens - s0.prompt_tokens,
        "cached_tokens": s1.cached_tokens - s0.cached_tokens,
        "completion_tokens": s1.completion_tokens - s0.completion_tokens,
        "sched_queries": s1.prefix_cache_queries - s0.prefix_cache_queries,
        "sched_hits": s1.prefix_cache_hits - s0.prefix_cache_hits,
        "usage": out.usage.to_dict(),
        "early_stopped": out.early_stopped,
        "requests": len(results),
        "request_completion_tokens": [len(r.output_ids) for r in results],
        "agents": [
            {"role": a.role, "requests": a.requests, "completion_tokens": a.completion_tokens}
            for a in out.agents
        ],
        "aborted": s1.requests_aborted - s0.requests_aborted,
        "ideal": ideal_prefill([(r.prompt.token_ids, r.output_ids) for r in results]),
        "context_tokens": len(bridge.chat.context(ctx_in)),
        "sum_prefill_s": sum((r.timings.queue_and_prefill or 0.0) for r in results),
        "sum_decode_s": sum((r.timings.decode or 0.0) for r in results),
        "split": time_split(intervals, t0c, t1c),
    }


# -- client side -----------------------------------------------------------------------


async def run_client(
    server: Any, wl: dict[str, Any], ctx: str, choices: list[str]
) -> dict[str, Any]:
    from _collab_engines import SERVED_NAME
    from microagent.testing import metric_delta
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=600)
    caller = C.Caller(client, SERVED_NAME)
    before = server.metrics()
    t0 = time.monotonic()
    out = await C.run_workload(caller, wl, ctx, choices)
    t1 = time.monotonic()
    await client.close()
    return _server_result(server, before, t1 - t0, out, caller.requests, t0, t1, metric_delta)


def run_langgraph(server: Any, wl: dict[str, Any], ctx: str, choices: list[str]) -> dict[str, Any]:
    from _collab_engines import SERVED_NAME
    from microagent.testing import metric_delta

    job = {
        "system": P.SYSTEM,
        "base_url": server.base_url,
        "model": SERVED_NAME,
        "workload": wl,
        "context": ctx,
        "choices": choices,
    }
    before = server.metrics()
    proc = subprocess.run(
        [str(PEERS_VENV / "bin" / "python"), str(HERE / "_collab_peer.py"), json.dumps(job)],
        capture_output=True,
        text=True,
        check=False,
        cwd=str(HERE),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"langgraph peer failed: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"answer": res["answer"], "langgraph": res["langgraph"]}
    return _server_result(
        server,
        before,
        res["wall"],
        out,
        res["requests"],
        res["t0"],
        res["t0"] + res["wall"],
        metric_delta,
    )


def _server_result(
    server: Any,
    before: dict[str, float],
    wall: float,
    out: dict[str, Any],
    requests: list[dict[str, Any]],
    t0: float,
    t1: float,
    delta: Any,
) -> dict[str, Any]:
    time.sleep(0.5)  # the server's stat logger records the last step asynchronously
    d = delta(before, server.metrics())
    intervals = [(r["submitted"], None, r["finished"]) for r in requests]
    split = time_split(intervals, t0, t1)
    return {
        "wall": wall,
        "answer": out.get("answer", ""),
        "answers": out.get("answers", []),
        "prompt_tokens": int(d["vllm:prompt_tokens_total"]),
        "cached_tokens": int(d["vllm:prefix_cache_hits_total"]),
        "completion_tokens": int(d["vllm:generation_tokens_total"]),
        "sched_queries": int(d["vllm:prefix_cache_queries_total"]),
        "sched_hits": int(d["vllm:prefix_cache_hits_total"]),
        "requests": len(requests),
        "request_completion_tokens": [
            r["completion_tokens"] for r in sorted(requests, key=lambda r: r["submitted"])
        ],
        "metrics": d,
        "sum_prefill_s": d["vllm:request_queue_time_seconds_sum"]
        + d["vllm:request_prefill_time_seconds_sum"],
        "sum_decode_s": d["vllm:request_decode_time_seconds_sum"],
        "split": {
            "in_flight": split["prefill"] + split["decode"],
            "orchestration": split["orchestration"],
        },
        **({"langgraph": out["langgraph"]} if "langgraph" in out else {}),
    }


# -- accuracy --------------------------------------------------------------------------


async def accuracy(bridge: Any, tasks: list[Task], concurrency: int = 3) -> list[dict[str, Any]]:
    """Per task: 9 reason-then-answer voters run to the end (vote-1/3/5/9 are their
    first k votes; exact early stop returns the same answer as the full vote), and a
    3 x 2 debate. Items run ``concurrency`` at a time."""
    import microagent as M

    sem = asyncio.Semaphore(concurrency)
    out: list[dict[str, Any]] = []

    async def one(task: Task) -> None:
        choices = list(task.choices)
        async with sem:
            v = await M.vote(
                bridge,
                task.prompt(),
                voters=9,
                choices=choices,
                style="reason",
                temperature=0.7,
                max_tokens=COMMON["max_tokens"],
                answer_tokens=COMMON["answer_tokens"],
                early_stop=False,
            )
            d = await M.debate(
                bridge,
                task.prompt(),
                agents=3,
                rounds=2,
                max_tokens=COMMON["max_tokens"],
                temperature=0.7,
                early_stop=False,
                answer={"choices": choices},
            )
        voters = [a for a in v.agents if a.role == "voter"]
        out.append(
            {
                "id": task.id,
                "kind": task.kind,
                "gold": task.answer,
                "votes": [a.answer or "" for a in voters],
                "vote_completion": [a.completion_tokens for a in voters],
                "debate": d.answer,
                "debate_completion": d.usage.completion_tokens,
            }
        )

    await asyncio.gather(*(one(t) for t in tasks))
    return sorted(out, key=lambda r: r["id"])


def accuracy_summary(
    rows: list[dict[str, Any]], choices_of: dict[int, tuple[str, ...]]
) -> list[dict[str, Any]]:
    """Accuracy with Wilson intervals and mean completion tokens per question, per method."""
    from microagent.evaluation import wilson

    methods: list[dict[str, Any]] = []
    for k in (1, 3, 5, 9):
        ok = sum(majority(r["votes"][:k], choices_of[r["id"]]) == r["gold"] for r in rows)
        tokens = statistics.fmean(sum(r["vote_completion"][:k]) for r in rows) if rows else 0.0
        lo, hi = wilson(ok, len(rows))
        methods.append(
            {
                "method": "single sample" if k == 1 else f"vote-{k}",
                "correct": ok,
                "n": len(rows),
                "accuracy": ok / len(rows) if rows else 0.0,
                "ci": [lo, hi],
                "completion_tokens": tokens,
            }
        )
    ok = sum(r["debate"] == r["gold"] for r in rows)
    lo, hi = wilson(ok, len(rows))
    methods.append(
        {
            "method": "debate 3x2",
            "correct": ok,
            "n": len(rows),
            "accuracy": ok / len(rows) if rows else 0.0,
            "ci": [lo, hi],
            "completion_tokens": statistics.fmean(r["debate_completion"] for r in rows)
            if rows
            else 0.0,
        }
    )
    return methods


# -- orchestration -----------------------------------------------------------------------


def ensure_peers_venv() -> str:
    """Create ``bench/.venv-peers`` (langgraph + openai) once; return langgraph's version."""
    py = PEERS_VENV / "bin" / "python"
    if not py.exists():
        print(f"creating {PEERS_VENV} ({' '.join(PEER_PACKAGES)})", flush=True)
        venv.create(PEERS_VENV, with_pip=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    probe = "from importlib.metadata import version as v; print(v('langgraph'), v('openai'))"
    return subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()


def machine() -> dict[str, Any]:
    import microagent
    import torch
    import vllm

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = next(
        (
            ln.split()[1]
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.startswith("MemTotal")
        ),
        "0",
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(int(mem) / 2**20, 1),
        "python": platform.python_version(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "microagent": microagent.__version__,
        "platform": platform.platform(),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import microagent
    from _collab_engines import SETTINGS, Server, make_bridge

    work = plan(args.quick)
    if args.workloads:
        work = {w: s for w, s in work.items() if w in args.workloads.split(",")}
    need_nocache = any("client-nocache" in s for s in work.values())
    need_lg = any("langgraph" in s for s in work.values()) and not args.no_langgraph
    peers = ensure_peers_venv() if need_lg else None
    model_dir = microagent.resolve_model("default")
    RESULTS.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    servers = {
        "client": Server(
            model_dir, args.port, prefix_caching=True, log=RESULTS / "server-cache.log.tmp"
        )
    }
    if need_nocache:
        servers["client-nocache"] = Server(
            model_dir, args.port + 1, prefix_caching=False, log=RESULTS / "server-nocache.log.tmp"
        )
    bridge = make_bridge()
    counter = turn_counter(model_dir)
    runs: list[dict[str, Any]] = []
    tasks = task_set()
    try:
        await bridge.open()
        for s in servers.values():
            await asyncio.to_thread(s.wait_healthy)
        print(f"engines up after {time.monotonic() - t_start:.0f} s", flush=True)
        systems_all = [
            "microagent",
            "microagent-wave3",
            "microagent-full",
            "client",
            "client-nocache",
            "langgraph",
        ]
        for rep in range(args.reps):
            order = systems_all[rep % len(systems_all) :] + systems_all[: rep % len(systems_all)]
            for wi, (wname, systems) in enumerate(work.items()):
                wl = WORKLOADS[wname]
                task = tasks[(7 * rep + wi) % len(tasks)]
                ctx = workload_context(10_000 * (rep + 1) + wi, task)
                choices = list(task.choices)
                for system in order:
                    if system not in systems or (system == "langgraph" and not need_lg):
                        continue
                    if system.startswith("microagent"):
                        await bridge.reset_prefix_cache()
                        res = await run_micro(
                            bridge,
                            wl,
                            ctx,
                            choices,
                            early_stop=system != "microagent-full",
                            wave=3 if system == "microagent-wave3" else 0,
                        )
                    else:
                        server = servers[
                            "client-nocache" if system == "client-nocache" else "client"
                        ]
                        await asyncio.to_thread(server.reset_prefix_cache)
                        if system == "langgraph":
                            res = await asyncio.to_thread(run_langgraph, server, wl, ctx, choices)
                        else:
                            res = await run_client(server, wl, ctx, choices)
                    res.update(
                        system=system, workload=wname, rep=rep, task=task.id, gold=task.answer
                    )
                    res["floor_inputs"] = F.floor_inputs(
                        counter, wl, P.context(ctx), choices, res["requests"], _started(res)
                    )
                    runs.append(res)
                    print(
                        f"rep {rep} {wname:13s} {system:16s} wall {res['wall']:6.2f} s  prompt "
                        f"{res['prompt_tokens']:6d} cached {res['cached_tokens']:6d} completion "
                        f"{res['completion_tokens']:5d}  answer {str(res['answer'])[:30]!r}",
                        flush=True,
                    )
        for s in servers.values():
            s.stop()
        acc_tasks = tasks[: args.items]
        t_acc = time.monotonic()
        rows = await accuracy(bridge, acc_tasks) if args.items else []
        print(f"accuracy on {len(rows)} items in {time.monotonic() - t_acc:.0f} s", flush=True)
    finally:
        for s in servers.values():
            s.stop()
        await bridge.close()
    choices_of = {t.id: t.choices for t in tasks}
    return {
        "machine": machine(),
        "peers": peers,
        "settings": SETTINGS,
        "workloads": {w: WORKLOADS[w] for w in work},
        "plan": work,
        "quick": args.quick,
        "system_prompt": P.SYSTEM,
        "reps": args.reps,
        "items": len(rows),
        "server_start_s": {k: s.start_seconds for k, s in servers.items()},
        "engine_start_s": bridge.engine_start_seconds,
        "runs": runs,
        "accuracy_rows": rows,
        "accuracy": accuracy_summary(rows, choices_of),
        "chance": statistics.fmean(1 / len(choices_of[r["id"]]) for r in rows) if rows else None,
        "total_s": time.monotonic() - t_start,
        "command": "python bench/collab.py " + " ".join(sys.argv[1:]),
    }


# -- the workload floor and reports from a results file ------------------------------------


def turn_counter(model_dir: Path) -> F.TurnCounter:
    """Token counts by the model's own chat template (Hugging Face tokenizer, no engine)."""
    from transformers import AutoTokenizer

    return F.TurnCounter.from_tokenizer(AutoTokenizer.from_pretrained(str(model_dir)))


def _started(run: dict[str, Any]) -> int | None:
    """Voters that made a request (microagent records its agents; None = every voter)."""
    if "agents" not in run:
        return None
    return sum(1 for a in run["agents"] if a["role"] == "voter" and a["requests"])


def _contexts(
    data: dict[str, Any], counter: F.TurnCounter, tasks: list[Task]
) -> dict[tuple[str, int], list[Any]]:
    """Each (workload, repetition)'s shared context messages, rebuilt from its seed and task.

    A results file does not store the context text; it is rebuilt as the bench
    built it (``10 000 × (rep + 1) + the workload's index in the plan``; reports
    of 1 500 words before 29 Nov, 1 200 since) and checked against the context
    length microagent recorded: the difference must be one constant for the
    whole file (the template's default system turn, which microagent's
    composition left out before the fix, or nothing).

    Raises:
        ValueError: when no report length reproduces the recorded contexts.
    """
    names = list(data["plan"])
    keys = {(r["workload"], r["rep"]): r["task"] for r in data["runs"]}
    checks = [r for r in data["runs"] if r.get("context_tokens")]
    for words in (1200, 1500):
        out = {
            (w, rep): P.context(
                workload_context(10_000 * (rep + 1) + names.index(w), tasks[t], words)
            )
            for (w, rep), t in keys.items()
        }
        offsets = {
            counter.context(out[(r["workload"], r["rep"])]) - r["context_tokens"] for r in checks
        }
        if len(offsets) == 1 and 0 <= next(iter(offsets)) <= 40:
            return out
    raise ValueError("could not rebuild the contexts of this results file")


def backfill_floor(data: dict[str, Any], counter: F.TurnCounter) -> int:
    """Add ``floor_inputs`` to the runs of a results file recorded before the floor existed.

    Returns how many runs got them. The numbers are the ones the bench records
    now, from the rebuilt contexts, the task's choices, the run's request count
    and (waves of voters) its answers.
    """
    missing = [r for r in data["runs"] if not r.get("floor_inputs")]
    if not missing:
        return 0
    tasks = task_set()
    saved = P.SYSTEM
    P.SYSTEM = data.get("system_prompt")
    try:
        contexts = _contexts(data, counter, tasks)
        for r in missing:
            wl = data["workloads"][r["workload"]]
            started = None
            if wl["kind"] == "vote" and wl["style"] == "reason":
                wave = 3 if r["system"] == "microagent-wave3" else 0
                started = F.voters_started(r.get("answers", []), r["requests"], wl["n"], wave)
            r["floor_inputs"] = F.floor_inputs(
                counter,
                wl,
                contexts[(r["workload"], r["rep"])],
                list(tasks[r["task"]].choices),
                r["requests"],
                started,
            )
    finally:
        P.SYSTEM = saved
    data["floor_backfilled"] = (
        f"floor_inputs added to {len(missing)} runs after the run by "
        "bench/collab.py --report-only (contexts rebuilt from their seeds)"
    )
    return len(missing)


def write_reports(data: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Any]:
    """The summary JSON, the markdown tables and the plots of one results file."""
    summary = R.summarize(data)
    (out_dir / f"{stem}_summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / f"{stem}_tables.md").write_text(R.tables(data, summary))
    R.plots(data, summary, out_dir, stem)
    return summary


#: The runs the family page shows first, in this order; the other ``collab_*`` runs follow.
FIRST = ("collab_full", "collab_accuracy240", "collab_debate", "collab_sysprompt")


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The collab page (every ``collab_*`` run in ``results``) and its headline (collab_full)."""
    runs = sorted(
        (p.stem for p in results.glob("collab_*.json") if not p.stem.endswith("_summary")),
        key=lambda stem: (FIRST.index(stem) if stem in FIRST else len(FIRST), stem),
    )
    parts = []
    for stem in runs:
        run = json.loads((results / f"{stem}.json").read_text())
        plots = "".join(
            f"![{kind}]({RESULTS_LINK}/{stem}_{kind}.png)\n"
            for kind in ("wall", "prefill", "accuracy")
            if (results / f"{stem}_{kind}.png").exists()
        )
        body = R.tables(run, R.summarize(run)) + "\n" + plots + "\n" + data_line(f"{stem}.json")
        parts.append((f"`{stem}`", body))
    data = json.loads((results / "collab_full.json").read_text())
    cells = R.summarize(data)["cells"]
    walls = [c["microagent"]["wall_ratio_per_rep"] for c in cells.values() if "client" in c]
    computed = [c["microagent"]["computed"] / c["client"]["computed"] for c in cells.values()]
    floors = [c["microagent"]["floor_ratio"] for c in cells.values()]
    nocache = [
        c["client-nocache"]["computed"] / c["microagent"]["computed"]
        for c in cells.values()
        if "client-nocache" in c
    ]
    return FamilyReport(
        family="collab",
        title="In-engine collaboration against client-side orchestration",
        headline=Headline(
            figure=f"wall time per collaboration, {len(walls)} workloads (vote, debate, "
            "aggregate, reflect)",
            value=f"{x(min(walls))}–{x(max(walls))}",
            baseline="openai-SDK client code on vLLM's server (prefix caching)",
            target="<= 0.70×: " + ("met" if max(walls) <= 0.7 else "not met"),
            machine=machine_cell(data.get("machine", {})),
            date=date_cell(data.get("machine", {})),
        ),
        summary=(
            f"The same collaborations four ways on the same engine settings. microagent "
            f"computes {x(min(floors))}–{x(max(floors))} the workload floor's prompt tokens "
            f"and {x(min(computed))}–{x(max(computed))} the client's with vLLM's prefix cache; "
            f"without the cache the client computes {x(min(nocache))}–{x(max(nocache))} "
            f"microagent's. Wall time: {x(min(walls))}–{x(max(walls))} the cached client's."
        ),
        page=page(
            "In-engine collaboration against client-side orchestration (`bench/collab.py`)",
            __doc__,
            parts,
        ),
    )


def report_only(path: Path, update: bool) -> str:
    """Reports from a results file without running anything (backfills the floor if absent)."""
    import microagent

    data = json.loads(path.read_text())
    if any(not r.get("floor_inputs") for r in data["runs"]):
        added = backfill_floor(data, turn_counter(microagent.resolve_model("default")))
        path.write_text(json.dumps(data, indent=1))
        print(f"{path.name}: floor inputs added to {added} runs", flush=True)
    summary = write_reports(data, path.parent, path.stem)
    if update:
        publish(HERE.parent, family_report(path.parent))
    return R.tables(data, summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="5 workloads; caching-off and LangGraph on vote5-direct only; 20 accuracy items",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--items", type=int, default=None, help="accuracy items (default 240, 20 with --quick)"
    )
    ap.add_argument("--workloads", default="", help="comma-separated subset of workloads")
    ap.add_argument("--no-langgraph", action="store_true")
    ap.add_argument("--port", type=int, default=8731)
    ap.add_argument("--out", default="collab")
    ap.add_argument(
        "--system-prompt",
        action="store_true",
        help="send SmolLM2's default system prompt explicitly on every side (microagent's "
        "chat composition omits it; vLLM's server inserts it)",
    )
    ap.add_argument(
        "--report-only",
        metavar="PATH",
        help="regenerate the summary, tables and plots of a results JSON without running",
    )
    ap.add_argument("--update", action="store_true", help="also rewrite the family page and row")
    args = ap.parse_args()
    if args.report_only:
        print(report_only(Path(args.report_only).resolve(), args.update))
        return
    if args.system_prompt:
        P.SYSTEM = P.SMOLLM2_DEFAULT_SYSTEM
    if args.items is None:
        args.items = 20 if args.quick else 240
    data = asyncio.run(main_async(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(data, indent=1))
    summary = write_reports(data, RESULTS, args.out)
    if args.update:
        publish(HERE.parent, family_report())
    print(R.tables(data, summary))


if __name__ == "__main__":
    main()
