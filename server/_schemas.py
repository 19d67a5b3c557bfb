"""Request models of the HTTP API: OpenAI Chat Completions plus ``agents`` and ``collaboration``.

Only requests are modelled with pydantic (they drive validation and the
OpenAPI schema); responses are plain dicts built in ``_app``. Types are
strict — a string where a number belongs is a 400, not a silent coercion.
An agent is not modelled here: its schema is ``AgentSpec``'s (``agent_json_schema``)
and ``AgentSpec.from_dict`` validates it, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import attrs
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..collab import agent_field_rules, agent_json_schema, get_mode, graph_json_schema
from ..engine_bridge import MAX_TOP_LOGPROBS, TOOL_NAME_PATTERN

#: The most ``metadata`` pairs a request may carry.
MAX_METADATA_PAIRS = 16
#: The most function tools a plain completion may offer.
MAX_TOOLS = 128

#: ``agents``: JSON objects checked by ``AgentSpec.from_dict``, documented by its schema.
AgentList = Annotated[
    list[dict[str, Any]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {"title": "AgentSpec", **agent_json_schema()},
        }
    ),
]


class AnswerModel(BaseModel):
    """How answers are constrained (fixed ``choices`` or a ``regex``) and read (``extract``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    choices: list[str] | None = None
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
    schema["description"] = (
        "How the agents collaborate; mode-specific options ride along as extra fields "
        "(vote: style, wave, answer_tokens, debias [off|order|labels], "
        "adaptive [off|beta|window], confidence, soft, calibrate [off|position|content]; "
        "debate: layout [auto|threads|transcript]; reflect: validator; cascade: verify; "
        "best_of: validator, judge [auto|self|likelihood|off], "
        "judge_instructions, answer_tokens, wave, adaptive (with judge likelihood); "
        "auto: validator; "
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
                            "parameters": {"type": "object"},
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


#: Parameters a collaboration does not take (its agents' own fields say how they sample).
PLAIN_ONLY = (
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "frequency_penalty",
    "presence_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
)

#: A request with ``agents`` or ``collaboration`` (an explicit null is "not given").
_COLLABORATION = {
    "anyOf": [
        {"required": ["agents"], "properties": {"agents": {"type": "array"}}},
        {"required": ["collaboration"], "properties": {"collaboration": {"type": "object"}}},
    ]
}

#: Some message carries text: a non-blank content, a tool result or an assistant's calls.
_SOME_TEXT = {
    "anyOf": [
        {"properties": {"role": {"const": "tool"}}},
        {
            "required": ["tool_calls"],
            "properties": {"tool_calls": {"type": "array", "minItems": 1}},
        },
        {
            "required": ["content"],
            "properties": {
                "content": {
                    "anyOf": [
                        {"type": "string", "pattern": "\\S"},
                        {
                            "type": "array",
                            "contains": {
                                "required": ["text"],
                                "properties": {"text": {"type": "string", "pattern": "\\S"}},
                            },
                        },
                    ]
                }
            },
        },
    ]
}


def _bounds(param: str) -> dict[str, Any]:
    """The JSON Schema bounds of a sampling field a request shares with an agent."""
    rule = agent_field_rules()[param].json_schema()
    return {k: v for k, v in rule.items() if k in ("minimum", "maximum", "exclusiveMinimum")}


def _request_rules(schema: dict[str, Any]) -> None:
    """Document every rule of a request that JSON Schema can express (``_params`` enforces them).

    Undeclared parameters are refused (extra fields are kept to name them); bounds,
    the parameters a collaboration does not take, and what needs what are ``if``/``then``.
    """
    schema["additionalProperties"] = False
    props = schema["properties"]
    for name in ("temperature", "top_p"):
        props[name].update(_bounds(name))
    props["n"]["minimum"] = 1
    for name in ("frequency_penalty", "presence_penalty"):  # Sampling's bounds
        props[name].update(minimum=-2, maximum=2)
    props["min_p"].update(minimum=0, maximum=1)
    props["repetition_penalty"].update(exclusiveMinimum=0, maximum=2)
    props["seed"].update(minimum=-(2**63), maximum=2**63 - 1)
    for name in ("max_tokens", "max_completion_tokens"):
        props[name]["minimum"] = 1
        props[name]["description"] = (
            "At least 1; the prompt plus this budget must fit the model's context and the "
            "server's KV pool (a rule JSON Schema cannot express: it depends on the prompt)."
        )
    props["top_logprobs"].update(minimum=0, maximum=MAX_TOP_LOGPROBS)
    props["metadata"]["maxProperties"] = MAX_METADATA_PAIRS
    props["store"] = {"enum": [False, None], "description": "Completions are not stored."}
    props["service_tier"] = {"enum": ["auto", "default", None]}
    props["stop"] = {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
            {"type": "null"},
        ]
    }
    props["top_k"] = {
        "anyOf": [{"type": "integer", "minimum": 1}, {"const": -1}, {"type": "null"}],
        "description": "vLLM: sample from the k most likely (-1: all)",
    }
    props["tool_choice"] = {
        "anyOf": [
            {"enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
            {"type": "null"},
        ],
        "description": "Needs tools (unless none). A named function must be one of tools "
        "(a rule JSON Schema cannot express).",
    }
    props["tools"]["maxItems"] = MAX_TOOLS
    props["tools"]["description"] = (
        "Function tools of a plain completion: at least one (with agents, only an empty list, "
        "meaning none). Their names must be unique and each parameters a JSON Schema without "
        "$ref (rules JSON Schema cannot express)."
    )
    props["messages"]["contains"] = _SOME_TEXT
    props["messages"]["description"] = (
        "The conversation; some message carries text. A tool message must answer a call of "
        "an earlier assistant message (a rule JSON Schema cannot express)."
    )
    plain_only = {
        name: {"enum": [None, False]} if name != "tools" else {"maxItems": 0} for name in PLAIN_ONLY
    }
    agent_tokens = {"maximum": agent_field_rules()["max_tokens"].maximum}
    tools_active = {
        "required": ["tools"],
        "properties": {
            "tools": {"type": "array", "minItems": 1},
            "tool_choice": {"not": {"const": "none"}},
        },
    }
    json_format = {
        "required": ["response_format"],
        "properties": {
            "response_format": {
                "type": "object",
                "properties": {"type": {"enum": ["json_object", "json_schema"]}},
            }
        },
    }
    schema["allOf"] = [
        {
            "if": _COLLABORATION,
            "then": {
                "properties": {
                    "n": {"const": 1},
                    "max_tokens": agent_tokens,
                    "max_completion_tokens": agent_tokens,
                    **plain_only,
                }
            },
            "else": {
                "properties": {"tools": {"minItems": 1}},
                "allOf": [
                    {
                        "if": {
                            "required": ["tool_choice"],
                            "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}},
                        },
                        "then": {
                            "required": ["tools"],
                            "properties": {"tools": {"type": "array"}},
                        },
                    },
                    {"not": {"allOf": [tools_active, json_format]}},
                ],
            },
        },
        {
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer"}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        },
    ]


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI request plus ``agents`` and ``collaboration``.

    Every parameter is honoured or refused: an undeclared one is a 400 naming it
    (``REFUSED_PARAMETERS`` say why for OpenAI's own). ``user``, ``metadata``,
    ``safety_identifier`` identify a request and do not change its output;
    ``prompt_cache_key``, ``prompt_cache_options`` and ``prompt_cache_retention``
    retain its KV for the session's next turn (``server._sessions``). ``top_k``,
    ``min_p`` and ``repetition_penalty`` are vLLM's extra sampling parameters.
    """

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_request_rules)

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
        return options


def served_rules(
    document: dict[str, Any],
    *,
    models: Sequence[str],
    adapters: Sequence[str],
    modes: Sequence[str],
    server_tools: Sequence[str],
    max_n: int,
    max_agents_per_spec: int,
    max_total_agents: int,
) -> None:
    """Add to the OpenAPI ``document`` the rules that depend on this server, as it runs.

    The served models, the registered modes and adapters, the server's tools and its
    limits are known only at run time; the document is rebuilt when they change.
    """
    schemas = document["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]["properties"]
    request["model"] = {
        "enum": [*models, None],
        "description": 'A served model ("default" or null: the first served).',
    }
    request["n"]["maximum"] = max_n
    agents = request["agents"]["anyOf"][0]
    agents["maxItems"] = max_total_agents
    agents["description"] = (
        f"At most {max_total_agents} agents in all (the counts' sum), names unique, each "
        "adapter registered on its agent's model (rules JSON Schema cannot express)."
    )
    agent = agents["items"]["properties"]
    agent["count"]["maximum"] = min(
        agent["count"].get("maximum", max_agents_per_spec), max_agents_per_spec
    )
    agent["model"] = {**agent["model"], "enum": [*models, None]}
    agent["adapter"] = {**agent["adapter"], "enum": [*adapters, None]}
    collaboration = schemas["CollaborationModel"]["properties"]
    collaboration["mode"] = {
        "enum": list(modes),
        "description": "A registered collaboration mode (built-in or register_mode's); "
        "its options are its config's fields, checked by its own code too (value rules "
        "JSON Schema cannot express).",
    }
    schemas["CollaborationModel"]["allOf"] = [_mode_rules(name) for name in modes]
    collaboration["tools"] = {
        "anyOf": [
            {"type": "array", "items": {"enum": list(server_tools)}},
            {"type": "null"},
        ],
        "description": collaboration["tools"].get("description", ""),
    }


def _mode_rules(name: str) -> dict[str, Any]:
    """The options mode ``name`` takes: its config's fields (rounds only if it has rounds)."""
    op = get_mode(name)
    options = {f.name for f in attrs.fields(op.Config)} | {"mode", "tools", "tool_choice"}
    then: dict[str, Any] = {"propertyNames": {"enum": sorted(options)}}
    if not op.uses_rounds:
        then["properties"] = {"rounds": {"type": "null"}}
    return {"if": {"properties": {"mode": {"const": name}}}, "then": then}
