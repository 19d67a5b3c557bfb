"""Client-side orchestration: every role is its own OpenAI-SDK call, outputs go back as text.

This is what a LangGraph/AutoGen user writes against ``vllm serve``: the
shared context travels in every request and is re-tokenized by the server,
the roles' outputs are pasted into the next prompts as text, and a vote
cannot stop a generation half-way (a client may only stop waiting, and a
LangGraph fan-out waits for every branch), so every voter runs to the end.
Same prompts, ``max_tokens`` and sampling as microagent's modes.

Runs in the main virtual environment and in the peers' one (openai only).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import _collab_prompts as P
from _collab_tasks import extract_choice, majority
from _load_accounting import RequestRecord


@dataclass
class Caller:
    """One OpenAI-SDK client and the timings of every request it made."""

    client: Any
    model: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    #: extra request fields every call sends (a subclass asks for more)
    extra_body: ClassVar[dict[str, Any]] = {}

    async def call(
        self,
        messages: list[P.Message],
        *,
        max_tokens: int,
        temperature: float,
        choices: list[str] | None = None,
    ) -> str:
        """One chat completion (choice-constrained like microagent's answer steps when asked)."""
        extra: dict[str, Any] = dict(self.extra_body)
        if choices:
            extra["structured_outputs"] = {"choice": choices}
        t0 = time.monotonic()
        resp = await self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0,
            extra_body=extra or None,
        )
        self.record(resp, t0, time.monotonic())
        return str(resp.choices[0].message.content or "")

    def record(self, resp: Any, submitted: float, finished: float) -> None:
        """Keep one response's timings and token counts."""
        usage = resp.usage
        self.requests.append(
            {
                "submitted": submitted,
                "first_token": None,
                "finished": finished,
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "completion_tokens": usage.completion_tokens if usage else 0,
            }
        )


Call = Callable[..., Awaitable[str]]


@dataclass
class RecordingCaller(Caller):
    """``Caller`` that also keeps each request's token ids and cached prompt tokens
    (vLLM's ``return_token_ids``; the server needs ``--enable-prompt-tokens-details``)."""

    extra_body: ClassVar[dict[str, Any]] = {"return_token_ids": True}
    records: list[RequestRecord] = field(default_factory=list)

    def record(self, resp: Any, submitted: float, finished: float) -> None:
        super().record(resp, submitted, finished)
        body = resp.model_dump()
        details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
        self.records.append(
            RequestRecord(
                submitted=submitted,
                finished=finished,
                prompt=tuple(body.get("prompt_token_ids") or ()),
                output=tuple(body["choices"][0].get("token_ids") or ()),
                cached=int(details.get("cached_tokens") or 0),
            )
        )


async def vote(
    call: Call, ctx: str, n: int, choices: list[str], style: str, cfg: dict[str, Any]
) -> dict[str, Any]:
    """n voters, every one to the end, then the majority (microagent's tie rule)."""
    instr = P.vote_instructions(choices, style)
    base = [*P.context(ctx), P.user(instr)]

    async def one() -> str:
        if style == "direct":
            return await call(
                base,
                max_tokens=cfg["answer_tokens"],
                temperature=cfg["temperature"],
                choices=choices,
            )
        reasoning = await call(base, max_tokens=cfg["max_tokens"], temperature=cfg["temperature"])
        msgs = [*base, P.assistant(reasoning), P.user(P.answer_cue(choices))]
        return await call(
            msgs, max_tokens=cfg["answer_tokens"], temperature=cfg["temperature"], choices=choices
        )

    outs = await asyncio.gather(*(one() for _ in range(n)))
    answers = [extract_choice(o, choices) for o in outs]
    return {"answer": majority(answers, choices), "answers": answers}


def debate_round1(ctx: str) -> list[P.Message]:
    return [*P.context(ctx), P.user(P.FIRST_PROMPT)]


def debate_round2(ctx: str, own: str, others: list[tuple[str, str]]) -> list[P.Message]:
    parts = [(f"\nAgent {name}: ", text) for name, text in others]
    return [*debate_round1(ctx), P.assistant(own), P.user(P.spliced(parts, P.DEBATE_PROMPT))]


def debate_transcript(ctx: str, rounds: list[dict[str, str]], agent: str) -> list[P.Message]:
    """A later round in the shared-transcript layout: context, every answer so far, own turn."""
    return [*P.context(ctx), P.user(P.transcript_turn(rounds, agent))]


