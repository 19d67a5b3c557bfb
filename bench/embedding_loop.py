"""Issue 38's defect, measured: an embedding app's simplest loop in process against HTTP sessions.

The loop, as a new user writes it: ``--sessions`` sessions of about ``--context``
tokens arrive ``--arrival`` s apart; each takes ``--turns`` turns with a tool wait of
``--tool`` s (plus up to ``--tool-spread`` s by session) between them; each turn
extends the exact handle of the last result and retains it with
``Retain(f"session-{i}")``, with no priority and no next-use hint, on one
``VLLMBridge`` with its defaults and a device cache of ``--cache-share`` of the
sessions' working set. The same sessions, in the same run, go over HTTP to
``microagent serve`` (same engine settings, same cache) with ``prompt_cache_key``,
the whole conversation sent each turn by the ``openai`` client.

Reported per side: cached tokens on later turns (every turn after a session's
first), the later turns' prompt tokens, the turns that hit, and the later-turn
latency p50/p95. Target (issue 38): in process caches at least what HTTP caches.

Writes ``bench/results/embedding_loop.json`` (with ``targets``) and, with
``--update``, its family page and headline row (``bench/report.py``). Refuses to start
when the 1-minute load average is 1 or more (``--force`` to override; the report says so).

Usage: ``.venv/bin/python bench/embedding_loop.py [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

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
    x,
)
from _serve import MicroagentServe  # noqa: E402

RESULTS = HERE / "results"
BLOCK = 128  # vLLM's CPU block size (the log: "CPU KV cache size")
MAX_MODEL_LEN = 2048
WORDS = "river mountain lantern harbor copper meadow orbit signal velvet anchor canyon".split()  # noqa: SIM905


def sized_documents(args: argparse.Namespace) -> tuple[list[int], int]:
    """Words per session's document so that its first prompt holds about ``--context``
    tokens (the model's own tokenizer), and the sessions' working set in tokens."""
    from microagent.engine_bridge import resolve_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_model("default", progress=False)))

    def tokens(text: str) -> int:
        return len(tok.encode(text))

    words: list[int] = []
    working_set = 0
    for i in range(args.sessions):
        n = args.context // 2
        while tokens(document(i, "00000000", n)) < args.context:
            n += max(1, (args.context - tokens(document(i, "00000000", n))) // 2)
        words.append(n)
        added = tokens(tool_result(i, 0)) + 8 + args.reply  # + the chat turns' markers
        working_set += args.context + args.turns * added
    return words, working_set


def document(i: int, nonce: str, words: int) -> str:
    """Session ``i``'s first message: a log of ``words`` words, unique to this run."""
    body = " ".join(WORDS[(k * 7 + i) % len(WORDS)] for k in range(words))
    return f"Case {nonce}-{i}. Read this log and answer briefly:\n{body}"


def tool_result(i: int, turn: int) -> str:
    return f"Tool result {turn} for case {i}: " + " ".join(
        WORDS[(k + turn) % len(WORDS)] for k in range(25)
    )


def summary(cached: list[int], prompts: list[int], latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "later_turns": len(cached),
        "cached_tokens": sum(cached),
        "prompt_tokens": sum(prompts),
        "turns_that_hit": sum(c > 0 for c in cached),
        "p50_s": round(statistics.median(ordered), 2),
        "p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


async def in_process(
    args: argparse.Namespace, blocks: int, words: list[int], nonce: str
) -> dict[str, Any]:
    """The loop on one ``VLLMBridge`` with its defaults (no priority, no hint)."""
    from microagent.engine_bridge import KVHandle, Retain, Sampling, VLLMBridge

    bridge = VLLMBridge(
        max_model_len=MAX_MODEL_LEN,
        engine_args={"num_gpu_blocks_override": blocks},
        progress=False,
    )
    cached: list[int] = []
    prompts: list[int] = []
    latencies: list[float] = []
    sampling = Sampling(max_tokens=args.reply, temperature=0.0)

    async def session(i: int) -> None:
        await asyncio.sleep(i * args.arrival)
        ctx = bridge.chat.context(
            [
                {"role": "system", "content": "You are a careful analyst."},
                {"role": "user", "content": document(i, nonce, words[i])},
            ]
        )
        prompt: KVHandle = bridge.chat.generation_prompt(ctx)
        for turn in range(args.turns):
            start = time.monotonic()
            result = await bridge.generate(prompt, sampling, retain=Retain(f"session-{i}"))
            if turn:
                cached.append(result.cached_tokens)
                prompts.append(result.prompt_tokens)
                latencies.append(time.monotonic() - start)
            await asyncio.sleep(args.tool + (i % 3) * args.tool_spread)
            handle = bridge.chat.append(result.handle, "user", tool_result(i, turn))
            prompt = bridge.chat.generation_prompt(handle)

    async with bridge:
        await asyncio.gather(*(session(i) for i in range(args.sessions)))
        retained_hits = bridge.stats().retained_hit_tokens
        await bridge.release(prefix="session-")
    return {**summary(cached, prompts, latencies), "retained_hit_tokens": retained_hits}


async def over_http(
    args: argparse.Namespace, url: str, words: list[int], nonce: str
) -> dict[str, Any]:
    """The same sessions through ``microagent serve`` with ``prompt_cache_key``."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600)
    model = (await client.models.list()).data[0].id
    cached: list[int] = []
    prompts: list[int] = []
    latencies: list[float] = []

    async def session(i: int) -> None:
        await asyncio.sleep(i * args.arrival)
        messages: list[dict[str, str]] = [
            {"role": "system", "content": "You are a careful analyst."},
            {"role": "user", "content": document(i, nonce, words[i])},
        ]
        for turn in range(args.turns):
            start = time.monotonic()
            reply = await client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=args.reply,
                temperature=0.0,
                prompt_cache_key=f"session-{i}",
            )
            usage = reply.usage
            assert usage is not None
            if turn:
                details = usage.prompt_tokens_details
                cached.append((details.cached_tokens or 0) if details else 0)
                prompts.append(usage.prompt_tokens)
                latencies.append(time.monotonic() - start)
            await asyncio.sleep(args.tool + (i % 3) * args.tool_spread)
            messages.append(
                {"role": "assistant", "content": reply.choices[0].message.content or ""}
            )
            messages.append({"role": "user", "content": tool_result(i, turn)})

    await asyncio.gather(*(session(i) for i in range(args.sessions)))
    await client.close()
    return summary(cached, prompts, latencies)


def report(data: dict[str, Any]) -> str:
    """The family page's tables, every number from ``data``."""
    cfg = data["config"]
    lines = [
        f"Machine: {machine_sentence(data['machine'])}. {cfg['sessions']} sessions of about "
        f"{cfg['context']} tokens, {cfg['turns']} turns each, {cfg['arrival']} s apart, tool "
        f"waits of {cfg['tool']}-{cfg['tool'] + 2 * cfg['tool_spread']} s, replies of "
        f"{cfg['reply']} tokens; a device cache of {cfg['blocks']} blocks "
        f"({cfg['cache_share']:.0%} of the working set), the same on both sides.",
        "",
        "| side | later turns | that hit | cached / prompt tokens | later-turn p50 | p95 |",
        "|---|---|---|---|---|---|",
    ]
    for side in ("in_process", "http"):
        r = data[side]
        lines.append(
            f"| {side.replace('_', ' ')} | {r['later_turns']} | {r['turns_that_hit']} | "
            f"{r['cached_tokens']} / {r['prompt_tokens']} | {r['p50_s']} s | {r['p95_s']} s |"
        )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in data["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {t['met']} |")
    return "\n".join(lines) + "\n"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The embedding-loop page and headline, from ``embedding_loop.json`` in ``results``."""
    data = json.loads((results / "embedding_loop.json").read_text())
    local, remote = data["in_process"], data["http"]
    ratio = local["cached_tokens"] / max(1, remote["cached_tokens"])
    return FamilyReport(
        family="embedding_loop",
        title="The simplest embedding loop",
        headline=Headline(
            figure="cached prompt tokens on later turns, in process",
            value=x(ratio),
            baseline="the same sessions over HTTP (`microagent serve`, `prompt_cache_key`)",
            target=f">= 1.00x: {'met' if ratio >= 1 else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            "A new user's loop (extend the last handle, retain it, wait for a tool) on one "
            f"`VLLMBridge` caches {local['cached_tokens']} prompt tokens on later turns where "
            f"the same sessions over HTTP cache {remote['cached_tokens']}."
        ),
        page=page(
            "The simplest embedding loop, in process and over HTTP (`bench/embedding_loop.py`)",
            __doc__,
            [("Results", report(data) + "\n" + data_line("embedding_loop.json"))],
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--context", type=int, default=1000, help="tokens (about)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--arrival", type=float, default=1.0)
    parser.add_argument("--tool", type=float, default=3.0)
    parser.add_argument("--tool-spread", type=float, default=1.0)
    parser.add_argument("--reply", type=int, default=24)
    parser.add_argument("--cache-share", type=float, default=0.6)
    parser.add_argument("--force", action="store_true", help="run on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if load >= 1 and not args.force:
        raise SystemExit(f"load average {load:.2f} >= 1: not a quiet machine (--force)")
    started = time.time()
    RESULTS.mkdir(exist_ok=True)
    words, working_set = sized_documents(args)
    blocks = round(args.cache_share * working_set / BLOCK)
    nonce = uuid.uuid4().hex[:8]
    local = asyncio.run(in_process(args, blocks, words, nonce))
    server = MicroagentServe(
        RESULTS / "embedding_loop_serve.log",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--engine-arg",
        f"num_gpu_blocks_override={blocks}",
    )
    try:
        remote = asyncio.run(over_http(args, server.url, words, nonce[:-1] + "h"))
    finally:
        server.stop()
    ratio = local["cached_tokens"] / max(1, remote["cached_tokens"])
    data = {
        "machine": machine(load, args.force, started),
        "config": {**vars(args), "blocks": blocks, "working_set_tokens": working_set},
        "in_process": local,
        "http": remote,
        "targets": [
            {
                "name": "in process caches at least what HTTP sessions cache (later turns)",
                "measured": f"{ratio:.2f}x ({local['cached_tokens']} vs {remote['cached_tokens']})",
                "met": local["cached_tokens"] >= remote["cached_tokens"],
            }
        ],
    }
    (RESULTS / "embedding_loop.json").write_text(json.dumps(data, indent=2) + "\n")
    table = report(data)
    print(table)
    if args.update:
        publish(ROOT, family_report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
