"""Issue 38's overhead cell: with the KV tier on and nothing to demote, plain
completions keep ``vllm serve``'s throughput.

Two servers on identical engine settings (scheduler limits, ``--blocks`` device KV
blocks, model, dtype), one at a time, in the order A B B A (``--rounds`` times):

* ``vllm``: ``vllm serve`` (its OpenAI server) with prefix caching;
* ``microagent-http-tier``: ``microagent serve --kv-host-bytes`` with a host tier of
  ``TIER_RATIO`` x the device blocks under the sessions' policy (every full block
  stored to the host as vLLM's offloading connector stores it; nothing is demoted,
  since the cache holds every request).

Each run (a fresh server) sends the same ``--requests`` distinct plain chat
completions (about ``--words`` words of prompt each, greedy, ``--max-tokens``
tokens), ``--concurrency`` at a time, with the openai SDK, after a warm-up of a few
others. Throughput: prompt plus completion tokens per second of wall time, and
requests per second. Target: the tiered server's median throughput is at least
0.98x ``vllm serve``'s. Writes ``bench/results/tier_plain.json`` (with ``targets``);
refuses a busy machine (load average 1 or more) unless ``--force``.

Usage: ``.venv/bin/python bench/tier_plain.py [--force]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _sections import machine  # noqa: E402
from embedding_loop import document  # noqa: E402

RESULTS = HERE / "results"
SYSTEMS = ("vllm", "microagent-http-tier")
SETTINGS = {"max_num_seqs": 16, "max_model_len": 2048, "max_num_batched_tokens": 2048}
TARGET = 0.98


def open_system(name: str, blocks: int, log: Path) -> Any:
    from agents import MicroagentHttp, VllmHttp

    if name == "vllm":
        return VllmHttp("vllm", blocks, SETTINGS, log)
    return MicroagentHttp(name, "vllm", blocks, SETTINGS, log)


async def run_once(
    name: str, args: argparse.Namespace, prompts: list[str], warm: list[str]
) -> dict[str, Any]:
    """One server: start, warm up, the measured requests, stop."""
    from openai import AsyncOpenAI

    system = open_system(name, args.blocks, RESULTS / f"tier_plain-{name}.log")
    await system.open()
    try:
        if name == "vllm":
            from _collab_engines import SERVED_NAME

            base, model = system.server.base_url, SERVED_NAME
        else:
            base, model = f"{system.url}/v1", "default"
        client = AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=600.0)
        gate = asyncio.Semaphore(args.concurrency)
        usage: list[tuple[int, int]] = []

        async def one(text: str, keep: bool) -> None:
            async with gate:
                reply = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": text}],
                    max_tokens=args.max_tokens,
                    temperature=0.0,
                )
            if keep and reply.usage is not None:
                usage.append((reply.usage.prompt_tokens, reply.usage.completion_tokens))

        await asyncio.gather(*(one(t, False) for t in warm))
        start = time.monotonic()
        await asyncio.gather(*(one(t, True) for t in prompts))
        wall = time.monotonic() - start
        await client.close()
    finally:
        await system.close()
    prompt_tokens = sum(p for p, _ in usage)
    completion_tokens = sum(c for _, c in usage)
    return {
        "system": name,
        "requests": len(usage),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round((prompt_tokens + completion_tokens) / wall, 2),
        "requests_per_s": round(len(usage) / wall, 4),
        "loadavg_after": round(os.getloadavg()[0], 2),
    }


def targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tiered server's median throughput over ``vllm serve``'s."""
    by = {s: [r["tokens_per_s"] for r in runs if r["system"] == s] for s in SYSTEMS}
    if not all(by.values()):
        return [{"name": "tier on, nothing to demote: >= 0.98x vllm serve's throughput",
                 "measured": "no data", "met": None}]  # fmt: skip
    ratio = statistics.median(by["microagent-http-tier"]) / statistics.median(by["vllm"])
    return [
        {
            "name": f"tier on, nothing to demote: >= {TARGET}x vllm serve's throughput",
            "measured": round(ratio, 4),
            "text": (
                f"{ratio:.3f}x (median {statistics.median(by['microagent-http-tier']):.1f} vs "
                f"{statistics.median(by['vllm']):.1f} tokens/s over {len(by['vllm'])} runs each)"
            ),
            "met": ratio >= TARGET,
        }
    ]


def report(data: dict[str, Any]) -> str:
    """The runs and the verdict as Markdown (the tier family page's overhead section)."""
    lines = [
        "| run | system | requests | prompt + completion tokens | wall | tokens/s | load after |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, r in enumerate(data["runs"], 1):
        lines.append(
            f"| {k} | {r['system']} | {r['requests']} | "
            f"{r['prompt_tokens'] + r['completion_tokens']:,} | {r['wall_s']:.1f} s | "
            f"{r['tokens_per_s']:.1f} | {r['loadavg_after']} |"
        )
    lines.append("")
    for t in data["targets"]:
        verdict = {True: "met", False: "**missed**", None: "not run"}[t["met"]]
        lines.append(f"- {t['name']}: {t.get('text', t['measured'])} ({verdict})")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--words", type=int, default=300, help="prompt words (about)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--blocks", type=int, default=200, help="device KV blocks (128 tokens)")
    parser.add_argument("--rounds", type=int, default=1, help="A B B A rounds")
    parser.add_argument("--force", action="store_true", help="run on a busy machine")
    parser.add_argument("--out", type=Path, default=RESULTS / "tier_plain.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if load >= 1.0 and not args.force:
        raise SystemExit(f"load average {load:.2f} >= 1: not a quiet machine (--force)")
    started = time.time()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    nonce = f"plain-{int(started)}"
    runs: list[dict[str, Any]] = []
    order = [*SYSTEMS, *SYSTEMS[::-1]] * args.rounds
    # the same prompts for every run (each on a fresh server): greedy, the same work
    prompts = [document(i, nonce, args.words) for i in range(args.requests)]
    warm = [document(1000 + i, nonce, args.words) for i in range(4)]
    for name in order:
        run = asyncio.run(run_once(name, args, prompts, warm))
        print(json.dumps(run), flush=True)
        runs.append(run)
    data = {
        "runs": runs,
        "settings": {**SETTINGS, **vars(args)},
        "machine": machine(round(load, 2), args.force, started),
    }
    data["targets"] = targets(runs)
    args.out.write_text(json.dumps(data, indent=1, default=str) + "\n")
    for t in data["targets"]:
        print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