async def debate(
    call: Call, ctx: str, agents: int, rounds: int, choices: list[str], cfg: dict[str, Any]
) -> dict[str, Any]:
    """Every agent answers, then answers again having read the others' answers (no early stop).

    The layout is microagent's for the same workload (``cfg["layout"]``, default auto).
    """
    names = [f"debater-{i}" for i in range(1, agents + 1)]
    kw = {"max_tokens": cfg["max_tokens"], "temperature": cfg["temperature"]}
    layout = P.debate_layout(agents, cfg.get("layout", "auto"))
    latest = dict(
        zip(
            names,
            await asyncio.gather(*(call(debate_round1(ctx), **kw) for _ in names)),
            strict=True,
        )
    )
    history = [latest]
    for _ in range(2, rounds + 1):
        prev = dict(latest)

        def messages(
            n: str, prev: dict[str, str] = prev, history: list[dict[str, str]] = history
        ) -> list[P.Message]:
            if layout == "transcript":
                return debate_transcript(ctx, history, n)
            return debate_round2(ctx, prev[n], [(o, prev[o]) for o in sorted(prev) if o != n])

        outs = await asyncio.gather(*(call(messages(n), **kw) for n in names))
        latest = dict(zip(names, outs, strict=True))
        history = [*history, latest]
    answers = [extract_choice(latest[n], choices) for n in names]
    return {"answer": majority(answers, choices), "answers": answers}


def aggregate_prompt(ctx: str, proposals: list[str]) -> list[P.Message]:
    parts = [(f"\nProposal from proposer-{i}: ", p) for i, p in enumerate(proposals[1:], 2)]
    return [
        *P.context(ctx),
        P.assistant(proposals[0]),
        P.user(P.spliced(parts, "\n" + P.AGGREGATE_PROMPT)),
    ]


async def aggregate(call: Call, ctx: str, proposers: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """N proposals in parallel, then one aggregator (greedy) reading them as text."""
    props = await asyncio.gather(
        *(
            call(P.context(ctx), max_tokens=cfg["max_tokens"], temperature=cfg["temperature"])
            for _ in range(proposers)
        )
    )
    final = await call(
        aggregate_prompt(ctx, list(props)), max_tokens=cfg["max_tokens"], temperature=0.0
    )
    return {"answer": P.clean(final)}


def format_validator(choices: list[str]) -> Callable[[str], str | None]:
    """The reflect workload's validator: the answer must end with 'Answer: <a choice>'."""

    def validate(text: str) -> str | None:
        lines = [ln.strip() for ln in P.clean(text).splitlines() if ln.strip()]
        if not lines or not lines[-1].lower().startswith("answer:"):
            return "the last line must be 'Answer: <your answer>'"
        if not extract_choice(lines[-1], choices):
            return f"the answer must be one of: {', '.join(choices)}"
        return None

    return validate


async def reflect(
    call: Call, ctx: str, rounds: int, choices: list[str], cfg: dict[str, Any]
) -> dict[str, Any]:
    """Draft, validate, critique, revise (microagent's reflect control flow, as client code)."""
    validate = format_validator(choices)
    kw = {"max_tokens": cfg["max_tokens"], "temperature": cfg["temperature"]}
    thread = [*P.context(ctx), P.user(P.FIRST_PROMPT)]
    draft = await call(thread, **kw)
    for r in range(1, rounds + 1):
        error = validate(draft)
        if error is None:
            break
        thread = [
            *thread,
            P.assistant(draft),
            P.user(f"A validator rejected the answer: {error}\n{P.CRITIC_PROMPT}"),
        ]
        critique = await call(thread, max_tokens=cfg["max_tokens"], temperature=0.0)
        if r == rounds:
            break
        thread = [*thread, P.assistant(critique), P.user(P.REVISE_PROMPT)]
        draft = await call(thread, **kw)
    return {"answer": P.clean(draft), "valid": validate(draft) is None}


async def run_workload(
    caller: Caller, workload: dict[str, Any], ctx: str, choices: list[str]
) -> dict[str, Any]:
    """Run one workload (a dict from ``collab.WORKLOADS``) with plain client code."""
    kind, cfg = workload["kind"], workload
    call = caller.call
    if kind == "vote":
        return await vote(call, ctx, cfg["n"], choices, cfg["style"], cfg)
    if kind == "debate":
        return await debate(call, ctx, cfg["agents"], cfg["rounds"], choices, cfg)
    if kind == "aggregate":
        return await aggregate(call, ctx, cfg["proposers"], cfg)
    if kind == "reflect":
        return await reflect(call, ctx, cfg["rounds"], choices, cfg)
    raise ValueError(f"unknown workload kind {kind!r}")
