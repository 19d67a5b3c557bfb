"""The soak's requests: the mix, each kind's body and expected answer, how they are sent.

``make_call(kind, i)`` builds the ``i``-th request of a kind (variants rotate
with ``i``); ``schedule`` deals the kinds in shuffled decks so that every stretch
of the run has the whole mix; ``drive`` sends them from concurrent clients and
tallies what each got. ``lookup`` is the server tool the soak's server loads
(``--tool lookup=_soak_requests:lookup``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_TOKENS = 8
#: a request that is meant to be cut (left mid-stream, timed out) asks for more
LONG_TOKENS = 96
#: room for one constrained tool call (``{"name": "lookup", "arguments": {...}}``)
TOOL_TOKENS = 40
CHOICES = ["yes", "no"]
WORDS = ["river", "lantern", "harbor", "copper", "meadow", "orbit", "cedar", "falcon", "ember"]
#: request kinds and their weights in every shuffled deck of the schedule
MIX: dict[str, int] = {
    "plain": 14,
    "plain_stream": 8,
    "vote": 6,
    "debate": 5,
    "reflect": 4,
    "aggregate": 4,
    "cascade": 4,
    "graph": 3,
    "best_of": 4,
    "compute": 3,
    "auto": 4,
    "collab_stream": 6,
    "disconnect": 8,
    "cancel": 6,
    "bad": 10,
    "server_tool": 4,
    "client_tool": 4,
}
#: the chaos run adds sessions (``prompt_cache_key``) to the mix
CHAOS_MIX: dict[str, int] = {**MIX, "session": 6}
#: words of the warm-up's long prompts, min and max (~60 to ~3 100 tokens of the default model)
FILL_WORDS = (60, 3000)
FILL_INDEX = 2_000_000
#: warm-up requests are numbered from here (their prompts differ from the run's)
WARMUP_INDEX = 1_000_000
MODES = (
    "vote",
    "debate",
    "reflect",
    "aggregate",
    "cascade",
    "graph",
    "best_of",
    "compute",
    "auto",
)


def lookup(key: Literal["alpha", "beta", "gamma"]) -> str:
    """The stock code stored under a key (the server tool of the soak)."""
    time.sleep(0.01)  # a sync tool: the server runs it in a worker thread
    return f"{key}: code {len(key) * 7}"


# -- the requests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One HTTP request of the soak and what it must get."""

    kind: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None  # a body that is not JSON
    path: str = "/v1/chat/completions"
    stream: bool = False
    leave_after: int | None = None  # data lines read before the client disconnects
    timeout: float | None = None  # a client timeout that cancels the request
    expect: int = 200
    variant: str = ""


def _question(i: int) -> list[dict[str, Any]]:
    word = WORDS[i % len(WORDS)]
    return [{"role": "user", "content": f"Case {i}: is a {word} older than a stone? Yes or no."}]


def _collab(mode: str, i: int, **extra: Any) -> dict[str, Any]:
    """A small collaboration of ``mode`` (2–3 agents, ``MAX_TOKENS`` per turn)."""
    agents: list[dict[str, Any]] | None
    collaboration: dict[str, Any] = {"mode": mode}
    if mode == "vote":
        agents = [{"name": "voter", "count": 3}]
        collaboration["answer"] = {"choices": CHOICES}
    elif mode == "debate":
        agents = [{"name": "debater", "count": 2}]
        collaboration["rounds"] = 1 + i % 2
    elif mode == "reflect":
        agents = None  # its own worker and critic
        collaboration["rounds"] = 1
    elif mode == "aggregate":
        agents = [{"name": "proposer", "count": 2}, {"name": "aggregator", "role": "aggregator"}]
    elif mode == "cascade":
        agents = None  # two drafters and a verifier (on the same engine here)
        collaboration["answer"] = {"choices": CHOICES}
    elif mode == "graph":
        agents = None
        collaboration.update(
            nodes=[
                {"name": "planner", "instructions": "Plan."},
                {"name": "coder", "instructions": "Answer.", "count": 2},
                {"name": "reviewer", "instructions": "Reply APPROVED or REJECTED.", "join": True},
            ],
            edges=[
                {"from": "planner", "to": "coder"},
                {"from": "coder", "to": "reviewer"},
                {
                    "from": "reviewer",
                    "to": "coder",
                    "when": {"not_contains": "APPROVED"},
                    "max_iterations": 1,
                },
            ],
            entry="planner",
            output="reviewer",
        )
    elif mode == "best_of":
        agents = [{"name": "candidate", "count": 3}]
        collaboration["judge"] = "self"
    elif mode == "compute":  # the sandboxed calculator (the soak's server has --calculator)
        agents = [{"name": "solver", "count": 2}]
    elif mode == "auto":
        agents = [{"name": "agent", "count": 3}]
        if i % 2:
            collaboration["answer"] = {"choices": CHOICES}
    else:
        raise ValueError(f"no soak request for mode {mode!r}")
    collaboration.update(extra.pop("collaboration", {}))
    question = (
        [{"role": "user", "content": f"Case {i}: what is {i % 97} + {i % 13 + 5}?"}]
        if mode == "compute"
        else _question(i)
    )
    body: dict[str, Any] = {
        "messages": question,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.7,
        "collaboration": collaboration,
        **extra,
    }
    if agents is not None:
        body["agents"] = agents
    return body


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
        },
    },
}

