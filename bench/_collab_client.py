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

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import _collab_prompts as P
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
