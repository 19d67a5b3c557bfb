"""A request's conversation: its messages checked, rendered for the model and composed.

``conversation`` turns the OpenAI messages into role/content pairs (tool calls and
results in the model's own format), refusing with a 400 what cannot be sent;
``compose`` makes them a handle on an engine (long texts off the event loop), and
``check_length`` holds the result against the model's context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from ..engine_bridge import (
    EngineBridge,
    KVHandle,
    ToolFormat,
    ToolPlan,
    render_tool_result,
    with_tool_instructions,
)
from ._errors import bad_request
from ._schemas import ChatCompletionRequest
from ._tools import history_calls


def conversation(
    body: ChatCompletionRequest,
    plan: ToolPlan | None = None,
    call_format: ToolFormat | None = None,
) -> list[dict[str, str]]:
    """The conversation as role/content pairs, tool calls and results as the model reads them
    (in ``call_format``, the model's; Hermes when not given).

    ``messages`` is never empty here: the schema's ``minItems`` refuses that with a 400.
    """
    out: list[dict[str, str]] = []
    call_ids: set[str] = set()
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        text = message_text(message.content, where)
        role = "system" if message.role == "developer" else message.role
        if message.tool_calls is not None:
            if role != "assistant":
                raise bad_request(
                    f"{where}.tool_calls: only assistant messages make tool calls",
                    f"{where}.tool_calls",
                )
            text = history_calls(text, message.tool_calls, where, call_format)
            call_ids.update(str(c.get("id")) for c in message.tool_calls if isinstance(c, dict))
        if role == "tool":
            if message.tool_call_id is None:
                raise bad_request(
                    f"{where}.tool_call_id is required in a tool message",
                    f"{where}.tool_call_id",
                )
            if message.tool_call_id not in call_ids:
                raise bad_request(
                    f"{where}: a tool message must answer a tool call of an earlier "
                    f"assistant message (no call has id {message.tool_call_id!r})",
                    f"{where}.tool_call_id",
                )
            text = (
                render_tool_result(text, call_format)
                if call_format is not None
                else render_tool_result(text)
            )
        elif message.tool_call_id is not None:
            raise bad_request(
                f"{where}.tool_call_id belongs to tool messages", f"{where}.tool_call_id"
            )
        out.append({"role": role, "content": text})
    if all(not m["content"].strip() for m in out):
        raise bad_request("messages must contain some text", "messages")
    if plan is not None:
        return with_tool_instructions(out, plan)
    return out


def message_text(content: str | list[Any] | None, where: str) -> str:
    """A message's text: a string, or its text parts joined (a 400 for any other part)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"{where}.content[{j}]: only text parts are supported", f"{where}.content"
            )
        parts.append(part.text)
    return "".join(parts)


async def compose(bridge: EngineBridge, messages: Sequence[Mapping[str, Any]]) -> KVHandle:
    """The conversation as a handle; long texts are tokenized off the event loop."""
    chat: Any = bridge.chat
    messages = list(messages)
    roles = getattr(getattr(chat, "template", None), "roles", None)
    if roles is not None:
        for i, m in enumerate(messages):
            if m["role"] == "tool" and "tool" not in roles:  # a template without tool turns
                messages[i] = {"role": "user", "content": m["content"]}
            elif m["role"] not in roles:
                raise bad_request(
                    f"messages[{i}].role: role {m['role']!r} is not supported by the chat "
                    "template of "
                    f"{bridge.model!r} (supported: {sorted(roles)})",
                    f"messages[{i}].role",
                )
    size = sum(len(m["content"]) for m in messages)
    try:
        if size < 2048:
            handle: KVHandle = chat.context(messages)
            return handle
        result: KVHandle = await anyio.to_thread.run_sync(chat.context, messages)
        return result
    except (ValueError, KeyError, TypeError) as exc:
        raise bad_request(
            f"messages cannot be composed for {bridge.model!r}: {exc}", "messages"
        ) from None


def context_limit(bridge: EngineBridge) -> int | None:
    """The model's context length, when its engine says."""
    value = getattr(bridge, "max_model_len", None)
    return value if isinstance(value, int) and value > 0 else None


def check_length(bridge: EngineBridge, prompt_tokens: int, max_tokens: int) -> None:
    """A 400 when the prompt, or the prompt plus ``max_tokens``, is over the context."""
    limit = context_limit(bridge)
    if limit is None:
        return
    if prompt_tokens >= limit:
        raise bad_request(
            f"the context is {prompt_tokens} tokens; model {bridge.model!r} allows {limit}",
            "messages",
            "context_length_exceeded",
        )
    if prompt_tokens + max_tokens > limit:
        raise bad_request(
            f"the context ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
            f"the {limit} tokens model {bridge.model!r} allows",
            "max_tokens",
            "context_length_exceeded",
        )