#: (name, body or raw bytes, path, expected status): each must be refused, the server unharmed
BAD_INPUTS: tuple[tuple[str, dict[str, Any] | bytes, str, int], ...] = (
    ("unknown mode", {"collaboration": {"mode": "telepathy"}}, "", 400),
    ("negative max_tokens", {"max_tokens": -1}, "", 400),
    ("no messages", {"messages": []}, "", 400),
    ("not JSON", b'{"messages": [', "", 400),
    ("unknown model", {"model": "no-such-model"}, "", 404),
    ("too many agents", {"agents": [{"name": "a", "count": 100_000}]}, "", 400),
    ("unknown server tool", {"collaboration": {"mode": "debate", "tools": ["nope"]}}, "", 400),
    ("refused parameter", {"logit_bias": {"1": 5}}, "", 400),
    ("n too large", {"n": 1000}, "", 400),
    ("rounds too many", {"collaboration": {"mode": "debate", "rounds": 10**6}}, "", 400),
    (
        "edge to an unknown node",
        {
            "collaboration": {
                "mode": "graph",
                "nodes": [{"name": "a", "instructions": "A."}],
                "edges": [{"from": "a", "to": "ghost"}],
                "entry": "a",
                "output": "a",
            }
        },
        "",
        400,
    ),
    ("unknown route", {}, "/v1/no-such-route", 404),
)


def make_call(kind: str, i: int, cancel_after: float) -> Call:
    """The ``i``-th request of ``kind`` (variants rotate with ``i``)."""
    plain: dict[str, Any] = {"messages": _question(i), "max_tokens": MAX_TOKENS}
    if kind == "plain":
        variants: list[tuple[str, dict[str, Any]]] = [
            ("plain", {}),
            ("n=2", {"n": 2, "temperature": 0.8}),
            ("logprobs", {"logprobs": True, "top_logprobs": 2}),
            ("json", {"response_format": {"type": "json_object"}, "max_tokens": 16}),
            ("stop", {"stop": [".", "\n"], "temperature": 1.0}),
        ]
        name, extra = variants[i % len(variants)]
        return Call(kind, {**plain, **extra}, variant=name)
    if kind == "plain_stream":
        options = {"include_usage": True} if i % 2 else None
        body = {**plain, "stream": True, "max_tokens": 16}
        if options:
            body["stream_options"] = options
        return Call(kind, body, stream=True)
    if kind in MODES:
        return Call(kind, _collab(kind, i), variant=kind)
    if kind == "collab_stream":
        mode = MODES[i % len(MODES)]
        return Call(kind, _collab(mode, i, stream=True), stream=True, variant=mode)
    if kind == "disconnect":
        if i % 2:
            body = {**plain, "stream": True, "max_tokens": LONG_TOKENS}
            return Call(kind, body, stream=True, leave_after=2, variant="completion")
        body = _collab("aggregate", i, stream=True, max_tokens=LONG_TOKENS)
        return Call(kind, body, stream=True, leave_after=3, variant="aggregate")
    if kind == "cancel":
        if i % 2:
            body = {**plain, "max_tokens": LONG_TOKENS}
            return Call(kind, body, timeout=cancel_after, variant="completion")
        body = _collab("debate", i, max_tokens=LONG_TOKENS, collaboration={"rounds": 2})
        return Call(kind, body, timeout=cancel_after, variant="debate")
    if kind == "bad":
        name, bad, path, status = BAD_INPUTS[i % len(BAD_INPUTS)]
        if isinstance(bad, bytes):
            return Call(kind, raw=bad, expect=status, variant=name)
        return Call(kind, {**plain, **bad}, path=path or Call.path, expect=status, variant=name)
    if kind == "server_tool":
        body = _collab(
            "debate",
            i,
            max_tokens=TOOL_TOKENS,
            collaboration={"rounds": 1, "tools": ["lookup"], "tool_choice": "required"},
        )
        return Call(kind, body, variant="lookup")
    if kind == "session":  # a two-turn session's first turn: retained for its next one
        key = f"session-{i // 2}"
        body = {**plain, "prompt_cache_key": key, "prompt_cache_options": {"ttl": "90s"}}
        return Call(kind, body, variant="prompt_cache_key")
    if kind == "client_tool":
        body = {**plain, "tools": [WEATHER], "tool_choice": "required", "max_tokens": TOOL_TOKENS}
        return Call(kind, body, variant="get_weather")
    raise ValueError(f"unknown request kind {kind!r}")


