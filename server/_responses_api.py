"""``POST /v1/responses``: OpenAI's Responses request, parsed into the chat request it means.

The Responses API is a second way to ask for the same thing, so it is a parser
over the same plans, not a second route: ``ResponsesRequest.to_chat`` maps its
``input`` items (messages, ``function_call``, ``function_call_output``),
``instructions``, ``tools``, ``tool_choice``, ``max_output_tokens``, ``text.format``
and the shared fields onto a ``ChatCompletionRequest``, which then runs through
plan, admit and run like any chat request; ``_responses_render`` renders the
result as a ``response`` object or its event stream. ``agents`` and
``collaboration`` work as on chat completions.

A response is stored unless ``store: false`` (``_response_store``), and
``previous_response_id`` continues a stored one: ``to_chat`` then puts the
conversation it ends (every earlier turn's input and output items, tool calls
and their outputs included) before this request's input, after this request's
``instructions`` (OpenAI does not carry a previous response's instructions
over). A stored or chained request is a session of its chain
(``prompt_cache_key`` ``resp:<first response id>`` unless the client names one),
so each turn's KV is retained for the next. Every other field this server does
not honour is a 400 naming it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from ._errors import ApiError, bad_request
from ._schemas import AgentList, ChatCompletionRequest, CollaborationModel, PromptCacheOptions

#: Fields of OpenAI's Responses request this server refuses, and why.
REFUSED_RESPONSE_FIELDS: dict[str, str] = {
    "conversation": "conversation objects are not supported: chain responses with "
    "previous_response_id, or send the whole input each turn",
    "background": "background responses are not supported",
    "reasoning": "the served models have no reasoning settings",
    "prompt": "stored prompt templates are not supported",
    "max_tool_calls": "built-in tools are not supported; function calls are the client's",
    "top_logprobs": "logprobs are available on /v1/chat/completions",
    "stream_options": "no stream options are supported on responses",
    "service_tier": "there is one service tier",
    "context_management": "context management is not supported",
}

#: ``include`` values that need nothing this server lacks (none do yet: each is refused).
SUPPORTED_INCLUDES: frozenset[str] = frozenset()

_TEXT = {"type": "string", "pattern": "\\S"}
#: The document's form of the rule ``messages must contain some text`` (a 400 naming
#: ``input``): non-blank ``instructions``, a non-blank ``input`` text, or an input item
#: that is a function call, a call's output, or a message with non-blank text.
SOME_TEXT: dict[str, Any] = {
    "anyOf": [
        {"required": ["instructions"], "properties": {"instructions": _TEXT}},
        {"required": ["input"], "properties": {"input": _TEXT}},
        {
            "required": ["input"],
            "properties": {
                "input": {
                    "type": "array",
                    "contains": {
                        "anyOf": [
                            {
                                "required": ["type"],
                                "properties": {
                                    "type": {"enum": ["function_call", "function_call_output"]}
                                },
                            },
                            {
                                "required": ["content"],
                                "properties": {
                                    "content": {
                                        "anyOf": [
                                            _TEXT,
                                            {
                                                "type": "array",
                                                "contains": {
                                                    "required": ["text"],
                                                    "properties": {"text": _TEXT},
                                                },
                                            },
                                        ]
                                    }
                                },
                            },
                        ]
                    },
                }
            },
        },
    ]
}


def _some_text(schema: dict[str, Any]) -> None:
    schema.update(SOME_TEXT)


class ResponsesRequest(BaseModel):
    """The part of OpenAI's Responses request that ``responses.create`` and the Agents SDK use."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_some_text)

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(
        description="A user message's text, or input items: messages (role and content), "
        "function_call and function_call_output items. Some text is needed: non-blank "
        "instructions or input text, or an item that is a call, a call's output or a message "
        "with non-blank text (else a 400 naming input)."
    )
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    stream: bool = False
    store: bool | None = Field(
        default=None,
        description="Keep the response (the default, as OpenAI's): GET/DELETE "
        "/v1/responses/{id} and previous_response_id find it, with this API key only.",
    )
    previous_response_id: str | None = Field(
        default=None,
        max_length=64,
        description="Continue the conversation a stored response ends: its input and "
        "output items (tool calls included) come before this input, and its turn's "
        "retained KV is read.",
    )
    truncation: Literal["disabled"] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    agents: AgentList | None = None
    collaboration: CollaborationModel | None = None
    #: where each chat message came from ("instructions", "input[3]"), for errors
    _sources: list[str] = PrivateAttr(default_factory=list)
    #: this response's id (``resp_`` and 32 hex digits), made when the request is parsed
    _id: str = PrivateAttr(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    #: the conversation the previous response ends (input items), and its chain's first id
    _history: tuple[dict[str, Any], ...] = PrivateAttr(default=())
    _chain: str | None = PrivateAttr(default=None)

    @property
    def response_id(self) -> str:
        """The id of the response this request makes."""
        return self._id

    @property
    def stores(self) -> bool:
        """Whether the response is kept (``store`` is true or left out)."""
        return self.store is not False

    @property
    def chain(self) -> str:
        """The id of the conversation's first response: this one, or the chain it continues."""
        return self._chain or self._id

    def conversation(self, output: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation through this response, as input items: the history it
        continues, its own input, then its ``output`` items."""
        mine: list[dict[str, Any]]
        if isinstance(self.input, str):
            mine = [{"type": "message", "role": "user", "content": self.input}]
        else:
            mine = list(self.input)
        return [*self._history, *mine, *output]

    def to_chat(
        self, history: Sequence[dict[str, Any]] = (), chain: str | None = None
    ) -> ChatCompletionRequest:
        """The chat request this response request means (a 400 naming the field at fault).

        Args:
            history: the conversation the previous response ends (input items), which
                comes before this request's input.
            chain: the id of that conversation's first response (its session's name).
        """
        self._history, self._chain = tuple(history), chain
        self._refuse()
        body: dict[str, Any] = {
            "messages": self._messages(),
            "stream": self.stream,
        }
        if self.prompt_cache_key is None and (self.stores or chain is not None):
            body["prompt_cache_key"] = f"resp:{self.chain}"  # a chain is one session
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        for name in (
            "model",
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "metadata",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "agents",
        ):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.prompt_cache_options is not None:
            body["prompt_cache_options"] = self.prompt_cache_options.model_dump(exclude_none=True)
        if self.collaboration is not None:
            body["collaboration"] = self.collaboration.model_dump(exclude_none=True)
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.tools is not None:
            body["tools"] = [_chat_tool(t, f"tools[{i}]") for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        fmt = _chat_format(self.text)
        if fmt is not None:
            body["response_format"] = fmt
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:  # a value this parser passed on unchecked
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise bad_request(f"{where}: {first.get('msg', 'invalid value')}", where) from None

    def _refuse(self) -> None:
        for name in sorted(self.model_extra or {}):
            why = REFUSED_RESPONSE_FIELDS.get(name, "not a field this server accepts")
            raise bad_request(f"{name}: {why}", name, "unsupported_parameter")
        for i, value in enumerate(self.include or ()):
            if value not in SUPPORTED_INCLUDES:
                raise bad_request(
                    f"include[{i}]: {value!r} is not available on this server", f"include[{i}]"
                )
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise bad_request("max_output_tokens must be at least 1", "max_output_tokens")

    def _messages(self) -> list[dict[str, Any]]:
        """``instructions`` and ``input`` as chat messages; consecutive calls join one turn."""
        out: list[dict[str, Any]] = []
        sources = self._sources
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
            sources.append("instructions")
        out = self._items(self._history, "previous_response_id", out)  # named as what brought it
        sources.extend(["previous_response_id"] * (len(out) - len(sources)))
        if isinstance(self.input, str):
            out.append({"role": "user", "content": self.input})
            sources.append("input")
            return out
        out = self._items(self.input, "input", out)
        if not out:  # what the chat request's messages would refuse, named as sent
            raise bad_request("input must contain some text", "input")
        return out

    def _items(
        self,
        items: Sequence[dict[str, Any]],
        name: str,
        out: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """``items`` as chat messages appended to ``out``; consecutive calls join one turn."""
        out = [] if out is None else out
        sources = self._sources
        for i, item in enumerate(items):
            where = f"{name}[{i}]" if name == "input" else name
            if not isinstance(item, dict):
                raise bad_request(f"{where} must be an object", where)
            kind = item.get("type", "message")
            if kind == "message":
                out.append(_chat_message(item, where))
            elif kind == "function_call":
                call = {
                    "id": _text(item, "call_id", where),
                    "type": "function",
                    "function": {
                        "name": _text(item, "name", where),
                        "arguments": _text(item, "arguments", where),
                    },
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output")
                if not isinstance(output, str):
                    output = json.dumps(output)
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": _text(item, "call_id", where),
                        "content": output,
                    }
                )
            elif kind == "reasoning":
                raise bad_request(f"{where}: reasoning items are not supported", f"{where}.type")
            else:
                raise bad_request(
                    f"{where}.type: {kind!r} is not supported (message, function_call, "
                    "function_call_output)",
                    f"{where}.type",
                )
            if name == "input":
                sources.extend([where] * (len(out) - len(sources)))
        return out

    def error(self, exc: ApiError) -> ApiError:
        """``exc`` (raised while planning the chat request) naming the Responses field."""
        param = exc.param
        if param is None:
            return exc
        renamed = None
        if param.startswith("messages[") and self._sources:
            k = int(param[len("messages[") : param.index("]")])
            if k < len(self._sources):
                renamed = self._sources[k] + param[param.index("]") + 1 :]
        elif param == "messages":
            renamed = "input"
        else:
            for chat, responses in RESPONSE_PARAMS.items():
                if param == chat or param.startswith(chat + "."):
                    renamed = responses + param[len(chat) :]
        if renamed is None:
            return exc
        return ApiError(
            exc.status,
            exc.message.replace(param, renamed, 1),
            param=renamed,
            code=exc.code,
            type=exc.type,
            headers=exc.headers,
        )


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _chat_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses message (``input_text``/``output_text`` parts) as a chat message."""
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise bad_request(
            f"{where}.role must be user, system, developer or assistant, got {role!r}",
            f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad_request(
            f"{where}.content must be a string or a list of parts", f"{where}.content"
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise bad_request(
                f"{where}.content[{j}]: only text parts are supported (input_text, output_text)",
                f"{where}.content[{j}]",
            )
        texts.append(part["text"])
    return {"role": role, "content": "".join(texts)}


def _chat_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses function tool (flat) as a chat tool (nested under ``function``)."""
    if tool.get("type") != "function":
        raise bad_request(
            f'{where}.type: only "function" tools are supported, got {tool.get("type")!r}',
            f"{where}.type",
        )
    unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
    if unknown:
        raise bad_request(f"{where}: unknown field {unknown[0]!r}", f"{where}.{unknown[0]}")
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    if function.get("description") is None:
        function.pop("description", None)
    if function.get("parameters") is None:
        function.pop("parameters", None)
    if function.get("strict") is None:
        function.pop("strict", None)
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(
        'tool_choice: "auto", "required", "none" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def _chat_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (None: free text)."""
    if text is None:
        return None
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise bad_request(f"text: unknown field {unknown[0]!r}", f"text.{unknown[0]}")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request("text.verbosity: only medium is supported", "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        inner = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        if inner.get("description") is None:
            inner.pop("description", None)
        if inner.get("strict") is None:
            inner.pop("strict", None)
        return {"type": "json_schema", "json_schema": inner}
    raise bad_request(
        f"text.format.type: text, json_object or json_schema, got {kind!r}", "text.format.type"
    )


#: Chat fields as a Responses client names them, for a 400 the planner raises.
RESPONSE_PARAMS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
