"""A chat request's prompt rendered whole by the model's chat template, tools included.

With ``serve --tool-call-parser``, a model whose chat template has a tool format
gets the request's tools, its history's ``tool_calls`` and its ``tool`` turns
rendered by that template (``templated_prompt``), as ``vllm serve`` renders
them; a model whose template has none is composed token by token, the format's
own description in its system turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anyio

from ..engine_bridge import EngineBridge, KVHandle, ToolPlan
from ._errors import bad_request
from ._messages import conversation, message_text
from ._schemas import ChatCompletionRequest, ChatMessage


async def templated_prompt(
    bridge: EngineBridge, body: ChatCompletionRequest, plan: ToolPlan | None
) -> KVHandle | None:
    """The prompt rendered whole by the model's chat template (tools, calls and results
    where the template puts them), or ``None`` to compose it token by token.

    Only when a parser is named (``ToolFormat.templated``), the template has a tool format,
    and the request offers tools or its history holds calls. Generated ids of an earlier
    turn are not spliced in here: the template's text is tokenized as it is.
    """
    if not bridge.tool_format.templated or not bridge.chat.renders_tools():
        return None
    active = plan is not None and plan.active
    history = any(m.tool_calls is not None or m.role == "tool" for m in body.messages)
    if not active and not history:
        return None
    conversation(body)  # every field checked once, as the token-level path checks it
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(body.messages)]
    tools = [t.describe() for t in plan.offered()] if plan is not None and active else None
    size = sum(len(str(m.get("content") or "")) for m in messages)
    try:
        if size < 2048:
            return bridge.chat.render_prompt(messages, tools)
        handle: KVHandle = await anyio.to_thread.run_sync(
            bridge.chat.render_prompt, messages, tools
        )
        return handle
    except ValueError as exc:
        raise bad_request(
            f"messages cannot be rendered for {bridge.model!r}: {exc}", "messages"
        ) from None


def _message(message: ChatMessage, where: str) -> Mapping[str, object]:
    """One message as chat templates read it: ``developer`` as ``system``, each call's
    ``arguments`` an object (as vLLM hands them to a template). ``conversation`` has
    checked the calls already."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, object] = {"role": role, "content": message_text(message.content, where)}
    if message.tool_calls is not None:
        out["tool_calls"] = [_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _call(call: Mapping[str, Any]) -> Mapping[str, object]:
    fn = call["function"]
    raw = fn.get("arguments", "{}")
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {
            "name": fn["name"],
            "arguments": json.loads(raw) if isinstance(raw, str) else raw,
        },
    }
