"""Agent programs under KV-cache pressure: microagent against client loops on vLLM's server.

Trace-driven: open-loop Poisson arrivals of multi-turn tool-using agent programs
(``bench/_agents_programs.py``: a BFCL-like and a SWE-agent-like shape), each turn
generating up to 32 tokens and followed by a real ``asyncio.sleep`` of the tool's
sampled duration, at several rates (programs/min). Paired: every system gets the
same arrival times, contexts, tool durations and tool-result texts. Systems, each
on its own engine with identical engine settings (``ENGINE``: max_model_len 8 192,
the model's context, and the same KV blocks), only one running at a time,
interleaved by repetition:

* ``microagent``: in process, ``microagent.VLLMBridge`` (``--engine scripted``: the
  ``ScriptedEngine``); each turn ``bridge.generate(prompt, retain=Retain(
  f"agent/{pid}", next_use=<the tool's median>, scope=f"agent/{pid}"),
  priority=<arrival number>)``, the next prompt the previous result's handle
  extended by the tool result (``bridge.chat``), released when the program ends;
* ``microagent-tier``: the same with a host KV tier of ``TIER_RATIO`` x the device
  blocks (``VLLMBridge(host_tier_bytes=...)``), driven by the sessions' events
  (``tier_policy="sessions"``); ``microagent-tier-lru``: that tier under vLLM's stock
  policy (write-through, least recently used; retention as without a tier);
* ``microagent-http``: ``microagent serve`` in a child process, an unmodified
  openai-SDK chat loop that re-sends the whole conversation each turn with
  ``prompt_cache_key=<program id>``;
* ``microagent-http-tier``: ``microagent-http`` with ``serve --kv-host-bytes`` (the
  tiered systems' host tier, the sessions' policy);
* ``microagent-http-nokey``: the same loop with no session field at all (plain
  turns: no tools, so no tool-call trigger either): the no-hint case;
* ``vllm``: the same loop (no session field) against
  ``python -m vllm.entrypoints.openai.api_server`` with prefix caching;
* ``vllm-priority``: the same with ``--scheduling-policy priority``, the client
  sending ``extra_body={"priority": <arrival number>}``;
* ``vllm-equal-ram``: ``vllm`` given device blocks equal to the tiered systems'
  device plus host blocks: what the tier adds beyond the same RAM as cache.

With ``--engine scripted`` the vLLM servers are skipped and the microagent servers
run ``--engine scripted``. Tool results go back as user messages in every system
(the same tokens everywhere; microagent's server requires tool messages to answer
an assistant tool call, and these loops make none).

**Cache pressure.** The KV cache is sized from the live working set estimated at
the shape's sizing rate (its highest rate; Little's law, ``working_set``): a
pressure of x means the cache holds 1/x of it (0.75x, 1.6x, 3x). vLLM needs room
for one max_model_len sequence (8 192 tokens + 1 block), so the cache never goes
below that floor; a clamped cell says so (its estimated pressure at its rate is in
the JSON and the tables), and a pressure whose cache comes out the same as another
one's is not run twice. (On a 2-core CPU the engine serves so few programs a
minute that the BFCL working set stays under the floor: only the SWE shape is
under real pressure there; a GPU run, with ``--prefill-rate``/``--decode-rate``
and ``--rates`` to match, puts both under it.)

**Grid.** Per shape, four rates r1 < r2 < r3 < r4 (``RATES``): the headline is
1.6x at r2, r3, r4 for every system; the pressure sweep is 0.75x, 1.6x, 3x at r4
for ``microagent`` and ``vllm``, which also run 1.6x at r1 (so both have four
rates); three repetitions. ``--rates``, ``--pressures`` or ``--systems`` replace
the grid by their product. ``--quick``: both shapes at a small scale (contexts
x0.3, half the turns, tools x0.25, 16 tokens a turn), 4 programs at two rates,
``microagent`` and ``vllm``, one repetition (~10 minutes on the CPU engine).

Per system, shape, pressure, rate and repetition (a *cell*), per program: arrival,
finish, tool time, and per turn the time to first token (streaming), prompt,
cached and generated tokens. ``bench/_agents_report.py`` computes program latency
with and without tool time (p50/p95/p99), programs/min, prompt tokens computed and
that as x the workload floor, later-turn TTFT p95, preemptions and queueing time
where the engine reports them, and the targets of issue 26.

Results go to ``bench/results/agents[_quick].json`` after every cell; a rerun skips
the cells already there (``--fresh`` starts over), so an interrupted run resumes.
Refuses to start when the 1-minute load average is above 0.5 (``--force``; the
tables say so). ``--plan`` prints the cells and an estimate of the run's length.

Usage: ``.venv/bin/python bench/agents.py [--quick] [--engine scripted] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _agents_programs as P  # noqa: E402
import _agents_report as R  # noqa: E402
from _agents_trace import turn_record  # noqa: E402
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
from _serve import free_port  # noqa: E402

RESULTS = HERE / "results"
IN_PROCESS = "microagent"
#: in process with the host KV tier: its session policy, and vLLM's stock LRU policy
TIERED = ("microagent-tier", "microagent-tier-lru")
MICROAGENT_HTTP = ("microagent-http", "microagent-http-nokey", "microagent-http-tier")
VLLM_SERVERS = ("vllm", "vllm-priority", "vllm-equal-ram")
SYSTEMS = (IN_PROCESS, *TIERED, *MICROAGENT_HTTP, *VLLM_SERVERS)
#: host-tier blocks per device block for the tiered systems; ``vllm-equal-ram`` gets
#: device blocks equal to their device plus host blocks (the same RAM, all of it device)
TIER_RATIO = 1.0
DEFAULT_SYSTEMS = (IN_PROCESS, "microagent-http", *VLLM_SERVERS)
#: Engine settings every system gets; ``max_model_len`` is the ceiling (SmolLM2-135M's own
#: context, 8 192): a run sizes it to the longest program its scaled shapes can make
#: (``engine_settings``), since vLLM's cache cannot go below one such sequence.
ENGINE: dict[str, int] = {"max_num_seqs": 16, "max_model_len": 8192, "max_num_batched_tokens": 2048}
#: Tokens above a shape's context cap that a sequence may take (chat template, the output).
MODEL_LEN_MARGIN = 128
#: The ScriptedEngine's timings (``--engine scripted``), seconds per token.
SCRIPTED_TIMING: dict[str, float] = {
    "prefill_time_per_token": 0.0002,
    "decode_time_per_token": 0.002,
}
SCRIPTED_BLOCK = 16
#: What the real engine does on this machine (CPU: prefill ~200 tokens/s, decode ~25 tokens/s
#: single stream), for the working-set estimate and ``--plan``; override with the flags.
PREFILL_RATE, DECODE_RATE = 200.0, 25.0
#: Seconds an engine takes to start (``--plan``'s estimate).
START_S = {"vllm": {"in-process": 40.0, "microagent": 50.0, "vllm": 110.0}}
PRESSURES = (0.75, 1.6, 3.0)
HEADLINE_PRESSURE = 1.6
#: Default rates per shape (programs/min), ascending: the highest sizes the cache and is
#: the pressure sweep's; the three highest are the headline grid; the lowest is the light
#: anchor of the latency-throughput curves (microagent and vllm only).
RATES = {"bfcl": (1.5, 3.0, 4.5, 6.0), "swe": (1.0, 2.0, 3.0, 4.0)}
QUICK_RATES = {"bfcl": (8.0, 16.0), "swe": (6.0, 12.0)}
#: Programs per cell: about ``WINDOW_MIN`` minutes of arrivals, at least ``MIN_PROGRAMS``.
WINDOW_MIN, MIN_PROGRAMS, QUICK_PROGRAMS = 2.0, 4, 4
QUICK_SCALE = P.Scale(context=0.3, turns=0.5, time=0.25, max_tokens=16)
#: The full run on a CPU engine (the platform's 128-token blocks): the shapes' turn counts
#: and tool distributions' form, contexts x0.3, tools x0.5, 16 tokens a turn, 6 programs a
#: cell, rates where the SWE shape's working set exceeds the cache at 1.6x. At the shapes'
#: own scale a SWE program takes 4-9 minutes on 2 cores once the engine is loaded, and
#: the grid would take ~7 hours (measured: two cells of 8 programs took 8 and 13 min).
CPU_SCALE = P.Scale(context=0.3, turns=1.0, time=0.5, max_tokens=16)
CPU_RATES = {"bfcl": (6.0, 9.0, 12.0, 16.0), "swe": (3.0, 4.5, 6.0, 8.0)}
CPU_PROGRAMS = 6


# -- the systems -----------------------------------------------------------------------------


def kv_bytes_per_token() -> int:
    """Bytes of K and V one token takes in the default model's cache (every layer)."""
    import microagent

    config = json.loads((Path(microagent.resolve_model("default")) / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    width = {"bfloat16": 2, "float16": 2, "float32": 4}[config.get("torch_dtype", "bfloat16")]
    return 2 * config["num_hidden_layers"] * heads * head_dim * width


class InProcess:
    """``microagent`` in process: one bridge, each turn retained until the tool returns.

    ``microagent-tier``: the same with a host KV tier of ``TIER_RATIO`` x the device
    blocks and its session policy; ``microagent-tier-lru``: that tier with vLLM's stock
    policy (write-through, least recently used), so what the tool events add shows.
    """

    def __init__(self, engine: str, blocks: int, settings: dict[str, int], name: str) -> None:
        self.engine, self.blocks, self.settings, self.name = engine, blocks, settings, name
        self.bridge: Any = None
        self.host_blocks = round(blocks * TIER_RATIO) if name in TIERED else 0

    async def open(self) -> None:
        if self.engine == "scripted":
            from microagent.testing import ScriptedEngine

            self.bridge = ScriptedEngine(
                num_blocks=self.blocks,
                block_size=SCRIPTED_BLOCK,
                max_num_seqs=self.settings["max_num_seqs"],
                history_limit=64,
                **SCRIPTED_TIMING,
            )
        else:
            from microagent import VLLMBridge

            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            tier: dict[str, Any] = {}
            if self.host_blocks:
                block_bytes = kv_bytes_per_token() * _engine_block()
                tier = {
                    "host_tier_bytes": self.host_blocks * block_bytes,
                    "tier_policy": "lru" if self.name == "microagent-tier-lru" else "sessions",
                }
            self.bridge = VLLMBridge(
                "default",
                max_num_seqs=self.settings["max_num_seqs"],
                max_model_len=self.settings["max_model_len"],
                max_num_batched_tokens=self.settings["max_num_batched_tokens"],
                engine_args={"num_gpu_blocks_override": self.blocks},
                progress=False,
                **tier,
            )
        await self.bridge.open()

    async def close(self) -> None:
        if self.bridge is not None:
            await self.bridge.close()

    async def program(self, p: P.Program, turns: list[dict[str, Any]]) -> None:
        """Run ``p`` to the end, appending each turn's record to ``turns``."""
        from microagent import Retain, Sampling

        bridge = self.bridge
        key = f"agent/{p.pid}"
        handle = bridge.chat.context(
            [{"role": "system", "content": p.system}, {"role": "user", "content": p.task}]
        )
        try:
            for k in range(p.turns):
                last = k == p.turns - 1
                retain = None if last else Retain(key, next_use=p.next_use, scope=key)
                first: list[float] = []
                start = time.monotonic()

                def seen(delta: Any, first: list[float] = first) -> None:
                    if not first and delta.token_ids:
                        first.append(time.monotonic())

                result = await bridge.generate(
                    bridge.chat.generation_prompt(handle),
                    Sampling(max_tokens=p.max_tokens, temperature=0.0),
                    retain=retain,
                    priority=p.index,
                    on_delta=seen,
                )
                end = time.monotonic()
                ttft = first[0] - start if first else None
                turns.append(
                    turn_record(
                        ttft,
                        end - start,
                        result.prompt_tokens,
                        result.cached_tokens,
                        result.completion_tokens,
                    )
                )
                if result.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"turn {k} ended with {result.finish_reason}")
                if last:
                    break
                tool = p.tools[k]
                await asyncio.sleep(tool.seconds)
                handle = bridge.chat.append(
                    bridge.chat.close_turn(result.handle), "user", tool.result
                )
        finally:
            with contextlib.suppress(Exception):
                await bridge.release(key)

    async def counters(self) -> dict[str, float | None]:
        stats = self.bridge.stats()
        out: dict[str, float | None] = {
            "preemptions": stats.preemptions,
            "queue_s": None,
            "retained_hit_tokens": stats.retained_hit_tokens,
            "recomputed_tokens": stats.recomputed_tokens,
        }
        if self.host_blocks and self.engine != "scripted":
            tier = await self.bridge.tier_stats()
            out |= {
                "tier_ram_bytes": tier.capacity_bytes,
                "tier_stored_blocks": tier.stored_blocks,
                "tier_loaded_blocks": tier.loaded_blocks,
                "tier_loaded_bytes": tier.loaded_bytes,
                "tier_evicted_blocks": tier.evicted_blocks,
                "tier_load_s": tier.load_seconds,
            }
        return out


class ChatLoop:
    """An unmodified openai-SDK agent loop: each turn re-sends the whole conversation.

    ``cache_key``: send ``prompt_cache_key=<program id>``; ``priority``: send
    ``extra_body={"priority": <arrival number>}`` (vLLM's priority scheduling).
    """

    def __init__(self, base_url: str, model: str, *, cache_key: bool, priority: bool) -> None:
        from openai import AsyncOpenAI

        self.model, self.cache_key, self.priority = model, cache_key, priority
        self.client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=3600)

    async def close(self) -> None:
        await self.client.close()

    async def program(self, p: P.Program, turns: list[dict[str, Any]]) -> None:
        messages: list[dict[str, str]] = [
            {"role": "system", "content": p.system},
            {"role": "user", "content": p.task},
        ]
        extra: dict[str, Any] = {}
        if self.cache_key:
            extra["prompt_cache_key"] = p.pid
        if self.priority:
            extra["extra_body"] = {"priority": p.index}
        for k in range(p.turns):
            start = time.monotonic()
            first: float | None = None
            parts: list[str] = []
            usage: Any = None
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=p.max_tokens,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                **extra,
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if first is None:
                        first = time.monotonic()
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
            end = time.monotonic()
            if usage is None:
                raise RuntimeError(f"turn {k}: the stream ended without usage")
            details = usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
            turns.append(
                turn_record(
                    None if first is None else first - start,
                    end - start,
                    usage.prompt_tokens,
                    cached,
                    usage.completion_tokens,
                )
            )
            if k == p.turns - 1:
                break
            tool = p.tools[k]
            await asyncio.sleep(tool.seconds)
            messages.append({"role": "assistant", "content": "".join(parts)})
            messages.append({"role": "user", "content": tool.result})


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A child in its own process group, its output in ``log`` (the child keeps the file)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd="/", env=env, start_new_session=True
        )


