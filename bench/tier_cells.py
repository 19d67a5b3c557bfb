"""Issue 38's long-wait and restart cells: what a session computes when it comes back.

Two cells, in process on ``VLLMBridge``, every system on its own engine with the same
device cache (``--device`` blocks of 128 tokens), one system at a time:

* **Long wait.** ``--sessions`` sessions of about ``--context`` tokens take their first
  turn, each retained with ``Retain(f"s{i}", next_use=<long>)`` as an agent that starts a
  long tool would. Then unrelated traffic, more blocks than the device cache and the
  host tier hold together (the cache turns over completely), runs while they wait.
  Then each session returns with a short tool result. Systems: ``no-tier`` (retention
  alone), ``tier-lru`` (a host tier of ``--host`` blocks under vLLM's stock policy:
  write-through, least recently used) and ``tier-sessions`` (the same tier under the
  sessions' policy). Target: a returning session computes at most its new tokens plus
  one block.
* **Restart.** The same sessions take three turns; after every session's first turn the
  EngineCore is killed (SIGKILL) and the bridge restarts it; the second and third turns
  follow. The same cell without the kill is the reference. The tier has a file tier of
  ``--disk`` blocks under a fresh ``MICROAGENT_HOME``. Target: after the restart, the
  sessions compute at most 1.1x what they compute without the kill.

Per returning turn: prompt, cached and computed tokens and the new tokens (the prompt
beyond the last turn's handle). Writes ``bench/results/tier_cells.json`` (with
``targets``) and, with ``--update``, its family page and headline row
(``bench/report.py``). Refuses to start when the 1-minute load average is 1 or
more (``--force``; the report says so).

Usage: ``.venv/bin/python bench/tier_cells.py [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
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
from embedding_loop import document, sized_documents, tool_result  # noqa: E402

RESULTS = HERE / "results"
BLOCK = 128  # vLLM's CPU block size
MAX_MODEL_LEN = 1536
LONG_WAIT = 600.0  # the sessions' announced next use: far beyond the cell
SYSTEMS = ("no-tier", "tier-lru", "tier-sessions")


def block_bytes() -> int:
    from agents import kv_bytes_per_token

    return kv_bytes_per_token() * BLOCK


def open_bridge(args: argparse.Namespace, system: str, home: Path | None = None) -> Any:
    from microagent.engine_bridge import VLLMBridge

    tier: dict[str, Any] = {}
    if system != "no-tier":
        tier = {
            "host_tier_bytes": args.host * block_bytes(),
            "tier_policy": "lru" if system == "tier-lru" else "sessions",
        }
    if home is not None:
        tier |= {"disk_tier_bytes": args.disk * block_bytes(), "home": home}
    return VLLMBridge(
        max_model_len=MAX_MODEL_LEN,
        engine_args={"num_gpu_blocks_override": args.device},
        progress=False,
        **tier,
    )


class Sessions:
    """The cell's sessions on one bridge: their handles, and a record per returning turn."""

    def __init__(self, bridge: Any, words: list[int], nonce: str, reply: int) -> None:
        from microagent.engine_bridge import Sampling

        self.bridge = bridge
        self.words, self.nonce = words, nonce
        self.sampling = Sampling(max_tokens=reply, temperature=0.0)
        self.handles: dict[int, Any] = {}
        self.turns: dict[int, int] = {}
        self.records: list[dict[str, Any]] = []

    async def first(self, i: int) -> None:
        bridge = self.bridge
        ctx = bridge.chat.context(
            [
                {"role": "system", "content": "You are a careful analyst."},
                {"role": "user", "content": document(i, self.nonce, self.words[i])},
            ]
        )
        await self._turn(i, bridge.chat.generation_prompt(ctx), record=False)

    async def again(self, i: int) -> None:
        bridge = self.bridge
        previous = self.handles[i]
        handle = bridge.chat.append(previous, "user", tool_result(i, self.turns[i]))
        await self._turn(i, bridge.chat.generation_prompt(handle), record=True)

    async def _turn(self, i: int, prompt: Any, *, record: bool) -> None:
        from microagent.engine_bridge import Retain

        start = time.monotonic()
        result = await self.bridge.generate(
            prompt, self.sampling, retain=Retain(f"s{i}", next_use=LONG_WAIT)
        )
        if record:
            previous = len(self.handles[i])
            self.records.append(
                {
                    "session": i,
                    "turn": self.turns[i],
                    "prompt": result.prompt_tokens,
                    "cached": result.cached_tokens,
                    "computed": result.prompt_tokens - result.cached_tokens,
                    "new": result.prompt_tokens - previous,
                    "seconds": round(time.monotonic() - start, 3),
                }
            )
        self.handles[i] = result.handle
        self.turns[i] = self.turns.get(i, 0) + 1


