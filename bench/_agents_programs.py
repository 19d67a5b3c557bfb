"""The agent programs of ``bench/agents.py``: two trace shapes, their arrivals and sizes.

A *program* is one multi-turn tool-using agent: a system prompt (common to
every program of its shape), a task message (unique per program), then turns
of *generate, call a tool, read its result*. Everything a program does is
drawn up front from seeded generators, so every system under test gets the
same arrival times, contexts, tool durations and tool-result texts (paired
measurements). Texts are synthetic words, every word one token in both
SmolLM2's tokenizer and the ScriptedEngine's, so a text of *n* words is about
*n* tokens and the sizes below hold on both engines; each program's task text
starts with its own id, so programs share no prefix beyond the system prompt.

The two shapes (``SHAPES``) and where their numbers come from:

* ``bfcl`` (BFCL-like): the multi-turn category of the Berkeley
  Function-Calling Leaderboard (BFCL v3, Patil et al., gorilla.cs.berkeley.edu):
  an initial context of function documentation plus a user request (~1 k
  tokens), about 6 model turns, each followed by a function call whose result
  is a short JSON-ish text (50-300 tokens). Tool durations are those of remote
  API calls as issue 26 models them: lognormal, median ~1 s, p95 ~5 s.
* ``swe`` (SWE-agent-like): SWE-agent trajectories (Yang et al. 2024,
  "SWE-agent: Agent-Computer Interfaces Enable Automated Software
  Engineering"): a 1.5-2 k-token instance prompt (the interface's
  documentation and the issue text), 8-11 turns of shell and editor commands
  whose observations are windows of files or command output (100-400 tokens),
  the context growing to at most ~6 k tokens (SWE-agent truncates
  observations; here the cap also keeps every prompt inside SmolLM2-135M's 8 192
  tokens). Tool durations (commands, test runs) as issue 26 models them:
  lognormal, median ~3 s, p95 ~20 s.

Tool durations are capped at ``TOOL_CAP`` x the shape's p95 (2x: 10 s for BFCL,
40 s for SWE), which bounds a cell's length and leaves the tail that matters.
Every turn generates up to ``Scale.max_tokens`` tokens (32 by default). The
``Scale`` knobs shrink contexts, turns and tool durations for quick runs.

``working_set`` estimates the live KV working set at an arrival rate (Little's
law on token-seconds: the arrival rate times the expected tokens x seconds a
program keeps its context live), which ``bench/agents.py`` sizes the KV cache
from.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass

#: Words that are one token each (a leading space included) in SmolLM2's tokenizer
#: (checked) and in the ScriptedEngine's toy tokenizer (every word is one token there).
WORDS: tuple[str, ...] = (
    "river", "mountain", "lantern", "harbor", "copper", "meadow", "orbit", "signal", "cedar",
    "quartz", "falcon", "glacier", "prairie", "beacon", "willow", "canyon", "marble", "comet",
    "file", "line", "test", "error", "value", "function", "class", "module", "return", "import",
    "patch", "diff", "build", "check", "result", "output", "input", "query", "table", "index",
    "cache", "token", "block", "agent", "tool", "call", "search", "open", "read", "write",
    "edit", "run", "list", "path", "string", "number", "array", "object", "field", "type",
    "name", "data", "user", "model", "system", "server", "client", "request", "response",
    "status", "code", "message", "apple", "bread", "chair", "door", "engine", "forest",
    "garden", "house", "island", "jacket", "kitchen", "letter", "market", "needle", "ocean",
    "pencil", "rabbit", "summer", "tiger", "window", "yellow", "bridge", "castle", "desert",
    "energy", "flower", "guitar", "hammer", "iron", "jungle", "ladder", "mirror", "planet",
    "rocket", "silver", "travel", "valley", "winter", "bottle", "camera", "doctor", "farmer",
    "grass", "honey", "metal", "paper", "stone", "sugar", "train", "water", "wheel", "wood",
    "cloud", "dream", "light", "night", "sound", "storm",
)  # fmt: skip
#: Tokens a chat turn adds around its content (ChatML's open and close).
TURN_OVERHEAD = 6
#: z of the 95th percentile of a standard normal (lognormal p95 = median * exp(z * sigma)).
Z95 = 1.6448536269514722
#: Tool durations are capped at this many times their p95 (keeps a cell's length bounded).
TOOL_CAP = 2.0


@dataclass(frozen=True)
class Shape:
    """One trace shape: the sizes and tool durations its programs are drawn from.

    Attributes:
        name: its key (``bfcl``, ``swe``).
        title: a short human name.
        system: the system prompt every program of the shape shares.
        turns: model turns per program, inclusive range.
        initial_tokens: the task message's tokens, inclusive range.
        result_tokens: a tool result's tokens, inclusive range.
        max_context: tokens a program's context may reach (results are truncated to stay under).
        tool_median_s: the tool durations' median, seconds.
        tool_p95_s: their 95th percentile, seconds.
    """

    name: str
    title: str
    system: str
    turns: tuple[int, int]
    initial_tokens: tuple[int, int]
    result_tokens: tuple[int, int]
    max_context: int
    tool_median_s: float
    tool_p95_s: float

    @property
    def sigma(self) -> float:
        """The lognormal's sigma: p95 = median * exp(Z95 * sigma)."""
        return math.log(self.tool_p95_s / self.tool_median_s) / Z95


