"""Rendering: what a finished request sends back, in OpenAI's shapes.

``usage`` and ``choice`` build the parts of a ``chat.completion``; ``Stamp`` is a
response's id, time and model, shared by its JSON body and its stream's chunks;
``collaboration_response`` is a finished collaboration's whole body.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs

from ..collab import Outcome
from ..engine_bridge import EngineBridge, GenerationResult, ToolPlan
from ._logprobs import choice_logprobs
from ._sse import StreamItem


def usage(prompt: int, cached: int, completion: int, **extra: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object (``extra``: microagent's own counts beside it)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    usage.update(extra)
    return usage


def finish_reason(reason: str) -> str:
    """The engine's finish reason as OpenAI names it (an abort ends a reply as ``stop``)."""
    return reason if reason in ("stop", "length") else "stop"


@attrs.frozen
class Stamp:
    """A response's id, creation time and model: one per request, on every chunk.

    ``text``: a ``/v1/completions`` response, whose chunks are ``text_completion``
    objects (each choice's ``delta.content`` as its ``text``).
    """

    id: str
    created: int
    model: str
    text: bool = False

    @classmethod
    def new(cls, model: str, *, text: bool = False) -> Stamp:
        prefix = "cmpl" if text else "chatcmpl"
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model, text)

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        if self.text:
            choices = [
                {
                    "index": c["index"],
                    "text": c["delta"].get("content") or "",
                    "logprobs": None,
                    "finish_reason": c["finish_reason"],
                }
                for c in choices
            ]
        return {
            "id": self.id,
            "object": "text_completion" if self.text else "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def fixed(payload: dict[str, Any] | str) -> StreamItem:
    """A stream item whose payload is already built (never merged or dropped)."""
    return StreamItem(build=lambda _text: payload)


def choice(
    bridge: EngineBridge, index: int, result: GenerationResult, plan: ToolPlan | None, top: int
) -> dict[str, Any]:
    """One ``choices[]`` entry: the message (its tool calls parsed out) and its logprobs."""
    content: str | None = result.content
    calls: list[dict[str, Any]] = []
    if plan is not None and result.finish_reason in ("stop", "length"):
        content, calls = plan.parse(result.content, complete=result.finish_reason == "stop")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": choice_logprobs(bridge, result.logprobs, top),
        "finish_reason": "tool_calls" if calls else finish_reason(result.finish_reason),
    }


def collaboration_response(
    outcome: Outcome, model: str, id: str | None = None, created: int | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` object of a finished collaboration (``Outcome``)."""
    return {
        "id": id or f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.answer},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": collaboration_usage(outcome),
        "collaboration": outcome.to_dict(),
    }


def collaboration_usage(outcome: Outcome) -> dict[str, Any]:
    """A collaboration's ``usage``: every request of every agent, and per model."""
    u = outcome.usage
    usage_ = usage(
        u.prompt_tokens,
        u.cached_tokens,
        u.completion_tokens,
        saved_completion_tokens=u.saved_completion_tokens,
    )
    # each model's own tokenizer's counts: a remote's are what its endpoint reported
    usage_["by_model"] = {name: m.to_dict() for name, m in outcome.usage_by_model.items()}
    return usage_
