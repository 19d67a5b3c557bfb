"""Agent programs as token-level traces, replayed on any engine bridge (real or simulated).

``bench/agents_sim.py`` calibrates the ScriptedEngine's step cost model against
the real engine, so both must run *the same trace*: the same arrivals, tool
waits and token counts, down to the block. Text would not do (the two
tokenizers differ, and the real model stops where it likes), so a program here
is token counts: a prefix shared by every program of the run (the system
prompt), its own task tokens, and after each turn but the last the tokens its
tool result appends. ``replay`` sends each turn as the previous turn's prompt
plus the ids the engine generated plus fresh unique ids, through
``bridge.handle`` and ``bridge.generate``, the same calls on every bridge. On the
real engine it records what the model generated; on the simulator a recorded
run's completion lengths are replayed exactly (``outputs``).

Policies (the systems a simulation compares, all in process):

* ``microagent``: each turn but the last retained until the tool returns
  (``Retain(next_use=<the tool's median>)``), programs served by arrival
  (``priority=<arrival number>``), released at the end;
* ``priority``: the same priorities, no retention (vLLM's priority scheduling
  with an LRU prefix cache: the strongest client);
* ``lru``: neither (first come, first served, LRU: vLLM's default server).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import _agents_programs as P
import anyio

POLICIES = ("microagent", "priority", "lru")
#: Token ids a trace draws from: ordinary vocabulary ids in SmolLM2 (specials sit below 100)
#: and in any ScriptedEngine (which accepts any id).
ID_RANGE = (1000, 40000)


@dataclass(frozen=True)
class TraceProgram:
    """One agent program as token counts and times.

    Attributes:
        pid: its id; seeds its token ids.
        index: its arrival number (0 first): its priority under ``microagent``/``priority``.
        arrival: seconds after the cell's start.
        task: its own initial tokens, after the run's shared prefix.
        results: tokens each tool result appends (one per turn but the last).
        tools: seconds each tool takes.
        max_tokens: tokens a turn may generate.
        next_use: the expected tool duration, seconds (the retention hint).
    """

    pid: str
    index: int
    arrival: float
    task: int
    results: tuple[int, ...]
    tools: tuple[float, ...]
    max_tokens: int
    next_use: float

    @property
    def turns(self) -> int:
        return len(self.results) + 1

    @property
    def tool_seconds(self) -> float:
        return sum(self.tools)


def from_program(p: P.Program, prefix: int) -> TraceProgram:
    """The trace of a drawn ``_agents_programs.Program``: its sizes, times and turns."""
    contexts = p.contexts()
    return TraceProgram(
        pid=p.pid,
        index=p.index,
        arrival=p.arrival,
        task=max(1, contexts[0] - prefix),
        results=tuple(t.tokens + P.TURN_OVERHEAD + 3 for t in p.tools),
        tools=tuple(t.seconds for t in p.tools),
        max_tokens=p.max_tokens,
        next_use=p.next_use,
    )


def shared_prefix(shape: P.Shape) -> int:
    """The tokens every program of ``shape`` shares: its system message."""
    return len(shape.system.split()) + 3 + P.TURN_OVERHEAD


def ids(seed: str, n: int) -> list[int]:
    """``n`` token ids drawn from ``seed`` (distinct seeds share no prefix)."""
    rng = random.Random(seed)
    lo, hi = ID_RANGE
    return [rng.randrange(lo, hi) for _ in range(n)]


def turn_record(
    ttft: float | None, latency: float, prompt: int, cached: int, out: int
) -> dict[str, Any]:
    """One turn's record in a cell's JSON (``bench/agents.py`` and ``bench/agents_sim.py``)."""
    return {
        "ttft_s": None if ttft is None else round(ttft, 4),
        "latency_s": round(latency, 4),
        "prompt": prompt,
        "cached": cached,
        "completion": out,
    }


async def replay(
    bridge: Any,
    p: TraceProgram,
    policy: str,
    prefix: Sequence[int],
    turns: list[dict[str, Any]],
    outputs: Sequence[int] | None = None,
) -> None:
    """Run ``p`` on ``bridge`` under ``policy``, appending each turn's record to ``turns``.

    ``outputs``: each turn's completion length to reproduce (the simulator
    replaying a recorded run: its script answers exactly that many tokens).
    """
    from microagent import Retain, Sampling

    key = f"agent/{p.pid}"
    prompt = [*prefix, *ids(f"{p.pid}/task", p.task)]
    try:
        for k in range(p.turns):
            last = k == p.turns - 1
            retain = None
            if policy == "microagent" and not last:
                retain = Retain(key, next_use=p.next_use, scope=key)
            priority = 0 if policy == "lru" else p.index
            wanted = p.max_tokens if outputs is None else outputs[k]
            first: list[float] = []
            start = anyio.current_time()

            def seen(delta: Any, first: list[float] = first) -> None:
                if not first and delta.token_ids:
                    first.append(anyio.current_time())

            result = await bridge.generate(
                bridge.handle(prompt),
                Sampling(max_tokens=max(1, wanted), temperature=0.0),
                retain=retain,
                priority=priority,
                on_delta=seen,
            )
            end = anyio.current_time()
            if result.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"turn {k} ended with {result.finish_reason}")
            turns.append(
                turn_record(
                    first[0] - start if first else None,
                    end - start,
                    result.prompt_tokens,
                    result.cached_tokens,
                    result.completion_tokens,
                )
            )
            if last:
                break
            await anyio.sleep(p.tools[k])
            prompt = [
                *prompt,
                *result.output_ids,
                *ids(f"{p.pid}/result{k}", p.results[k]),
            ]
    finally:
        if policy == "microagent":
            with anyio.CancelScope(shield=True):
                await bridge.release(key)


async def run_cell(
    bridge: Any,
    programs: Sequence[TraceProgram],
    policy: str,
    prefix: Sequence[int],
    timeout: float,
    outputs: dict[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Launch ``programs`` open-loop on ``bridge``: their records and the cell's span.

    Runs on any anyio backend: asyncio for the real engine, trio in virtual time
    for the simulator (``microagent.testing.run_virtual``).
    """
    records: list[dict[str, Any]] = []
    t0 = anyio.current_time()

    async def one(p: TraceProgram, record: dict[str, Any]) -> None:
        try:
            await anyio.sleep(max(0.0, t0 + p.arrival - anyio.current_time()))
            mine = None if outputs is None else outputs[p.pid]
            await replay(bridge, p, policy, prefix, record["turns"], mine)
            record["ok"] = True
        except Exception as exc:  # counted and reported, never hidden
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            record["finish_s"] = round(anyio.current_time() - t0, 4)

    for p in programs:
        records.append(
            {
                "pid": p.pid,
                "index": p.index,
                "arrival_s": round(p.arrival, 4),
                "tool_s": round(p.tool_seconds, 4),
                "turns_planned": p.turns,
                "turns": [],
                "ok": False,
            }
        )
    with anyio.move_on_after(timeout):
        async with anyio.create_task_group() as tg:
            for p, r in zip(programs, records, strict=True):
                tg.start_soon(one, p, r)
    for record in records:
        if not record["ok"] and "error" not in record:
            record["error"] = "timeout: cancelled at the cell's deadline"
    wall = anyio.current_time() - t0
    return {"programs": records, "wall_s": round(wall, 4)}