async def churn(bridge: Any, blocks: int, nonce: str) -> int:
    """Unrelated one-token requests, ``blocks`` blocks' worth of prompt; tokens sent."""
    from microagent.engine_bridge import Sampling

    sent, k = 0, 0
    while sent < blocks * BLOCK:
        ctx = bridge.chat.context([{"role": "user", "content": document(900 + k, nonce, 600)}])
        prompt = bridge.chat.generation_prompt(ctx)
        await bridge.generate(prompt, Sampling(max_tokens=1))
        sent += len(prompt)
        k += 1
    return sent


async def long_wait(args: argparse.Namespace, system: str, words: list[int]) -> dict[str, Any]:
    bridge = open_bridge(args, system)
    nonce = uuid.uuid4().hex[:8]
    async with bridge:
        s = Sessions(bridge, words, nonce, args.reply)
        for i in range(args.sessions):
            await s.first(i)
        churned = await churn(bridge, args.device + args.host + args.sessions * 2, nonce)
        for i in range(args.sessions):
            await s.again(i)
        tier = await bridge.tier_stats()
        await bridge.release(prefix="s")
    return {
        "system": system,
        "churn_tokens": churned,
        "turns": s.records,
        "tier_ram_bytes": tier.capacity_bytes,
        "tier_loaded_blocks": tier.loaded_blocks,
        "tier_held_evicted_blocks": tier.held_evicted_blocks,
    }


async def restart(args: argparse.Namespace, kill: bool, words: list[int]) -> dict[str, Any]:
    from microagent.engine_bridge import EngineDied, Sampling

    home = Path(tempfile.mkdtemp(prefix="tier-cells-"))
    bridge = open_bridge(args, "tier-sessions", home)
    nonce = uuid.uuid4().hex[:8]
    async with bridge:
        s = Sessions(bridge, words, nonce, args.reply)
        for i in range(args.sessions):
            await s.first(i)
        restart_s = None
        if kill:
            epoch, t = bridge.epoch, time.monotonic()
            for pid in bridge.engine_core_pids():
                os.kill(pid, signal.SIGKILL)
            while bridge.epoch == epoch:  # a request finds the engine dead and restarts it
                try:
                    await bridge.wait_ready(600)
                    probe = bridge.chat.generation_prompt(
                        bridge.chat.context([{"role": "user", "content": "Hi?"}])
                    )
                    await bridge.generate(probe, Sampling(max_tokens=1))
                except EngineDied:
                    await asyncio.sleep(0.5)
            restart_s = round(time.monotonic() - t, 1)
        for _ in range(2):
            for i in range(args.sessions):
                await s.again(i)
        tier = await bridge.tier_stats()
        await bridge.release(prefix="s")
    return {
        "kill": kill,
        "restart_s": restart_s,
        "turns": s.records,
        "tier_ram_bytes": tier.capacity_bytes,
        "disk_bytes": tier.disk_bytes,
        "disk_read_blocks": tier.disk_read_blocks,
    }


def totals(cell: dict[str, Any]) -> dict[str, int]:
    turns = cell["turns"]
    return {k: sum(t[k] for t in turns) for k in ("prompt", "cached", "computed", "new")}


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for cell in data["long_wait"]:
        worst = max((t["computed"] - t["new"] for t in cell["turns"]), default=0)
        out.append(
            {
                "name": f"long wait, {cell['system']}: each returning session computes <= its "
                "new tokens + 1 block",
                "measured": f"worst {worst} tokens beyond its new ones (a block is {BLOCK})",
                "met": worst <= BLOCK,
            }
        )
    kill = next(c for c in data["restart"] if c["kill"])
    calm = next(c for c in data["restart"] if not c["kill"])
    ratio = totals(kill)["computed"] / max(1, totals(calm)["computed"])
    out.append(
        {
            "name": "restart: computed after the restart <= 1.1x the same cell with no kill",
            "measured": f"{ratio:.2f}x ({totals(kill)['computed']} vs {totals(calm)['computed']})",
            "met": ratio <= 1.1,
        }
    )
    return out


