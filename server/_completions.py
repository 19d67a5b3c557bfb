"""``POST /v1/completions``: OpenAI's text completions, for a plain prompt.

lm-evaluation-harness and LangChain's ``OpenAI`` class call it. The request is
read into the chat request it means (``CompletionsRequest.to_chat``: its sampling
fields, checked where chat's are) and a prompt (text, or token ids as sent); the
plan, admission, run and stream are the chat route's, only the shapes differ
(``text_completion`` objects, ``choices[].text``). No collaboration and no chat
template: the prompt is the model's input as written.

What the server does not do (``echo``, ``logprobs``, ``suffix``, ``best_of`` above
1, a ``logit_bias``, a batch of several prompts) is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import ApiError, bad_request
from ._render import Stamp, usage
from ._schemas import ChatCompletionRequest, StreamOptions

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for a text completion."""

MAX_PROMPT_TOKEN_IDS = 131_072
"""The most token ids a ``prompt`` may list (the body's byte limit bounds text)."""

#: a token id as JSON sends it (the engine refuses one outside its vocabulary)
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS)]


class CompletionsRequest(BaseModel):
    """``POST /v1/completions``: a prompt and the sampling fields chat shares.

    ``prompt`` is a string, a list holding one string, a list of token ids, or a
    list holding one such list (several prompts in one request are refused).
    """

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(
        default=None, description=f"Completion tokens at most (default {DEFAULT_MAX_TOKENS})."
    )
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    n: int = 1
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    top_k: int | None = Field(default=None, description="vLLM: sample from the k most likely")
    min_p: float | None = Field(default=None, description="vLLM: minimum relative probability")
    repetition_penalty: float | None = Field(default=None, description="vLLM: >1 penalizes")
    user: str | None = Field(default=None, max_length=256)
    echo: bool | None = Field(default=None, description="Refused when true.")
    logprobs: int | None = Field(default=None, description="Refused: not supported here.")
    suffix: str | None = Field(default=None, description="Refused when not empty.")
    best_of: int | None = Field(default=None, description="Refused above 1.")
    logit_bias: dict[str, float] | None = Field(default=None, description="Refused when not empty.")

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request whose sampling this is (a 400 naming the field at fault).

        Its one message is a placeholder: the prompt is ``prompt_input``, never composed.
        """
        self._refuse()
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": ""}],
            "max_tokens": DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens,
            "n": self.n,
            "stream": self.stream,
        }
        for name in (
            "model",
            "temperature",
            "top_p",
            "stop",
            "seed",
            "frequency_penalty",
            "presence_penalty",
            "top_k",
            "min_p",
            "repetition_penalty",
            "user",
        ):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.stream_options is not None:
            body["stream_options"] = self.stream_options.model_dump()
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # every field was typed here: not expected
            raise bad_request(f"invalid request: {exc.errors()[0].get('msg', '')}") from None

    def prompt_input(self) -> str | list[int]:
        """The one prompt: its text, or its token ids as sent."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        if all(isinstance(t, int) for t in prompt):
            return [t for t in prompt if isinstance(t, int)]
        if len(prompt) != 1:
            raise bad_request(
                f"prompt: one prompt per request (got {len(prompt)}); send each on its own",
                "prompt",
            )
        only = prompt[0]
        if isinstance(only, int):  # not reached: a list of ids is handled above
            raise bad_request("prompt must be a string or token ids", "prompt")
        return only if isinstance(only, str) else list(only)

    def _refuse(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if value is not None:  # an explicit null is "not given", as in OpenAI's SDKs
                raise bad_request(
                    f"unrecognized request argument supplied: {name}", name, "unknown_parameter"
                )
        refused = {
            "echo": self.echo is True,
            "logprobs": self.logprobs is not None,
            "suffix": bool(self.suffix),
            "best_of": self.best_of not in (None, 1),
            "logit_bias": bool(self.logit_bias),
        }
        for name, given in refused.items():
            if given:
                raise bad_request(
                    f"{name}: not supported by this server's /v1/completions",
                    name,
                    "unsupported_parameter",
                )


def text_completion(
    stamp: Stamp, choices: Sequence[dict[str, Any]], used: tuple[int, int, int]
) -> dict[str, Any]:
    """The ``text_completion`` body of a finished plain completion (chat's ``choices``
    rendered as text)."""
    return {
        "id": stamp.id,
        "object": "text_completion",
        "created": stamp.created,
        "model": stamp.model,
        "choices": [
            {
                "index": c["index"],
                "text": c["message"].get("content") or "",
                "logprobs": None,
                "finish_reason": c["finish_reason"],
            }
            for c in choices
        ],
        "usage": usage(*used),
    }


def refused_prompt(exc: ApiError) -> ApiError:
    """A chat-shaped refusal about ``messages`` reworded for ``prompt``."""
    if exc.param is not None and exc.param.startswith("messages"):
        return bad_request(exc.message, "prompt", exc.code)
    return exc
