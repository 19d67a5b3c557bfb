"""``POST /tokenize`` and ``POST /detokenize``, in ``vllm serve``'s shapes.

``{"model", "prompt"}`` (text as the model reads it) or ``{"model", "messages"}``
(a conversation composed as a chat completion composes it, the generation cue
included unless ``add_generation_prompt`` is false) answers
``{"count", "max_model_len", "tokens"}``; ``{"model", "tokens"}`` answers
``{"prompt"}``. Inputs are bounded and a token outside the vocabulary is a 400
naming it, not an empty string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine_bridge import EngineBridge
from ._errors import bad_request
from ._messages import compose, context_limit, conversation
from ._schemas import ChatCompletionRequest, ChatMessage
from ._state import ServerState, engine_for

MAX_TOKENIZE_CHARS = 1_000_000
"""The longest ``prompt`` ``/tokenize`` reads (the body's byte limit may be lower)."""

MAX_DETOKENIZE_TOKENS = 65_536
"""The most ``tokens`` ``/detokenize`` reads."""

MAX_TOKENIZE_MESSAGES = 1024
"""The most ``messages`` ``/tokenize`` composes."""


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: a ``prompt`` or ``messages`` (exactly one)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str | None = Field(default=None, max_length=MAX_TOKENIZE_CHARS)
    messages: list[ChatMessage] | None = Field(
        default=None, min_length=1, max_length=MAX_TOKENIZE_MESSAGES
    )
    add_generation_prompt: bool = True
    add_special_tokens: bool = Field(
        default=False, description="Accepted as false only: no special tokens are added."
    )


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids of the model's vocabulary."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_DETOKENIZE_TOKENS)]


async def tokenize(state: ServerState, body: TokenizeRequest) -> dict[str, Any]:
    """The token ids of ``body``'s prompt or conversation, their count and the context."""
    bridge = engine_for(state, body.model)
    if body.add_special_tokens:
        raise bad_request(
            "add_special_tokens: this server adds no special tokens to a prompt",
            "add_special_tokens",
        )
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt and messages", "prompt")
    if body.prompt is not None:
        tokens = await bridge.atokenize(body.prompt)
    else:
        try:
            chat = ChatCompletionRequest.model_validate(
                {"messages": [m.model_dump(exclude_none=True) for m in body.messages or ()]}
            )
        except ValidationError as exc:  # the messages were parsed by the same model
            raise bad_request(f"messages: {exc.errors()[0].get('msg', '')}", "messages") from None
        context = await compose(bridge, conversation(chat))
        if body.add_generation_prompt:
            context = bridge.chat.generation_prompt(context)
        tokens = list(context.token_ids)
    return {"count": len(tokens), "max_model_len": context_limit(bridge), "tokens": tokens}


def detokenize(state: ServerState, body: DetokenizeRequest) -> dict[str, str]:
    """The text of ``body.tokens`` (a 400 naming the first id outside the vocabulary)."""
    bridge = engine_for(state, body.model)
    at = unknown_token(bridge, body.tokens)
    if at is not None:
        raise bad_request(
            f"tokens[{at}]: {body.tokens[at]} is not in model {bridge.model!r}'s vocabulary",
            f"tokens[{at}]",
        )
    return {"prompt": bridge.detokenize(body.tokens)}


def unknown_token(bridge: EngineBridge, ids: Sequence[int]) -> int | None:
    """The index of the first id of ``ids`` outside ``bridge``'s vocabulary (None: all in).

    A tokenizer decodes an id it lacks as "" (every token of the default model has
    text); each distinct id is decoded once, so the cost is bounded by the vocabulary.
    """
    known: dict[int, bool] = {}
    for i, token in enumerate(ids):
        if token not in known:
            known[token] = bool(bridge.detokenize([token]))
        if not known[token]:
            return i
    return None