def report(data: dict[str, Any]) -> str:
    cfg = data["config"]
    mb = cfg["block_bytes"] / 2**20
    lines = [
        f"Machine: {machine_sentence(data['machine'])}. {cfg['sessions']} sessions of about "
        f"{cfg['context']} tokens, replies of {cfg['reply']} tokens; a device cache of "
        f"{cfg['device']} blocks, a host tier of {cfg['host']} blocks "
        f"({cfg['host'] * mb:.0f} MiB), files of {cfg['disk']} blocks (restart cell).",
        "",
        "**Long wait** (each session's second turn, after unrelated traffic of "
        f"{data['long_wait'][0]['churn_tokens']} tokens):",
        "",
        "| system | tier RAM | prompt | cached | computed | new tokens | blocks loaded |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in data["long_wait"]:
        t = totals(cell)
        lines.append(
            f"| {cell['system']} | {cell['tier_ram_bytes'] / 2**20:.0f} MiB | {t['prompt']} | "
            f"{t['cached']} | {t['computed']} | {t['new']} | {cell['tier_loaded_blocks']} |"
        )
    lines += [
        "",
        "**Restart** (turns 2 and 3 of every session, `tier-sessions` with files):",
        "",
        "| EngineCore | restart | prompt | cached | computed | new tokens | file blocks read |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in data["restart"]:
        t = totals(cell)
        what = "killed after turn 1" if cell["kill"] else "not killed"
        took = f"{cell['restart_s']} s" if cell["restart_s"] is not None else "-"
        lines.append(
            f"| {what} | {took} | {t['prompt']} | {t['cached']} | {t['computed']} | "
            f"{t['new']} | {cell['disk_read_blocks']} |"
        )
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in data["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {t['met']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--context", type=int, default=900, help="tokens (about)")
    parser.add_argument("--reply", type=int, default=16)
    parser.add_argument("--device", type=int, default=16, help="device KV blocks")
    parser.add_argument("--host", type=int, default=40, help="host tier blocks")
    parser.add_argument("--disk", type=int, default=160, help="file tier blocks (restart)")
    parser.add_argument("--force", action="store_true", help="run on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    parser.add_argument("--report-only", action="store_true", help="tables from the existing JSON")
    args = parser.parse_args()
    if args.report_only:
        return show(json.loads((RESULTS / "tier_cells.json").read_text()), args.update)
    load = os.getloadavg()[0]
    if load >= 1 and not args.force:
        raise SystemExit(f"load average {load:.2f} >= 1: not a quiet machine (--force)")
    started = time.time()
    RESULTS.mkdir(exist_ok=True)
    sizing = argparse.Namespace(
        sessions=args.sessions, context=args.context, turns=3, reply=args.reply
    )
    words, _ = sized_documents(sizing)
    data: dict[str, Any] = {"config": {**vars(args), "block_bytes": block_bytes()}}
    data["long_wait"] = []
    for system in SYSTEMS:
        cell = asyncio.run(long_wait(args, system, words))
        print(system, totals(cell), flush=True)
        data["long_wait"].append(cell)
    data["restart"] = []
    for kill in (False, True):
        cell = asyncio.run(restart(args, kill, words))
        print("restart" if kill else "no restart", totals(cell), flush=True)
        data["restart"].append(cell)
    data["machine"] = machine(load, args.force, started)
    data["targets"] = targets(data)
    (RESULTS / "tier_cells.json").write_text(json.dumps(data, indent=2) + "\n")
    return show(data, args.update)


def show(data: dict[str, Any], update: bool) -> int:
    """Print the tables; with ``update``, rewrite the family page and headline row."""
    print(report(data))
    if update:
        publish(ROOT, family_report())
    return 0


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The tier-cells page and headline, from ``tier_cells.json`` in ``results``."""
    data = json.loads((results / "tier_cells.json").read_text())
    cells = {c["system"]: totals(c) for c in data["long_wait"]}
    ours, lru = cells["tier-sessions"]["computed"], cells["no-tier"]["computed"]
    met = [t for t in data["targets"] if t["met"]]
    return FamilyReport(
        family="tier_cells",
        title="Long waits and restarts with the KV tier",
        headline=Headline(
            figure="prompt tokens computed by sessions returning after a long wait, tier-sessions",
            value=f"{x(ours / max(1, lru))} ({ours} vs {lru})",
            baseline="no tier (retention alone, vLLM's LRU)",
            target=f"{len(met)}/{len(data['targets'])} met",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            "Sessions that come back after traffic has turned the device cache and the host "
            "tier over, and sessions whose EngineCore was killed between turns: what they "
            "compute under the sessions' tier policy, vLLM's LRU tier and no tier."
        ),
        page=page(
            "Long waits and restarts with the KV tier (`bench/tier_cells.py`)",
            __doc__,
            [("Results", report(data) + "\n" + data_line("tier_cells.json")), *_plain(results)],
        ),
    )


def _plain(results: Path) -> list[tuple[str, str]]:
    """``bench/tier_plain.py``'s overhead cell (the tier on, nothing to demote), when run."""
    path = results / "tier_plain.json"
    if not path.exists():
        return []
    import tier_plain

    data = json.loads(path.read_text())
    body = f"Machine: {machine_sentence(data['machine'])}.\n\n"
    body += tier_plain.report(data) + "\n" + data_line("tier_plain.json")
    return [("Nothing to demote: the tier's overhead (`bench/tier_plain.py`)", body)]


if __name__ == "__main__":
    raise SystemExit(main())