def fill_prompt(i: int) -> list[dict[str, Any]]:
    """A long prompt of its own (``i`` first: no two share a cached block), 60–3 000 words."""
    rng = random.Random(i)
    words = FILL_WORDS[0] + (i * 613) % (FILL_WORDS[1] - FILL_WORDS[0])
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return [{"role": "user", "content": f"Log {i}. {body}\nSummarize."}]


async def fill_cache(client: Any, tokens: int, concurrency: int = 2) -> int:
    """Prefill unique prompts of many lengths until ``tokens`` prompt tokens were computed.

    What the engine's processes hold after a step depends on the step's size: the
    CPU worker keeps per-shape kernels and its allocator's high-water mark of the
    largest activations (measured: prompts of lengths it has seen add nothing,
    new lengths add memory). Steps of many sizes, up to the scheduler's largest
    (long prompts, chunked), and every KV block written once, belong in the
    warm-up, not in the measured run.
    """
    done = n = 0

    async def one(i: int) -> int:
        body = {"messages": fill_prompt(FILL_INDEX + i), "max_tokens": 1}
        r = await client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["prompt_tokens"])

    while done < tokens:
        done += sum(await asyncio.gather(*(one(n + k) for k in range(concurrency))))
        n += concurrency
    return done


def schedule(count: int, seed: int, mix: dict[str, int] = MIX) -> list[str]:
    """``count`` request kinds: shuffled decks of ``mix`` (every kind in every deck)."""
    rng = random.Random(seed)
    deck = [kind for kind, weight in mix.items() for _ in range(weight)]
    out: list[str] = []
    while len(out) < count:
        rng.shuffle(deck)
        out.extend(deck)
    return out[:count]


# -- one request -----------------------------------------------------------------------------


@dataclass
class Tally:
    """What the requests got: outcomes per kind, unexpected answers, latencies."""

    by_kind: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    done: int = 0

    def add(self, call: Call, outcome: str, seconds: float, detail: str = "") -> None:
        self.by_kind[call.kind][outcome] += 1
        self.seconds[call.kind].append(seconds)
        self.done += 1
        if not _as_expected(call, outcome):
            self.unexpected.append(
                {
                    "kind": call.kind,
                    "variant": call.variant,
                    "expected": call.expect,
                    "got": outcome,
                    "detail": detail[:300],
                }
            )


def _as_expected(call: Call, outcome: str) -> bool:
    if call.leave_after is not None:
        return outcome in ("left", "200")  # a short stream may end before the client leaves
    if call.timeout is not None:
        return outcome in ("cancelled", "200")  # a fast one may beat the timeout
    return outcome == str(call.expect)


def _stream_outcome(lines: list[str]) -> tuple[str, str]:
    """``200`` for a stream that ended with ``[DONE]`` and no error event."""
    data = [line[6:] for line in lines if line.startswith("data: ")]
    if not data or data[-1] != "[DONE]":
        return "stream_cut", (data[-1] if data else "no data")[:300]
    for payload in data[:-1]:
        if payload.startswith('{"error"'):
            code = json.loads(payload)["error"].get("code") or "error"
            return f"stream_error:{code}", payload
    return "200", ""


async def send(client: Any, call: Call) -> tuple[str, str]:
    """Make ``call``; the outcome is a status code, ``left``, ``cancelled`` or a failure."""
    import httpx

    content = call.raw if call.raw is not None else json.dumps(call.body).encode()
    headers = {"content-type": "application/json"}
    try:
        if not call.stream:
            timeout = call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT
            r = await client.post(call.path, content=content, headers=headers, timeout=timeout)
            if r.status_code < 400:
                return str(r.status_code), ""
            hint = r.headers.get("retry-after")  # a 429/503 says when to come back
            return str(r.status_code), (f"retry-after={hint} " if hint else "") + r.text
        lines: list[str] = []
        async with client.stream("POST", call.path, content=content, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code), r.text
            async for line in r.aiter_lines():
                lines.append(line)
                data = sum(1 for x in lines if x.startswith("data: "))
                if call.leave_after is not None and data >= call.leave_after:
                    return "left", ""  # leaving the block closes the connection mid-stream
        return _stream_outcome(lines)
    except httpx.TimeoutException as exc:
        if call.timeout is not None:
            return "cancelled", ""
        return "client_timeout", repr(exc)
    except httpx.TransportError as exc:
        return "transport_error", repr(exc)


async def drive(
    client: Any, calls: list[Call], concurrency: int, on_done: Any = None
) -> tuple[Tally, float]:
    """Run ``calls`` from ``concurrency`` clients; ``on_done(tally)`` after each one."""
    tally = Tally()
    queue: asyncio.Queue[Call] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)

    async def worker() -> None:
        while not queue.empty():
            call = queue.get_nowait()
            t = time.monotonic()
            outcome, detail = await send(client, call)
            tally.add(call, outcome, time.monotonic() - t, detail)
            if on_done is not None:
                on_done(tally)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally, time.monotonic() - t0
