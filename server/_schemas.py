"""Request models of the HTTP API: OpenAI Chat Completions plus ``agents`` and ``collaboration``.

Only requests are modelled with pydantic (they drive validation and the
OpenAPI schema); responses are plain dicts built in ``_app``. Types are
strict — a string where a number belongs is a 400, not a silent coercion.
An agent is not modelled here: its schema is ``AgentSpec``'s (``agent_json_schema``)
and ``AgentSpec.from_dict`` validates it, so the two can never disagree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..collab import agent_json_schema, graph_json_schema

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
    """How answers are constrained: fixed ``choices`` or a ``regex``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    choices: list[str] | None = None
    regex: str | None = None


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
        "(vote: style, wave; reflect: validator; cascade: verify; "
        "graph: nodes, edges, entry, output)."
    )


class CollaborationModel(BaseModel):
    """How the agents collaborate; mode-specific options ride along as extra fields."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_graph_properties)

    mode: str = Field(min_length=1, max_length=128)
    early_stop: bool = True
    rounds: int | None = None
    answer: AnswerModel | None = None


class ContentPart(BaseModel):
    """One part of a multi-part message content (only text is supported)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    """OpenAI ``stream_options``."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: the OpenAI request plus ``agents`` and ``collaboration``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    n: int = 1
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
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