SHAPES: dict[str, Shape] = {
    "bfcl": Shape(
        name="bfcl",
        title="BFCL-like (function calling)",
        system=(
            "You are a function calling agent. Read the task and the function results, "
            "then say which function to call next and with which arguments. Be brief."
        ),
        turns=(5, 7),
        initial_tokens=(900, 1100),
        result_tokens=(50, 300),
        max_context=4000,
        tool_median_s=1.0,
        tool_p95_s=5.0,
    ),
    "swe": Shape(
        name="swe",
        title="SWE-agent-like (software engineering)",
        system=(
            "You are a software engineering agent working in a repository. Read the issue "
            "and each command output, then give the next shell or editor command. Be brief."
        ),
        turns=(8, 11),
        initial_tokens=(1500, 2000),
        result_tokens=(100, 400),
        max_context=6000,
        tool_median_s=3.0,
        tool_p95_s=20.0,
    ),
}


@dataclass(frozen=True)
class Scale:
    """Knobs that shrink a shape for quick runs (1.0: the shape as specified).

    Attributes:
        context: multiplies the task, tool-result and context-cap tokens.
        turns: multiplies the turn range (at least 2 turns).
        time: multiplies tool durations (``--time-scale``).
        max_tokens: tokens each turn generates at most.
    """

    context: float = 1.0
    turns: float = 1.0
    time: float = 1.0
    max_tokens: int = 32


@dataclass(frozen=True)
class ToolCall:
    """What follows a model turn: a tool that runs ``seconds`` and returns ``result``."""

    seconds: float
    result: str
    tokens: int


@dataclass(frozen=True)
class Program:
    """One agent program, fully drawn: the same for every system.

    Attributes:
        pid: its id, unique in the whole benchmark (``bfcl-r3-k0-p004``).
        index: its arrival number in its run (0 first): its priority.
        arrival: seconds after the run's start at which it arrives.
        system: the shape's system prompt.
        task: the first user message (starts with the program's id: no shared prefix).
        task_tokens: about how many tokens ``task`` is.
        tools: one tool call after each model turn but the last.
        max_tokens: tokens each turn generates at most.
        next_use: the expected tool duration (the shape's median, scaled), seconds.
    """

    pid: str
    index: int
    arrival: float
    system: str
    task: str
    task_tokens: int
    tools: tuple[ToolCall, ...]
    max_tokens: int
    next_use: float

    @property
    def turns(self) -> int:
        return len(self.tools) + 1

    @property
    def tool_seconds(self) -> float:
        return sum(t.seconds for t in self.tools)

    def contexts(self) -> list[int]:
        """About how many prompt tokens each turn's request has (template included)."""
        system = len(self.system.split()) + 3 + TURN_OVERHEAD
        ctx = system + self.task_tokens + TURN_OVERHEAD + 3
        out = [ctx]
        for tool in self.tools:
            ctx += self.max_tokens + TURN_OVERHEAD + tool.tokens + 3
            out.append(ctx)
        return out


def words(rng: random.Random, tokens: int) -> tuple[str, int]:
    """Synthetic text of about ``tokens`` tokens (sentences of 8-14 words); its token count."""
    out: list[str] = []
    count = 0
    while count < tokens:
        n = min(rng.randint(8, 14), max(1, tokens - count - 1))
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)) + ".")
        count += n + 1  # the words and the full stop
    return " ".join(out), count


def tool_seconds(rng: random.Random, shape: Shape, scale: Scale) -> float:
    """One tool duration: lognormal(median, p95) capped at ``TOOL_CAP`` x p95, scaled."""
    raw = rng.lognormvariate(math.log(shape.tool_median_s), shape.sigma)
    return min(raw, TOOL_CAP * shape.tool_p95_s) * scale.time


def arrivals(rate_per_min: float, count: int, rng: random.Random) -> list[float]:
    """Poisson arrival times (seconds) of ``count`` programs at ``rate_per_min``."""
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate_per_min / 60.0)
        out.append(t)
    return out


def _scaled(pair: tuple[int, int], factor: float, least: int) -> tuple[int, int]:
    return max(least, round(pair[0] * factor)), max(least, round(pair[1] * factor))


