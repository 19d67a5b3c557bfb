"""Request models of the HTTP API: OpenAI Chat Completions plus ``agents`` and ``collaboration``.

Only requests are modelled with pydantic (they drive validation and the
OpenAPI schema); responses are plain dicts built in ``_render``, ``_chat_render``
and ``_responses_render``; ``_openapi`` adds the rules JSON Schema can express
beyond the fields' types. Types are
strict — a string where a number belongs is a 400, not a silent coercion.
An agent is not modelled here: its schema is ``AgentSpec``'s (``AgentSpec.json_schema``)
and ``AgentSpec.from_dict`` validates it, so the two can never disagree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..collab import AgentSpec, validator_json_schema
from ..collab.graph import graph_json_schema
from ..engine_bridge import TOOL_NAME_PATTERN
from ._openapi import request_rules

#: ``agents``: JSON objects checked by ``AgentSpec.from_dict``, documented by its schema.
AgentList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {"title": "AgentSpec", **AgentSpec.json_schema()},
        }
    ),
]


class AnswerModel(BaseModel):
    """How answers are constrained (fixed ``choices`` or a ``regex``) and read (``extract``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    choices: Annotated[
        list[str] | None,
        WithJsonSchema(  # checked by the collaboration layer, which names the field
            {
                "anyOf": [
                    {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "uniqueItems": True,
                    },
                    {"type": "null"},
                ],
                "description": "The closed answers (at least one, none empty, none repeated).",
            }
        ),
    ] = None
    regex: str | None = None
    extract: str | None = Field(
        default=None,
        description="Which part of a free answer is tallied: number (the reply's last "
        "number) or a regular expression whose last match (its group, if any) is the answer.",
    )


def _graph_properties(schema: dict[str, Any]) -> None:
    """Document the ``graph`` mode's fields (nodes, edges, entry, output) in the OpenAPI schema."""
    graph = graph_json_schema()
    props = schema.setdefault("properties", {})
    for name, sub in graph["properties"].items():
        props.setdefault(
            name, {**sub, "description": f"graph mode: {name} of the collaboration graph"}
        )
    props.setdefault(
        "validator",
        {**validator_json_schema(), "description": "reflect, best_of, auto: the answer's check"},
    )
    schema["description"] = (
        "How the agents collaborate; mode-specific options ride along as extra fields "
        "(vote: style, wave, answer_tokens, debias [off|order|labels], "
        "adaptive [off|beta|window], confidence, soft, calibrate [off|position|content], "
        "gate, below [greedy|abstain|escalate], logprob; "
        "debate: layout [auto|threads|transcript]; reflect: validator; cascade: verify; "
        "best_of: validator, judge [auto|self|likelihood|off], "
        "judge_instructions, answer_tokens, wave, adaptive (with judge likelihood); "
        "compute (with serve --calculator): expression_tokens, steps, verify, fallback; "
        "auto: validator, calculator (with serve --calculator), compute_steps, compute_verify, "
        "logprob; "
        "graph: nodes, edges, entry, output). ``tools`` names server tools the agents may call."
    )
    schema["if"] = {
        "required": ["tool_choice"],
        "properties": {"tool_choice": {"type": "string"}},
    }
    schema["then"] = {
        "required": ["tools"],
        "properties": {"tools": {"type": "array", "minItems": 1}},
    }


class CollaborationModel(BaseModel):
    """How the agents collaborate; mode-specific options ride along as extra fields."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_graph_properties)

    mode: str = Field(min_length=1, max_length=128)
    tools: list[str] | None = Field(
        default=None,
        description="Server tools (microagent serve --tool) every agent may call, run in the loop.",
    )
    tool_choice: Literal["auto", "required"] | None = Field(
        default=None,
        description='With tools: "required" makes every step of a free-text turn but the '
        "last a call (up to the tool-step limit).",
    )
    early_stop: bool = True
    rounds: int | None = None
    answer: AnswerModel | None = None


def _text_part(schema: dict[str, Any]) -> None:
    """Document that a part is a text part: ``type`` "text" with a string ``text``."""
    schema["properties"]["type"] = {"const": "text"}
    schema["properties"]["text"] = {"type": "string"}
    schema["required"] = ["type", "text"]


class ContentPart(BaseModel):
    """One part of a multi-part message content (only text is supported)."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_text_part)

    type: str
    text: str | None = None


#: An assistant message's earlier tool calls (``render_tool_calls`` reads them).
ToolCallList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "arguments": {
                                "description": "The call's arguments: JSON text (a string "
                                "that must parse as JSON, which JSON Schema cannot express) "
                                "or the arguments themselves."
                            },
                        },
                        "required": ["name"],
                    }
                },
                "required": ["function"],
            },
        }
    ),
]


def _role_rules(schema: dict[str, Any]) -> None:
    """Document who carries ``tool_call_id`` (a tool, always) and ``tool_calls`` (an assistant)."""
    schema["allOf"] = [
        {
            "if": {"properties": {"role": {"const": "tool"}}},
            "then": {
                "required": ["tool_call_id"],
                "properties": {"tool_call_id": {"type": "string"}},
            },
            "else": {"properties": {"tool_call_id": {"type": "null"}}},
        },
        {
            "if": {"properties": {"role": {"const": "assistant"}}},
            "else": {"properties": {"tool_calls": {"type": "null"}}},
        },
    ]