async def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            await asyncio.sleep(0.3)
    raise TimeoutError(f"server not healthy after {timeout} s; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server, then kill its whole process group (an EngineCore left behind)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


#: The ``microagent serve`` counters a cell reads (``/metrics``).
MICROAGENT_METRICS = (
    "microagent:engine_retained_hit_tokens_total",
    "microagent:engine_recomputed_tokens_total",
)
VLLM_METRICS = ("vllm:num_preemptions_total", "vllm:request_queue_time_seconds_sum")


class MicroagentHttp:
    """``microagent serve`` as a child process and a ``ChatLoop`` against it."""

    def __init__(
        self, name: str, engine: str, blocks: int, settings: dict[str, int], log: Path
    ) -> None:
        self.name, self.engine, self.blocks, self.log = name, engine, blocks, log
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.loop: ChatLoop | None = None

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "microagent", "serve", "--port", str(self.port)]
        if self.engine == "scripted":
            command += ["--engine", "scripted"]
            args = {"num_blocks": self.blocks, "max_num_seqs": self.settings["max_num_seqs"]}
            args |= SCRIPTED_TIMING
        else:
            command += [
                "--max-num-seqs", str(self.settings["max_num_seqs"]),
                "--max-model-len", str(self.settings["max_model_len"]),
                "--max-num-batched-tokens", str(self.settings["max_num_batched_tokens"]),
            ]  # fmt: skip
            args = {"num_gpu_blocks_override": self.blocks}
            if self.name == "microagent-http-tier":
                host = round(self.blocks * TIER_RATIO) * kv_bytes_per_token() * _engine_block()
                command += ["--kv-host-bytes", str(host)]
        for key, value in args.items():
            command += ["--engine-arg", f"{key}={value}"]
        return command

    async def open(self) -> None:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.proc = await asyncio.to_thread(_start, self.command(), self.log, env)
        await _wait_healthy(self.url, self.proc, self.log, 900.0)
        key = self.name != "microagent-http-nokey"
        self.loop = ChatLoop(f"{self.url}/v1", "default", cache_key=key, priority=False)

    async def close(self) -> None:
        if self.loop is not None:
            await self.loop.close()
        if self.proc is not None:
            await asyncio.to_thread(_stop, self.proc)

    async def program(self, p: P.Program, turns: list[dict[str, Any]]) -> None:
        assert self.loop is not None
        await self.loop.program(p, turns)

    async def counters(self) -> dict[str, float | None]:
        from microagent.testing import fetch_metrics

        m = await asyncio.to_thread(fetch_metrics, self.url, MICROAGENT_METRICS)
        return {
            "preemptions": None,
            "queue_s": None,
            "retained_hit_tokens": m["microagent:engine_retained_hit_tokens_total"],
            "recomputed_tokens": m["microagent:engine_recomputed_tokens_total"],
        }


