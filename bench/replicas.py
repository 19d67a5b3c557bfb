"""Two engine replicas on Ray Serve: the affinity router against Serve's own router.

One local Ray cluster (this machine's cores), ``microagent.cluster``'s application
with two engine replicas, deployed twice on identical settings: ``affinity``
(``AffinityRouter``: a session to the replica that holds its KV, a shared prefix
to the replica that cached it) and ``serve`` (Serve's power of two choices, which
ignores the KV). Paired: both get the same workload, in the same order:

* **sessions**: ``SESSIONS`` multi-turn conversations (``TURNS`` turns each), each
  with its own ~``CONTEXT_WORDS``-word context, ``CONCURRENT`` at a time, through
  an unmodified chat loop that re-sends the conversation with ``prompt_cache_key``;
* **collaborations**: ``DOCUMENTS`` documents, ``QUESTIONS`` votes over each (3
  voters), one request each (a collaboration never spans replicas);
* **a replica kill**: ``KILLED`` non-streaming requests in flight on one replica,
  whose actor is then killed: how many fail.

Per router: prompt tokens, cached and computed (from each response's ``usage``),
latency p50/p95, failures; the ratios affinity / serve; and the targets
(computed ≤ 0.6x, no request lost during the kill). The two replicas share this
machine's cores, so only ratios mean anything here.

Results: ``bench/results/replicas.json`` (with ``targets``), its tables, and with
``--update`` its family page and headline row (``bench/report.py``). Refuses a load
average above 0.5 (``--force``).

Usage: ``.venv/bin/python bench/replicas.py [--engine scripted] [--update]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
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
    quiet_load,
    x,
)
from _serve import free_port  # noqa: E402

RESULTS = HERE / "results"
ROUTINGS = ("affinity", "serve")
SESSIONS, TURNS, CONCURRENT, CONTEXT_WORDS = 12, 5, 4, 300
DOCUMENTS, QUESTIONS, KILLED = 2, 4, 8
MAX_TOKENS = 12
#: Per replica: 32 CPU blocks of 128 tokens (4 096). The live working set is about 4 sessions
#: of ~1.3 k tokens (5.2 k): one replica holds 0.8x of it, the two together 1.6x. A router
#: that keeps each session on one replica needs half the working set per replica; one that
#: spreads every session's turns over both needs all of it on each, and evicts.
#: (A first run at 24 blocks is reported beside it on the family page, not hidden.)
ENGINE_ARGS = {"vllm": ("--max-num-seqs", "8", "--max-model-len", "2048",
                        "--engine-arg", "num_gpu_blocks_override=32"),
               "scripted": ("--engine-arg", "num_blocks=120", "--engine-arg",
                            "decode_time_per_token=0.01")}  # fmt: skip


def words(rng: random.Random, n: int) -> str:
    vocabulary = ["log", "entry", "module", "function", "value", "error", "request", "cache"]
    return " ".join(rng.choice(vocabulary) + str(rng.randrange(100)) for _ in range(n))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class Client:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=600.0)
        self.records: list[dict[str, Any]] = []

    def post(self, kind: str, body: dict[str, Any]) -> httpx.Response:
        t0 = time.monotonic()
        r = self.http.post("/v1/chat/completions", json={"model": "default", **body})
        record: dict[str, Any] = {
            "kind": kind,
            "status": r.status_code,
            "seconds": round(time.monotonic() - t0, 3),
            "replica": r.headers.get("x-microagent-replica"),
            "route": r.headers.get("x-microagent-route"),
        }
        if r.status_code == 200:
            usage = r.json()["usage"]
            record["prompt"] = usage["prompt_tokens"]
            record["cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        self.records.append(record)
        return r


def session(client: Client, index: int, seed: int) -> None:
    rng = random.Random(f"{seed}/session/{index}")
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": f"Session {index}. Read this log: " + words(rng, CONTEXT_WORDS),
        },
        {"role": "user", "content": "What failed first?"},
    ]
    for turn in range(TURNS):
        r = client.post(
            "session",
            {"messages": messages, "max_tokens": MAX_TOKENS, "prompt_cache_key": f"s{index}"},
        )
        if r.status_code != 200:
            return
        reply = r.json()["choices"][0]["message"]
        messages += [
            {"role": "assistant", "content": reply.get("content") or ""},
            {"role": "user", "content": f"Tool output {turn}: " + words(rng, 40)},
        ]


def collaboration(client: Client, document: str, question: int) -> None:
    client.post(
        "collaboration",
        {
            "messages": [
                {"role": "system", "content": document},
                {"role": "user", "content": f"Question {question}: is entry {question} an error?"},
            ],
            "max_tokens": 4,
            "agents": [{"name": "voter", "count": 3}],
            "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
        },
    )


def kill_one(client: Client, url: str) -> dict[str, Any]:
    """``KILLED`` requests of one session in flight on its replica, then that replica killed."""
    import ray

    first = client.post("kill", {"messages": [{"role": "user", "content": "Warm up."}],
                                 "max_tokens": 2, "prompt_cache_key": "victim"})  # fmt: skip
    home = first.headers["x-microagent-replica"]
    metrics = {"x-microagent-replica": home}

    def running() -> float:
        text = client.http.get("/metrics", headers=metrics).text
        for line in text.splitlines():
            if line.startswith("microagent:requests_running "):
                return float(line.split()[1])
        return 0.0

    with concurrent.futures.ThreadPoolExecutor(KILLED) as pool:
        body = {"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 64,
                "prompt_cache_key": "victim"}  # fmt: skip
        futures = [pool.submit(client.post, "kill", body) for _ in range(KILLED)]
        deadline = time.monotonic() + 120
        while running() < KILLED and time.monotonic() < deadline:
            pass
        in_flight = running()
        ray.kill(ray.get_actor(f"SERVE_REPLICA::microagent#EngineReplica#{home}", "serve"),
                 no_restart=True)  # fmt: skip
        answers = [f.result() for f in futures]
    return {
        "in_flight_at_kill": in_flight,
        "failed": sum(a.status_code != 200 for a in answers),
        "statuses": [a.status_code for a in answers],
        "moved_to_other": sum(a.headers.get("x-microagent-replica") != home for a in answers),
    }


def run_routing(routing: str, args: argparse.Namespace) -> dict[str, Any]:
    from microagent.cluster import ClusterSettings, build_app
    from ray import serve

    settings = ClusterSettings(
        serve_args=("--engine", args.engine, *ENGINE_ARGS[args.engine])
        if args.engine == "scripted"
        else ("--model", "default", *ENGINE_ARGS["vllm"]),
        replicas=2,
        replica_cpus=0.5,
        ingress_cpus=0.25,
        routing=routing,
    )
    t0 = time.monotonic()
    serve.run(build_app(settings), name="microagent", route_prefix="/")
    started = time.monotonic() - t0
    client = Client(args.url)
    t1 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(lambda i: session(client, i, args.seed), range(SESSIONS)))
        rng = random.Random(f"{args.seed}/documents")
        docs = [f"Document {d}: " + words(rng, CONTEXT_WORDS) for d in range(DOCUMENTS)]
        jobs = [(d, q) for q in range(QUESTIONS) for d in docs]
        list(pool.map(lambda job: collaboration(client, *job), jobs))
    work_s = time.monotonic() - t1
    kill = kill_one(client, args.url)
    serve.delete("microagent")
    return {"routing": routing, "start_s": round(started, 1), "work_s": round(work_s, 1),
            "records": client.records, "kill": kill}  # fmt: skip


def summary(run: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"routing": run["routing"]}
    for kind in ("session", "collaboration"):
        got = [r for r in run["records"] if r["kind"] == kind]
        ok = [r for r in got if r["status"] == 200]
        prompt = sum(r["prompt"] for r in ok)
        cached = sum(r["cached"] for r in ok)
        out[kind] = {
            "requests": len(got),
            "failed": len(got) - len(ok),
            "prompt": prompt,
            "cached": cached,
            "computed": prompt - cached,
            "p50_s": percentile([r["seconds"] for r in ok], 50),
            "p95_s": percentile([r["seconds"] for r in ok], 95),
            "replicas": len({r["replica"] for r in ok}),
            "fallback": sum(r["route"] == "fallback" for r in ok),
        }
    out["kill"] = run["kill"]
    return out


def targets(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    a, s = rows.get("affinity"), rows.get("serve")
    if a and s:
        ratio = a["session"]["computed"] / max(1, s["session"]["computed"])
        goal = (
            "affinity computes <= 0.6x the prompt tokens of Serve's router on multi-turn sessions"
        )
        out.append({"target": goal, "measured": round(ratio, 3), "met": ratio <= 0.6})
    for name, row in rows.items():
        lost = row["kill"]["failed"]
        out.append({"target": f"0 requests lost during a replica kill ({name})",
                    "measured": lost, "met": lost == 0})  # fmt: skip
    return out


def tables(data: dict[str, Any]) -> str:
    rows = {r["routing"]: r for r in data["summaries"]}
    lines = [
        f"Engine {data['engine']}, 2 replicas (0.5 CPU each) on one local Ray cluster; "
        f"{SESSIONS} sessions x {TURNS} turns ({CONCURRENT} at a time, ~{CONTEXT_WORDS}-word "
        f"contexts, `prompt_cache_key`), {DOCUMENTS * QUESTIONS} vote collaborations over "
        f"{DOCUMENTS} documents, then {KILLED} requests in flight on one replica when it is "
        f"killed. Paired: the same workload under each router. Machine: "
        f"{machine_sentence(data['machine'])}.",
        "",
        "| router | workload | requests (failed) | prompt tokens | cached | computed | p50 s "
        "| p95 s | replicas used | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for routing, row in rows.items():
        for kind in ("session", "collaboration"):
            k = row[kind]
            lines.append(
                f"| {routing} | {kind} | {k['requests']} ({k['failed']}) | {k['prompt']} "
                f"| {k['cached']} | {k['computed']} | {k['p50_s']:.2f} | {k['p95_s']:.2f} "
                f"| {k['replicas']} | {k['fallback']} |"
            )
    lines += ["", "| router | in flight at the kill | failed | served by the other replica |",
              "|---|---|---|---|"]  # fmt: skip
    for routing, row in rows.items():
        k = row["kill"]
        lines.append(
            f"| {routing} | {k['in_flight_at_kill']:.0f} | {k['failed']} | {k['moved_to_other']} |"
        )
    if "affinity" in rows and "serve" in rows:
        a, s = rows["affinity"], rows["serve"]
        lines += [
            "",
            "| ratio affinity / serve | computed prompt tokens | p95 |",
            "|---|---|---|",
        ]
        for kind in ("session", "collaboration"):
            lines.append(
                f"| {kind} | {a[kind]['computed'] / max(1, s[kind]['computed']):.2f} "
                f"| {a[kind]['p95_s'] / s[kind]['p95_s']:.2f} |"
            )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in data["targets"]:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The replicas page and headline, from ``replicas*.json`` in ``results`` (vLLM runs)."""
    data = json.loads((results / "replicas.json").read_text())
    rows = {r["routing"]: r for r in data["summaries"]}
    ours, serve = rows["affinity"]["session"], rows["serve"]["session"]
    ratio = ours["computed"] / max(1, serve["computed"])
    target = next(t for t in data["targets"] if "computes" in t["target"])
    parts = [("Results: 32 blocks per replica", tables(data) + "\n" + data_line("replicas.json"))]
    earlier = results / "replicas_24blocks.json"
    if earlier.exists():
        first = json.loads(earlier.read_text())
        body = tables(first) + "\n" + data_line("replicas_24blocks.json")
        parts.append(("An earlier run: 24 blocks per replica", body))
    return FamilyReport(
        family="replicas",
        title="Two replicas on Ray Serve",
        headline=Headline(
            figure="prompt tokens computed on multi-turn sessions, affinity router",
            value=x(ratio),
            baseline="Serve's own router (power of two choices)",
            target=f"<= 0.60x: {'met' if target['met'] else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            f"Two engine replicas of `microagent.cluster` on one local Ray cluster: the affinity "
            f"router computes {x(ratio)} the session prompt tokens of Serve's router, and a "
            f"replica killed with {rows['affinity']['kill']['in_flight_at_kill']:.0f} requests "
            f"in flight loses {rows['affinity']['kill']['failed']} of them."
        ),
        page=page("Two replicas on Ray Serve (`bench/replicas.py`)", __doc__, parts),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "scripted"), default="vllm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args(argv)
    load = quiet_load(args.force, 0.5)
    if load is None:
        return 2
    import ray
    from ray import serve

    started = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    args.url = f"http://127.0.0.1:{port}"
    runs = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for routing in ROUTINGS:
            runs.append(run_routing(routing, args))
            print(json.dumps(summary(runs[-1])), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    summaries = [summary(r) for r in runs]
    data = {
        "engine": args.engine,
        "settings": {
            "sessions": SESSIONS,
            "turns": TURNS,
            "concurrent": CONCURRENT,
            "context_words": CONTEXT_WORDS,
            "documents": DOCUMENTS,
            "questions": QUESTIONS,
            "killed": KILLED,
            "max_tokens": MAX_TOKENS,
            "serve_args": list(ENGINE_ARGS[args.engine]),
            "seed": args.seed,
        },
        "machine": machine(load, bool(args.force and load > 0.5), started),
        "runs": runs,
        "summaries": summaries,
        "targets": targets({s["routing"]: s for s in summaries}),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "replicas" if args.engine == "vllm" else "replicas_scripted"
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    text = tables(data)
    (args.out / f"{stem}_tables.md").write_text(text)
    print(text)
    if args.update and args.engine == "vllm":
        publish(HERE.parent, family_report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