def draw_program(
    shape: Shape, scale: Scale, rng: random.Random, pid: str, index: int, arrival: float
) -> Program:
    """One program of ``shape`` drawn from ``rng`` (its texts, turns and tool calls)."""
    lo, hi = shape.turns
    turns = rng.randint(max(2, round(lo * scale.turns)), max(2, round(hi * scale.turns)))
    initial = rng.randint(*_scaled(shape.initial_tokens, scale.context, 16))
    body, task_tokens = words(rng, initial)
    task = f"Task {pid}: {body}"
    task_tokens += 8  # the header
    cap = round(shape.max_context * scale.context)
    low, high = _scaled(shape.result_tokens, scale.context, 8)
    calls: list[ToolCall] = []
    ctx = task_tokens + len(shape.system.split()) + 4 * TURN_OVERHEAD
    for k in range(turns - 1):
        ctx += scale.max_tokens + TURN_OVERHEAD
        want = rng.randint(low, high)
        room = cap - ctx - scale.max_tokens - TURN_OVERHEAD - 4
        size = max(8, min(want, room))  # an observation is truncated to fit the cap
        seconds = tool_seconds(rng, shape, scale)
        text, n = words(rng, size)
        result = f"Result {k + 1}: {text}"
        calls.append(ToolCall(seconds, result, n + 3))
        ctx += n + 3 + TURN_OVERHEAD
    return Program(
        pid=pid,
        index=index,
        arrival=arrival,
        system=shape.system,
        task=task,
        task_tokens=task_tokens,
        tools=tuple(calls),
        max_tokens=scale.max_tokens,
        next_use=shape.tool_median_s * scale.time,
    )


def run_id(shape: str, rate: float, rep: int) -> str:
    """The id prefix of one run's programs (also its seed material)."""
    return f"{shape}-r{rate:g}-k{rep}"


def programs(
    shape: Shape, scale: Scale, rate_per_min: float, count: int, rep: int, seed: int
) -> list[Program]:
    """The programs of one run: ``count`` Poisson arrivals at ``rate_per_min``, paired across
    systems (the same seed, shape, rate and repetition give the same programs)."""
    run = run_id(shape.name, rate_per_min, rep)
    times = arrivals(rate_per_min, count, random.Random(f"{seed}/{run}/arrivals"))
    return [
        draw_program(shape, scale, random.Random(f"{seed}/{run}/{i}"), f"{run}-p{i:03d}", i, at)
        for i, at in enumerate(times)
    ]


@dataclass(frozen=True)
class WorkingSet:
    """The estimated live KV working set of a shape at an arrival rate.

    Attributes:
        tokens: time-average live context tokens (concurrency x mean context).
        concurrency: programs live at once (Little's law: rate x mean duration).
        duration_s: a program's expected duration without queueing (compute + tools).
        context: the time-weighted mean context of a live program, tokens.
        max_context: the largest context of the sampled programs, tokens (+ one turn's output).
    """

    tokens: float
    concurrency: float
    duration_s: float
    context: float
    max_context: int


@functools.lru_cache(maxsize=256)
def working_set(
    shape: Shape,
    scale: Scale,
    rate_per_min: float,
    prefill_rate: float,
    decode_rate: float,
    samples: int = 200,
) -> WorkingSet:
    """``WorkingSet`` at ``rate_per_min``, from ``samples`` programs drawn with a fixed seed.

    A program keeps its context (prompt + output) live from its turn's start until
    its next turn: the turn's compute (new prompt tokens / ``prefill_rate`` +
    ``max_tokens`` / ``decode_rate``, no queueing) and the tool that follows. The
    time-average live tokens are the arrival rate times the expected tokens x seconds
    per program (Little's law), i.e. concurrency x time-weighted mean context.
    """
    token_seconds, durations, peak = [], [], 0
    for i in range(samples):
        p = draw_program(shape, scale, random.Random(f"ws/{shape.name}/{i}"), "ws", i, 0.0)
        ctxs = p.contexts()
        seconds = [t.seconds for t in p.tools] + [0.0]
        previous = 0
        ts = total = 0.0
        for ctx, tool in zip(ctxs, seconds, strict=True):
            compute = (ctx - previous) / prefill_rate + p.max_tokens / decode_rate
            live = ctx + p.max_tokens
            ts += live * (compute + tool)
            total += compute + tool
            previous = live
        token_seconds.append(ts)
        durations.append(total)
        peak = max(peak, ctxs[-1] + p.max_tokens)
    duration = statistics.fmean(durations)
    concurrency = rate_per_min / 60.0 * duration
    tokens = rate_per_min / 60.0 * statistics.fmean(token_seconds)
    return WorkingSet(tokens, concurrency, duration, tokens / concurrency, peak)


def kv_blocks(tokens: float, pressure: float, block: int, floor: int) -> int:
    """Blocks of a cache that holds ``1/pressure`` of ``tokens`` (at least ``floor``)."""
    return max(floor, math.ceil(tokens / pressure / block))