class ChatMessage(BaseModel):
    """One chat message; an assistant's ``tool_calls`` and a tool's ``tool_call_id`` included."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_role_rules)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: ToolCallList | None = Field(
        default=None, description="Only on assistant messages: the calls it made."
    )
    tool_call_id: str | None = Field(
        default=None,
        description="Required on tool messages, and only there. It must be the id of a call "
        "in an earlier assistant message's tool_calls (a rule JSON Schema cannot express).",
    )
    refusal: str | None = None


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the reply must satisfy."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description="A JSON Schema without $ref (a rule JSON Schema cannot express).",
    )
    strict: bool | None = None


def _format_rules(schema: dict[str, Any]) -> None:
    """Document that ``json_schema`` comes with type "json_schema", and only with it."""
    schema["if"] = {"properties": {"type": {"const": "json_schema"}}}
    schema["then"] = {
        "required": ["json_schema"],
        "properties": {"json_schema": {"type": "object"}},
    }
    schema["else"] = {"properties": {"json_schema": {"type": "null"}}}


class ResponseFormat(BaseModel):
    """``response_format``: free text, any JSON object, or JSON valid against a schema.

    The output is always constrained by the engine's structured outputs (``strict``
    or not), so a reply that finished (``finish_reason: "stop"``) is valid.
    """

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_format_rules)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False


#: A function tool as OpenAI documents it (checked in ``_tools``, which names the field at fault).
ToolList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
                            "description": {"type": "string"},
                            "parameters": {
                                "type": "object",
                                "description": "the arguments' JSON Schema; it must itself "
                                "be a valid JSON Schema (checked against the meta-schema, "
                                "which this document does not inline)",
                            },
                            "strict": {"type": "boolean"},
                        },
                        "required": ["name"],
                        "additionalProperties": False,
                    },
                },
                "required": ["type", "function"],
                "additionalProperties": False,
            },
        }
    ),
]

#: Parameters of OpenAI's API that this server refuses with a 400 naming them, and why.
#: Any other parameter the model below does not declare is refused as unrecognized.
REFUSED_PARAMETERS: dict[str, str] = {
    "audio": "audio output is not supported",
    "modalities": "only text output is supported (omit modalities)",
    "function_call": "deprecated by OpenAI; use tools and tool_choice",
    "functions": "deprecated by OpenAI; use tools and tool_choice",
    "logit_bias": "logit_bias is not supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "the served models do not reason",
    "verbosity": "the served models have no verbosity setting",
    "web_search_options": "web search is not supported",
    "moderation": "moderation is not supported",
}


class PromptCacheOptions(BaseModel):
    """``prompt_cache_options``: keep this turn's KV resident for the session's next turn."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ttl: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]{0,6}(s|m|h|d)$",
        description=(
            "Minimum lifetime of the retained turn ('30m' by default; '90s', '2h', '1d'), "
            "clamped to the server's ceiling; a best effort under memory pressure."
        ),
    )
    mode: Literal["implicit"] | None = Field(
        default=None,
        description=(
            "Only 'implicit' (the whole prompt and reply are retained): content-block "
            "breakpoints are not supported."
        ),
    )


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI request plus ``agents`` and ``collaboration``.

    Every parameter is honoured or refused: an undeclared one is a 400 naming it
    (``REFUSED_PARAMETERS`` say why for OpenAI's own). ``user``, ``metadata``,
    ``safety_identifier`` identify a request and do not change its output;
    ``prompt_cache_key``, ``prompt_cache_options`` and ``prompt_cache_retention``
    retain its KV for the session's next turn (``server._sessions``). ``top_k``,
    ``min_p`` and ``repetition_penalty`` are vLLM's extra sampling parameters.
    """

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=request_rules)

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
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
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: ToolList | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(
        default=None,
        max_length=256,
        description="Groups a session's requests: its turns are retained for the next one.",
    )
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(
        default=None,
        description=(
            "Deprecated by OpenAI; 'in_memory' retains for the server's default TTL, "
            "'24h' for 24 hours (clamped to the server's ceiling)."
        ),
    )
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    agents: AgentList | None = Field(
        default=None,
        description=(
            "Roles of a multi-agent collaboration; without it the request is a plain "
            "chat completion."
        ),
    )
    collaboration: CollaborationModel | None = Field(
        default=None,
        description="How the agents collaborate (mode, early_stop, rounds, answer, mode options).",
    )

    def collaboration_options(self) -> dict[str, Any]:
        """The collaboration's options (everything but ``mode``), request-level defaults applied."""
        collab = self.collaboration
        options: dict[str, Any] = {}
        if collab is not None:
            options["early_stop"] = collab.early_stop
            if collab.rounds is not None:
                options["rounds"] = collab.rounds
            if collab.answer is not None:
                options["answer"] = collab.answer.model_dump(exclude_none=True)
            options.update(collab.model_extra or {})
        limit = (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )
        if limit is not None:
            options.setdefault("max_tokens", limit)
        if self.temperature is not None:
            options.setdefault("temperature", self.temperature)
        # the agents' turns honour these as a plain completion does (each agent its own seed)
        if self.top_p is not None:
            options.setdefault("top_p", self.top_p)
        if self.seed is not None:
            options.setdefault("seed", self.seed)
        if self.stop is not None:
            options.setdefault("stop", [self.stop] if isinstance(self.stop, str) else self.stop)
        return options
