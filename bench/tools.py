"""An agent loop with tool calls: in-engine (microagent) vs the same loop as client code.

The loop: one agent, a ~2 000-token context, three tool calls (each tool call
takes 200 ms), then an answer. Every call is constrained to the tool's schema
on both sides (``tool_choice="required"``), so both systems run the same
number of steps on the same contexts (paired: the same seeds).

* ``microagent``: ``collaborate(..., tools=[lookup], tool_choice="required",
  max_tool_steps=3)`` on the in-process engine; the agent's thread stays
  retained while the tool runs, each step extends it.
* ``client``: the openai SDK against vLLM's own OpenAI server (prefix caching
  on), one request per step, the history re-sent after every tool result
  (``tools`` and ``tool_choice="required"`` passed the same way).

Both engines get the same settings and the same small KV cache
(``--blocks``), with and without background load (``--load`` concurrent
requests on fresh ~1 500-token contexts while the loop runs), so eviction
can reach the loop's context. Reported per system and load: wall time of the
loop, prompt tokens computed per step after the first (what a step re-reads:
ideally only the tool result and the call), and in all.

Writes ``bench/results/tools[_quick].json``; ``--update`` rewrites its family
page and headline row from it (``bench/_tools_report.py``, ``bench/report.py``). Refuses to
start when the 1-minute load average is above 0.5 (``--force`` overrides).

Usage: ``.venv/bin/python bench/tools.py [--quick] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _tools_report as R  # noqa: E402
from _sections import (  # noqa: E402
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine,
    machine_cell,
    page,
    publish,
    x,
)

RESULTS = HERE / "results"
KEYS = ("alpha", "beta", "gamma", "delta")
TOOL_SECONDS = 0.2
STEPS = 3
#: per step, both sides (vLLM's own "required" calls are an array with a wrapper: room for it)
MAX_TOKENS = 64
WORDS = ["ledger", "invoice", "parcel", "depot", "freight", "manifest", "crate", "dock"]


def context_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return (
        f"Shipping log {seed}. {body}.\n\nLook up the codes you need with the lookup tool, "
        "then say in one sentence which shipment is late."
    )


async def lookup(key: Literal["alpha", "beta", "gamma", "delta"]) -> str:
    """The shipment code stored under a key."""
    await asyncio.sleep(TOOL_SECONDS)
    return f"{key}: code {KEYS.index(key) * 17 + 3}"


# -- background load ------------------------------------------------------------------------


async def flood_engine(bridge: Any, stop: asyncio.Event, seed: int) -> int:
    from microagent.engine_bridge import Sampling

    n = 0
    while not stop.is_set():
        ctx = bridge.chat.context([{"role": "user", "content": context_text(seed + n, 700)}])
        await bridge.generate(bridge.chat.generation_prompt(ctx), Sampling(max_tokens=16))
        n += 1
    return n


async def flood_server(client: Any, stop: asyncio.Event, seed: int) -> int:
    n = 0
    while not stop.is_set():
        await client.chat.completions.create(
            model="bench",
            messages=[{"role": "user", "content": context_text(seed + n, 700)}],
            max_tokens=16,
        )
        n += 1
    return n


# -- the two systems ------------------------------------------------------------------------


async def loop_in_engine(bridge: Any, context: str) -> dict[str, Any]:
    from microagent.collab import AgentSpec, Tool, collaborate

    first = len(bridge.generations)
    t0 = time.monotonic()
    outcome = await collaborate(
        bridge,
        "vote",
        context,
        [AgentSpec("worker", count=1, max_tokens=MAX_TOKENS, temperature=1.0)],
        tools=[Tool.from_function(lookup)],
        tool_choice="required",
        max_tool_steps=STEPS,
        early_stop=False,
    )
    wall = time.monotonic() - t0
    steps = [  # the loop's own requests (a collaboration's carry its group), not the flood's
        g.result
        for g in bridge.generations[first:]
        if g.result is not None and g.request.group is not None
    ]
    computed = [r.prompt_tokens - r.cached_tokens for r in steps]
    return {
        "wall_s": wall,
        "steps": len(steps),
        "tool_calls": sum(r.tool_calls for r in outcome.agents),
        "computed_per_step": computed,
        "prompt_tokens": sum(r.prompt_tokens for r in steps),
        "invalid_calls": 0,  # constrained by the tool's schema: valid by construction
    }


async def loop_client(client: Any, context: str, system: str, tools: list[Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": context},
    ]
    computed: list[int] = []
    prompt = calls = invalid = 0
    t0 = time.monotonic()
    for step in range(STEPS + 1):
        last = step == STEPS
        extra: dict[str, Any] = {} if last else {"tools": tools, "tool_choice": "required"}
        r = await client.chat.completions.create(
            model="bench", messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, **extra
        )
        u = r.usage
        cached = (u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details else 0
        computed.append(u.prompt_tokens - cached)
        prompt += u.prompt_tokens
        message = r.choices[0].message
        if last:
            break
        if not message.tool_calls:  # a call cut by max_tokens, or none parsed: ask again
            invalid += 1
            messages.append({"role": "assistant", "content": message.content or ""})
            continue
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            calls += 1
            try:  # what a careful client does with arguments that miss the schema
                key = json.loads(call.function.arguments)["key"]
                result = await lookup(key) if key in KEYS else f"error: unknown key {key!r}"
            except (ValueError, TypeError, KeyError):
                invalid += 1
                result = f'error: arguments must be {{"key": one of {list(KEYS)}}}'
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {
        "wall_s": time.monotonic() - t0,
        "steps": len(computed),
        "tool_calls": calls,
        "computed_per_step": computed,
        "prompt_tokens": prompt,
        "invalid_calls": invalid,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import openai
    from _collab_engines import Server
    from microagent.collab import Tool, agent_tool_plan
    from microagent.engine_bridge import VLLMBridge, resolve_model

    tool = Tool.from_function(lookup)
    plan = agent_tool_plan({tool.name: tool})
    system = plan.system_text()  # the same description on both sides
    tools_json = [t.describe() for t in plan.tools]  # what the client passes as `tools`
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    engine_args = {"num_gpu_blocks_override": args.blocks}
    bridge = VLLMBridge(
        "default",
        served_name="bench",
        max_num_seqs=8,
        max_model_len=4096,
        engine_args=engine_args,
        progress=False,
    )
    bridge.generations = []  # type: ignore[attr-defined]
    original = bridge.stream

    def recording(*a: Any, **k: Any) -> Any:
        gen = original(*a, **k)
        bridge.generations.append(gen)  # type: ignore[attr-defined]
        return gen

    bridge.stream = recording  # type: ignore[method-assign]
    model_dir = resolve_model("default", progress=False)
    server = Server(
        model_dir,
        args.port,
        prefix_caching=True,
        log=RESULTS / "tools_server.log",
        extra_args=[
            "--num-gpu-blocks-override",
            str(args.blocks),
            "--max-num-seqs",
            "8",
            "--enable-prompt-tokens-details",
            # vLLM's server needs a parser for tool_choice="required"; hermes is the
            # format both sides describe to the model
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--structured-outputs-config",
            json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        ],
    )
    runs: list[dict[str, Any]] = []
    try:
        await bridge.open()
        await asyncio.to_thread(server.wait_healthy)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for rep in range(args.reps):
            for load in args.loads:
                order = ["microagent", "client"] if rep % 2 == 0 else ["client", "microagent"]
                for system_name in order:
                    seed = 10_000 * rep + 100 * load
                    context = context_text(seed, args.words)
                    stop = asyncio.Event()
                    floods = [
                        asyncio.create_task(
                            flood_engine(bridge, stop, seed + 1000 * i)
                            if system_name == "microagent"
                            else flood_server(client, stop, seed + 1000 * i)
                        )
                        for i in range(load)
                    ]
                    before = os.getloadavg()[0]
                    if system_name == "microagent":
                        result = await loop_in_engine(bridge, context)
                    else:
                        result = await loop_client(client, context, system, tools_json)
                    stop.set()
                    await asyncio.gather(*floods)
                    result.update(system=system_name, load=load, rep=rep, loadavg_before=before)
                    runs.append(result)
                    print(
                        f"rep {rep} load {load} {system_name}: {result['wall_s']:.2f} s, "
                        f"{result['tool_calls']} calls, computed per step "
                        f"{result['computed_per_step']}",
                        flush=True,
                    )
    finally:
        await bridge.close()
        server.stop()
    return {
        "runs": runs,
        "settings": {
            "steps": STEPS,
            "tool_seconds": TOOL_SECONDS,
            "context_words": args.words,
            "kv_blocks": args.blocks,
            "loads": args.loads,
            "reps": args.reps,
        },
    }


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The tools page and headline, from ``tools.json`` (and ``tools_quick.json``)."""
    data = json.loads((results / "tools.json").read_text())
    rows = R.medians(data)
    loads = sorted({load for load, system in rows if system == "microagent"})
    pairs = [(rows[(n, "microagent")], rows[(n, "client")]) for n in loads if (n, "client") in rows]
    walls = [ours["wall_s"] / base["wall_s"] for ours, base in pairs]
    computed = [ours["computed_total"] / max(1.0, base["computed_total"]) for ours, base in pairs]
    parts = [("Results", R.tables(data) + "\n\n" + data_line("tools.json"))]
    quick = results / "tools_quick.json"
    if quick.exists():
        body = R.tables(json.loads(quick.read_text())) + "\n\n" + data_line("tools_quick.json")
        parts.append(("The `--quick` run", body))
    return FamilyReport(
        family="tools",
        title="An agent loop with tools",
        headline=Headline(
            figure="tool-loop wall time, microagent",
            value=f"{x(min(walls))}–{x(max(walls))} at background loads "
            + ", ".join(map(str, loads)),
            baseline="the same loop as openai-SDK code on vLLM's server (prefix caching)",
            target="none",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            "One agent, three tool calls and an answer, in process against the same loop as "
            "client code re-sending its history: microagent computes "
            f"{x(min(computed))}–{x(max(computed))} the client's prompt tokens."
        ),
        page=page("An agent loop with tools (`bench/tools.py`)", __doc__, parts),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="loads 0 and 2, 1 repetition")
    parser.add_argument("--loads", type=int, nargs="+", default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--blocks", type=int, default=40, help="KV cache blocks (128 tokens)")
    parser.add_argument("--words", type=int, default=900, help="context words (~2k tokens)")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args()
    args.loads = args.loads or ([0, 2] if args.quick else [0, 2, 4])
    args.reps = args.reps or (1 if args.quick else 3)
    load = os.getloadavg()[0]
    if load > 0.5 and not args.force:
        print(f"load average {load:.2f} > 0.5: not a quiet machine (--force to run anyway)")
        return 2
    RESULTS.mkdir(exist_ok=True)
    started = time.time()
    data = asyncio.run(main_async(args))
    data["machine"] = machine(load, bool(args.force and load > 0.5), started)
    name = "tools_quick" if args.quick else "tools"
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1))
    text = R.tables(data)
    print(text)
    if args.update and not args.quick:
        publish(HERE.parent, family_report())
    medians = R.medians(data)
    print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in medians.items()}, default=str)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