class VllmHttp:
    """``vllm.entrypoints.openai.api_server`` (prefix caching on) and a ``ChatLoop``."""

    def __init__(self, name: str, blocks: int, settings: dict[str, int], log: Path) -> None:
        self.name, self.blocks, self.log, self.settings = name, blocks, log, settings
        self.server: Any = None
        self.loop: ChatLoop | None = None

    async def open(self) -> None:
        import microagent
        from _collab_engines import SERVED_NAME, Server

        priority = self.name == "vllm-priority"
        # the tiered systems' RAM (device + host blocks), all of it device
        blocks = self.blocks + round(self.blocks * TIER_RATIO) * (self.name == "vllm-equal-ram")
        extra = [
            "--max-num-seqs", str(self.settings["max_num_seqs"]),
            "--max-model-len", str(self.settings["max_model_len"]),
            "--max-num-batched-tokens", str(self.settings["max_num_batched_tokens"]),
            "--num-gpu-blocks-override", str(blocks),
            "--enable-prompt-tokens-details",
        ]  # fmt: skip
        if priority:
            extra += ["--scheduling-policy", "priority"]
        self.server = Server(
            microagent.resolve_model("default"),
            free_port(),
            prefix_caching=True,
            log=self.log,
            extra_args=extra,
        )
        await asyncio.to_thread(self.server.wait_healthy, 900.0)  # engines start together
        self.loop = ChatLoop(self.server.base_url, SERVED_NAME, cache_key=False, priority=priority)

    async def close(self) -> None:
        if self.loop is not None:
            await self.loop.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def program(self, p: P.Program, turns: list[dict[str, Any]]) -> None:
        assert self.loop is not None
        await self.loop.program(p, turns)

    async def counters(self) -> dict[str, float | None]:
        from microagent.testing import fetch_metrics

        url = f"http://127.0.0.1:{self.server.port}"
        m = await asyncio.to_thread(fetch_metrics, url, VLLM_METRICS)
        return {
            "preemptions": m["vllm:num_preemptions_total"],
            "queue_s": m["vllm:request_queue_time_seconds_sum"],
            "retained_hit_tokens": None,
            "recomputed_tokens": None,
        }


