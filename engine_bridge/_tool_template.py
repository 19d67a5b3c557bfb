"""A chat template rendered whole, tools and tool calls included: the model's own tool format.

Token-level composition (``_chat.py``) splices contents between the template's
fragments and never shows the template a tool. A template with a tool format
(Llama 3.1's, Qwen 2.5's, Mistral's…) places the tools itself (in the system
turn, in the first user turn…) and writes an assistant's ``tool_calls`` and a
``tool`` turn's result its own way. ``has_tool_format`` tells such a template
(rendering with ``tools=[…]`` changes the text); the composer then renders the
whole conversation through it (``ChatComposer.render_prompt``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn, Protocol

#: the tool ``has_tool_format`` offers a template to see whether it renders tools
PROBE_TOOL: Mapping[str, object] = {
    "type": "function",
    "function": {
        "name": "probe_tool_format",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}


class ChatRenderer(Protocol):
    """Renders a whole conversation with the model's chat template, to text.

    Messages are OpenAI-shaped dicts (``role``, ``content``, an assistant's
    ``tool_calls`` with ``arguments`` as an object, a tool turn's
    ``tool_call_id``); ``tools`` the OpenAI ``tools`` list or ``None``.
    """

    def __call__(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> str: ...

    def __hash__(self) -> int: ...  # ``has_tool_format`` caches per renderer


@functools.lru_cache(maxsize=64)
def has_tool_format(render: ChatRenderer) -> bool:
    """Whether the template renders tools (its text changes when given one); cached per
    renderer, so per model. A template that fails on tools has none."""
    probe = [{"role": "user", "content": "hello"}]
    try:
        plain = render(probe, True)
        with_tools = render(probe, True, [PROBE_TOOL])
    except Exception:  # a template that raises on tools (raise_exception), or on the probe
        return False
    return plain != with_tools


def jinja_environment() -> Any:
    """A Jinja environment as Hugging Face renders chat templates in: sandboxed, blocks
    trimmed, ``loopcontrols``, ``tojson``, ``raise_exception`` and ``strftime_now``."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> NoReturn:
        raise TemplateError(message)

    def tojson(value: object, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class JinjaRenderer:
    """A Jinja chat template rendered as Hugging Face renders it (``jinja_environment``),
    without a tokenizer.

    Args:
        source: the template's text (a tokenizer's ``chat_template``).
        special: variables the template reads, e.g. ``bos_token``, ``eos_token``.
    """

    def __init__(self, source: str, **special: str) -> None:
        self.source = source
        self._template = jinja_environment().from_string(source)
        self._special = dict(special)

    def __call__(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
    ) -> str:
        return str(
            self._template.render(
                messages=[dict(m) for m in messages],
                tools=None if tools is None else [dict(t) for t in tools],
                add_generation_prompt=add_generation_prompt,
                **self._special,
            )
        )