def make_system(name: str, engine: str, blocks: int, settings: dict[str, int], out: Path) -> Any:
    log = out / f"agents-{name}.log"
    if name == IN_PROCESS or name in TIERED:
        return InProcess(engine, blocks, settings, name)
    if name in MICROAGENT_HTTP:
        return MicroagentHttp(name, engine, blocks, settings, log)
    return VllmHttp(name, blocks, settings, log)


# -- one cell ----------------------------------------------------------------------------------


async def run_cell(system: Any, programs: Sequence[P.Program], timeout: float) -> dict[str, Any]:
    """Launch ``programs`` open-loop on ``system``; their records and the engine's counters."""
    before = await system.counters()
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()

    async def one(p: P.Program, record: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(max(0.0, t0 + p.arrival - time.monotonic()))
            await system.program(p, record["turns"])
            record["ok"] = True
        except asyncio.CancelledError:
            record["error"] = "timeout: cancelled at the cell's deadline"
            raise
        except Exception as exc:  # counted and reported, never hidden
            record["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"  {p.pid} failed: {record['error']}", flush=True)
        finally:
            record["finish_s"] = round(time.monotonic() - t0, 3)

    for p in programs:  # every program has a record, even one the deadline cut before it began
        records.append(
            {
                "pid": p.pid,
                "index": p.index,
                "arrival_s": round(p.arrival, 3),
                "tool_s": round(p.tool_seconds, 3),
                "turns_planned": p.turns,
                "turns": [],
                "ok": False,
            }
        )
    tasks = [asyncio.create_task(one(p, r)) for p, r in zip(programs, records, strict=True)]
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    wall = time.monotonic() - t0
    after = await system.counters()
    counters = {
        k: None if before[k] is None or after[k] is None else after[k] - before[k] for k in before
    }
    if "tier_ram_bytes" in after:  # a size, not a count
        counters["tier_ram_bytes"] = after["tier_ram_bytes"]
    return {"programs": records, "wall_s": round(wall, 3), **counters}


# -- the plan ------------------------------------------------------------------------------------


def cell_key(system: str, shape: str, pressure: float, rate: float, rep: int) -> str:
    return f"{system}|{shape}|{pressure:g}|{rate:g}|{rep}"


def grid(args: argparse.Namespace, shape: str) -> list[tuple[str, float, float]]:
    """(system, pressure, rate) of one shape: the user's product, or the default grid."""
    rates = (
        args.rates
        or (QUICK_RATES if args.quick else CPU_RATES if args.cpu_defaults else RATES)[shape]
    )
    rates = sorted(rates)
    if args.quick or args.rates or args.pressures or args.systems_given:
        pressures = args.pressures or [HEADLINE_PRESSURE]
        return [(s, pr, r) for pr in pressures for r in rates for s in args.systems]
    top = rates[-1]
    cells = {(s, HEADLINE_PRESSURE, r) for r in rates[1:] for s in args.systems}  # headline
    pair = [s for s in (IN_PROCESS, "vllm") if s in args.systems]
    cells |= {(s, pr, top) for pr in PRESSURES for s in pair}  # the pressure sweep
    cells |= {(s, HEADLINE_PRESSURE, rates[0]) for s in pair}  # the light anchor
    return sorted(cells, key=lambda c: (c[1], c[2], SYSTEMS.index(c[0])))


def count_for(args: argparse.Namespace, rate: float) -> int:
    if args.programs:
        return int(args.programs)
    if args.quick:
        return QUICK_PROGRAMS
    if args.cpu_defaults:
        return CPU_PROGRAMS
    return max(MIN_PROGRAMS, round(rate * WINDOW_MIN))


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One engine configuration per (shape, pressure): its KV blocks and its cells."""
    out = []
    for shape_name in args.shapes:
        shape = P.SHAPES[shape_name]
        cells = grid(args, shape_name)
        sizing = max(r for _, _, r in cells)
        ws = P.working_set(shape, args.scale, sizing, args.prefill_rate, args.decode_rate)
        floor = args.floor_blocks(ws)
        seen: dict[int, dict[str, Any]] = {}
        pressures = sorted({pr for _, pr, _ in cells}, key=lambda pr: pr != HEADLINE_PRESSURE)
        for pressure in pressures:
            blocks = P.kv_blocks(ws.tokens, pressure, args.block, floor)
            if blocks in seen:  # the floor made two pressures one cache: run it once
                same = seen[blocks]
                same["dropped_pressures"].append(pressure)
                print(
                    f"{shape_name}: {pressure:g}x gives the same {blocks} KV blocks as "
                    f"{same['pressure']:g}x (the floor): its cells are not run",
                    flush=True,
                )
                continue
            mine = [(s, r) for s, pr, r in cells if pr == pressure]
            seen[blocks] = config = {
                "shape": shape_name,
                "pressure": pressure,
                "blocks": blocks,
                "block_tokens": args.block,
                "floor_blocks": floor,
                "clamped": blocks == floor and ws.tokens / pressure < floor * args.block,
                "dropped_pressures": [],
                "sizing_rate": sizing,
                "working_set": asdict(ws),
                "cells": mine,
            }
            out.append(config)
    # the headline's real pressure first: an interrupted run has the cells that matter most
    return sorted(
        out, key=lambda c: (c["pressure"] != HEADLINE_PRESSURE, c["clamped"], c["blocks"])
    )


def estimate(args: argparse.Namespace, plan: list[dict[str, Any]], done: set[str]) -> float:
    """Seconds the pending part of ``plan`` should take (``--plan``; no queueing modelled).

    A cell takes its arrivals' span plus 1.5 programs' durations (compute at
    ``--prefill-rate``/``--decode-rate``, and tools); engines start (in parallel)
    whenever the KV size changes, as ``run_plan`` does.
    """
    starts = START_S.get(args.engine, {})
    total = 0.0
    blocks: int | None = None
    for config in plan:
        shape = P.SHAPES[config["shape"]]
        pending = 0.0
        for system, rate in config["cells"]:
            ws = P.working_set(shape, args.scale, rate, args.prefill_rate, args.decode_rate)
            span = count_for(args, rate) / rate * 60.0
            for rep in range(args.reps):
                if cell_key(system, config["shape"], config["pressure"], rate, rep) not in done:
                    pending += span + 1.5 * ws.duration_s + 5.0
        if not pending:
            continue
        total += pending
        if config["blocks"] != blocks:
            blocks = config["blocks"]
            kinds = {
                "in-process"
                if s == IN_PROCESS
                else "microagent"
                if s in MICROAGENT_HTTP
                else "vllm"
                for s, _ in config["cells"]
            }
            total += max((starts.get(k, 3.0) for k in kinds), default=0.0) * 1.3
    return total


# -- the run -----------------------------------------------------------------------------------


def fingerprint(args: argparse.Namespace) -> dict[str, Any]:
    """What makes cells comparable: a rerun with another fingerprint cannot resume."""
    return {
        "engine": args.engine,
        "scale": asdict(args.scale),
        "programs": args.programs,
        "quick": bool(args.quick),
        "block": args.block,
        "seed": args.seed,
        "engine_settings": args.engine_settings,
        "scripted_timing": SCRIPTED_TIMING if args.engine == "scripted" else None,
        "prefill_rate": args.prefill_rate,
        "decode_rate": args.decode_rate,
    }


def load_existing(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    if args.fresh or not path.exists():
        return {"cells": [], "sessions": []}
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("fingerprint") != fingerprint(args):
        raise SystemExit(
            f"{path} was made with other settings ({data.get('fingerprint')}); "
            "use --fresh to start over or --out for another folder"
        )
    return data


def save(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` (targets recomputed) atomically: an interrupted write loses nothing."""
    data["targets"] = R.targets(data)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


async def run_plan(
    args: argparse.Namespace, plan: list[dict[str, Any]], data: dict[str, Any], path: Path
) -> int:
    """Run every pending cell of ``plan``, saving after each; returns how many ran."""
    done = {c["key"] for c in data["cells"]}
    new = 0
    open_systems: dict[str, Any] = {}
    open_blocks: int | None = None
    try:
        for config in plan:
            shape = P.SHAPES[config["shape"]]
            pending = [
                (system, rate, rep)
                for rep in range(args.reps)
                for system, rate in config["cells"]
                if cell_key(system, shape.name, config["pressure"], rate, rep) not in done
            ]
            if not pending:
                continue
            needed = {s for s, _, _ in pending}
            if open_blocks != config["blocks"]:
                await _close_all(open_systems)
                open_blocks = config["blocks"]
            for name in list(open_systems):
                if name not in needed:
                    await _close_all({name: open_systems.pop(name)})
            starting = {
                n: make_system(n, args.engine, config["blocks"], args.engine_settings, args.out)
                for n in sorted(needed - set(open_systems), key=SYSTEMS.index)
            }
            t = time.monotonic()
            try:
                await asyncio.gather(*(s.open() for s in starting.values()))
            finally:
                open_systems.update(starting)  # closed by the finally below, started or not
            print(
                f"{shape.name} at {config['pressure']:g}x: {config['blocks']} KV blocks"
                f"{' (clamped to the floor)' if config['clamped'] else ''}; "
                f"started {', '.join(starting) or 'nothing'} in {time.monotonic() - t:.0f} s",
                flush=True,
            )
            if args.engine != "scripted":  # the double has no kernels or caches to warm
                for name in starting:
                    await _warm(open_systems[name], shape)
            rates = sorted({r for _, r, _ in pending})
            for rep in range(args.reps):
                for rate in rates:
                    names = [s for s, r, k in pending if r == rate and k == rep]
                    names.sort(key=SYSTEMS.index)
                    shift = rep % len(names) if names else 0
                    for name in names[shift:] + names[:shift]:  # rotated by repetition
                        cell = await _one_cell(args, open_systems[name], config, rate, rep)
                        data["cells"].append(cell)
                        done.add(cell["key"])
                        new += 1
                        save(path, data)
                        print(R.cell_line(cell), flush=True)
    finally:
        await _close_all(open_systems)
    return new


async def _close_all(systems: dict[str, Any]) -> None:
    for name in list(systems):
        with contextlib.suppress(Exception):
            await systems.pop(name).close()


async def _warm(system: Any, shape: P.Shape) -> None:
    """One short program first (kernels, allocator, tokenizer caches), not measured."""
    warm = P.draw_program(
        shape,
        P.Scale(context=0.05, turns=0.2, time=0.0, max_tokens=4),
        random.Random(f"warm/{system.name}"),
        f"warm-{system.name}",
        0,
        0.0,
    )
    with contextlib.suppress(Exception):
        await system.program(warm, [])


async def _one_cell(
    args: argparse.Namespace, system: Any, config: dict[str, Any], rate: float, rep: int
) -> dict[str, Any]:
    shape = P.SHAPES[config["shape"]]
    count = count_for(args, rate)
    programs = P.programs(shape, args.scale, rate, count, rep, args.seed)
    ws = P.working_set(shape, args.scale, rate, args.prefill_rate, args.decode_rate)
    span = programs[-1].arrival if programs else 0.0
    timeout = args.cell_timeout or span + max(300.0, 8.0 * ws.duration_s)
    load = os.getloadavg()[0]
    result = await run_cell(system, programs, timeout)
    cache_tokens = config["blocks"] * config["block_tokens"]
    return {
        "key": cell_key(system.name, shape.name, config["pressure"], rate, rep),
        "system": system.name,
        "shape": shape.name,
        "pressure": config["pressure"],
        "rate_per_min": rate,
        "rep": rep,
        "blocks": config["blocks"],
        "block_tokens": config["block_tokens"],
        "clamped": config["clamped"],
        "working_set_tokens": round(ws.tokens),
        "pressure_at_rate": round(ws.tokens / cache_tokens, 3),
        "loadavg_before": round(load, 2),
        "timeout_s": round(timeout, 1),
        **result,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny programs, 2 rates, 1 rep")
    parser.add_argument("--engine", choices=("vllm", "scripted"), default="vllm")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None)
    parser.add_argument("--shapes", nargs="+", choices=tuple(P.SHAPES), default=None)
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="programs/min")
    parser.add_argument("--pressures", type=float, nargs="+", default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--programs", type=int, default=None, help="programs per cell")
    parser.add_argument("--context-scale", type=float, default=None)
    parser.add_argument("--turn-scale", type=float, default=None)
    parser.add_argument("--time-scale", type=float, default=None, help="x tool durations")
    parser.add_argument("--max-tokens", type=int, default=None, help="per turn (32)")
    parser.add_argument("--prefill-rate", type=float, default=None, help="tokens/s (estimates)")
    parser.add_argument("--decode-rate", type=float, default=None, help="tokens/s (estimates)")
    parser.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell")
    parser.add_argument("--block", type=int, default=None, help="KV block tokens (the engine's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--fresh", action="store_true", help="ignore the existing JSON")
    parser.add_argument(
        "--stem",
        default=None,
        help="results name (default agents, agents_quick): a run of its own, its own section",
    )
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    parser.add_argument("--plan", action="store_true", help="print the cells and time; run none")
    parser.add_argument("--report-only", action="store_true", help="tables from the existing JSON")
    args = parser.parse_args(argv)
    scripted = args.engine == "scripted"
    args.systems_given = args.systems is not None
    if args.systems is None:  # the four (the no-hint loop: ``--systems``)
        args.systems = [IN_PROCESS, "vllm"] if args.quick else list(DEFAULT_SYSTEMS)
        if scripted:
            args.systems = [IN_PROCESS, "microagent-http", "microagent-http-nokey"]
    if scripted:
        tiered = (*TIERED, "microagent-http-tier")
        skipped = [s for s in args.systems if s in VLLM_SERVERS or s in tiered]
        if skipped:
            print(f"--engine scripted: skipping {', '.join(skipped)} (vLLM's server or tier)")
        args.systems = [s for s in args.systems if s not in skipped]
    args.shapes = args.shapes or list(P.SHAPES)
    args.reps = args.reps or (1 if args.quick else 3)
    # the full run's defaults on a CPU engine (``CPU_SCALE``); a GPU's are the shapes' own
    args.cpu_defaults = not args.quick and not scripted and _engine_block() == 128
    base = QUICK_SCALE if args.quick else CPU_SCALE if args.cpu_defaults else P.Scale()
    args.scale = P.Scale(
        context=args.context_scale or base.context,
        turns=args.turn_scale or base.turns,
        time=base.time if args.time_scale is None else args.time_scale,
        max_tokens=args.max_tokens or base.max_tokens,
    )
    if scripted:
        args.prefill_rate = args.prefill_rate or 1.0 / SCRIPTED_TIMING["prefill_time_per_token"]
        args.decode_rate = args.decode_rate or 1.0 / SCRIPTED_TIMING["decode_time_per_token"]
        args.block = SCRIPTED_BLOCK  # the ScriptedEngine's (its pool is sized in these)

        def scripted_floor(ws: P.WorkingSet) -> int:  # the longest prompt must fit the pool
            return math.ceil(1.25 * ws.max_context / SCRIPTED_BLOCK) + 2

        args.floor_blocks = scripted_floor
    else:
        args.prefill_rate = args.prefill_rate or PREFILL_RATE
        args.decode_rate = args.decode_rate or DECODE_RATE
        args.block = args.block or 0  # 0: the engine's, set in run() (asks vLLM's platform)

        def vllm_floor(ws: P.WorkingSet) -> int:  # one max_model_len sequence + the null block
            return math.ceil(args.engine_settings["max_model_len"] / args.block) + 2

        args.floor_blocks = vllm_floor
    args.stem = args.stem or ("agents_quick" if args.quick else "agents")
    args.engine_settings = engine_settings(args.scale)
    return args


def engine_settings(scale: P.Scale) -> dict[str, int]:
    """``ENGINE`` with ``max_model_len`` sized to the longest program any shape makes at
    ``scale`` (its context cap, one turn's output and ``MODEL_LEN_MARGIN``, rounded up to
    128 tokens), at most ``ENGINE``'s: the cache's floor is one such sequence, so a scaled
    run keeps real cache pressure instead of a floor sized for 8 192 tokens. (Every shape,
    not the run's: a run of one shape resumes into a run of both.)"""
    cap = max(round(shape.max_context * scale.context) for shape in P.SHAPES.values())
    need = math.ceil((cap + scale.max_tokens + MODEL_LEN_MARGIN) / 128) * 128
    return {**ENGINE, "max_model_len": min(ENGINE["max_model_len"], need)}


def _engine_block() -> int:
    """vLLM's KV block size here: 128 on CPU, 16 on a GPU (``VLLMBridge``'s rule)."""
    from microagent.engine_bridge.vllm import _compat as compat

    return 128 if compat.is_cpu_platform() else 16


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) the benchmark, write its JSON, tables and plot; the data."""
    if args.engine == "vllm" and not args.block and not args.report_only:
        args.block = _engine_block()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.stem}.json"
    if args.report_only:  # the targets as the report code now reads them
        data = json.loads(path.read_text())
        save(path, data)
    else:
        data = load_existing(path, args)
        plan = configs(args)
        done = {c["key"] for c in data["cells"]}
        eta = estimate(args, plan, done)
        pending = sum(
            1
            for c in plan
            for s, r in c["cells"]
            for k in range(args.reps)
            if cell_key(s, c["shape"], c["pressure"], r, k) not in done
        )
        print(f"{pending} cells to run (of {sum(len(c['cells']) for c in plan) * args.reps}); "
              f"estimated {eta / 60:.0f} min", flush=True)  # fmt: skip
        if args.plan:
            for c in plan:
                print(json.dumps({k: v for k, v in c.items() if k != "working_set"}))
            return data
        load = os.getloadavg()[0]
        started = time.time()
        data["fingerprint"] = fingerprint(args)
        before = data.get("settings", {})  # a resumed run may cover other shapes: keep theirs
        shapes = {**before.get("shapes", {}), **{s: asdict(P.SHAPES[s]) for s in args.shapes}}
        mine = [{k: v for k, v in c.items() if k != "cells"} for c in plan]
        kept = [
            c
            for c in before.get("configs", [])
            if (c["shape"], c["pressure"]) not in {(m["shape"], m["pressure"]) for m in mine}
        ]
        data["settings"] = {
            "engine": args.engine,
            "engine_settings": args.engine_settings,
            "scale": asdict(args.scale),
            "shapes": shapes,
            "systems": args.systems,
            "reps": max(args.reps, before.get("reps", 0)),
            "seed": args.seed,
            "prefill_rate": args.prefill_rate,
            "decode_rate": args.decode_rate,
            "scripted_timing": SCRIPTED_TIMING if args.engine == "scripted" else None,
            "configs": kept + mine,
        }
        if "machine" not in data:  # an interrupted run keeps a record of where it ran
            data["machine"] = machine(load, bool(args.force and load > 0.5), started)
        new = asyncio.run(run_plan(args, plan, data, path))
        session = machine(load, bool(args.force and load > 0.5), started)
        session["new_cells"] = new
        data["sessions"] = [*data.get("sessions", []), session]
        data["machine"] = session
        save(path, data)
    tables = R.tables(data)
    (args.out / f"{args.stem}_tables.md").write_text(tables)
    R.plot(data, args.out / f"{args.stem}.png")
    print(tables)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM as Ctrl-C: the run's finally closes the servers and engines it started (they
    # run in their own sessions, so a plain SIGTERM would leave them running)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = parse_args(argv)
    load = quiet_load(args.force or args.plan or args.report_only, 0.5)
    if load is None:
        return 2
    run(args)
    if args.update and not args.plan:
        publish(HERE.parent, family_report(args.out))
    return 0


#: The runs the family page shows, in this order (those present in the results folder).
RUNS = (
    ("agents", "Agent programs at 1.6x, 3x and 0.75x cache pressure"),
    ("agents_tier", "With a host KV tier (`--stem agents_tier`)"),
    ("agents_quick", "The `--quick` run"),
    ("agents_full_scale_partial", "A partial run at full scale"),
)
#: The headline: programs/min at equal p95 against the stronger of vLLM's two servers.
HEADLINE_TARGET = "microagent: >= 2x programs/min at equal p95 vs vllm-priority"


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The agents page (every run and the simulation) and its headline, from the JSON."""
    import agents_sim

    parts = []
    for stem, heading in RUNS:
        if not (results / f"{stem}.json").exists():
            continue
        run = json.loads((results / f"{stem}.json").read_text())
        plot = f"![latency against throughput]({RESULTS_LINK}/{stem}.png)\n"
        parts.append((heading, R.tables(run) + "\n" + plot + "\n" + data_line(f"{stem}.json")))
    sim = results / agents_sim.RESULTS_FILE.name
    if sim.exists():
        body = agents_sim.tables(agents_sim.read_results(sim)) + "\n" + data_line(sim.name)
        parts.append(("Past this machine, by simulation (`bench/agents_sim.py`)", body))
    data = json.loads((results / "agents.json").read_text())
    target = next(t for t in data["targets"] if t["target"] == HEADLINE_TARGET)
    met = sum(bool(t["met"]) for t in data["targets"])
    return FamilyReport(
        family="agents",
        title="Agent programs under KV-cache pressure",
        headline=Headline(
            figure="programs/min at vLLM's p95, 1.6x cache pressure (worst shape)",
            value=f"{target['measured']:.2f}×",
            baseline="openai-SDK loops on vLLM's server, priority scheduling",
            target=">= 2×: " + ("met" if target["met"] else "not met"),
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=(
            "Multi-turn tool-using agent programs (BFCL- and SWE-shaped), open-loop arrivals "
            "on a cache smaller than their working set, paired across microagent (in process, "
            f"over HTTP, with a host tier) and vLLM's server: {target['text']}; {met}/"
            f"{len(data['targets'])} targets met. The page also holds the simulator's "
            "calibration and its projection to a GPU (`bench/agents_sim.py`)."
        ),
        page=page("Agent programs under KV-cache pressure (`bench/agents.py`)", __doc__, parts),
    )


if __name__ == "__main__":
    sys.exit(main())
