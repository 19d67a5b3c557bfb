"""A chat template given by the user (vLLM's ``--chat-template``): read and compiled.

``load_chat_template`` takes the flag's value as vLLM does: the path of a file
holding the template, or the template itself inline; a value that is neither (no
file there, and not a template: no ``{``, ``}`` or newline) is refused by name
rather than served as literal text. ``check_chat_template`` parses it, so broken
Jinja is refused when the server starts, not at the first request.
``jinja_renderer`` renders one the way transformers does (``JinjaRenderer``, the
same environment as a template's tool rendering), its errors naming the flag: the
ScriptedEngine renders with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._chat import Renderer
from ._tool_template import JinjaRenderer, jinja_environment

#: characters only a template has (vLLM's test of a value that is not a path)
_TEMPLATE_CHARS = "{}\n"


def load_chat_template(value: str, *, option: str = "--chat-template") -> str:
    """The template ``value`` names: a file's text, or ``value`` itself when inline.

    Raises:
        ValueError: ``value`` looks like a path but no file can be read there, or the
            file is empty (the message names ``option``).
    """
    path = Path(value).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if any(c in value for c in _TEMPLATE_CHARS):
            return value  # an inline template
        raise ValueError(
            f"{option} {value!r}: no chat template file there ({exc}); give a file path "
            "or the template itself"
        ) from None
    if not text.strip():
        raise ValueError(f"{option} {value!r}: the file is empty")
    return text


def check_chat_template(template: str, *, option: str = "--chat-template") -> None:
    """Refuse a template whose Jinja syntax is broken (only parsed: the filters and
    globals a tokenizer adds are for the engine to resolve when it renders).

    Raises:
        ValueError: the syntax error, its line, and ``option`` named.
    """
    from jinja2 import TemplateSyntaxError

    try:
        jinja_environment().parse(template)
    except TemplateSyntaxError as exc:
        raise ValueError(
            f"{option}: the chat template is not valid Jinja (line {exc.lineno}: {exc.message})"
        ) from None


def jinja_renderer(template: str, *, option: str = "--chat-template", **context: Any) -> Renderer:
    """``template`` compiled: a ``render(messages, add_generation_prompt) -> text``.

    Args:
        template: the Jinja text of a chat template.
        option: what to name in an error.
        context: more variables the template sees (``bos_token``, ``eos_token``…).

    Raises:
        ValueError: the template does not compile; ``render`` raises it too when the
            template refuses the messages (the message names ``option``).
    """
    from jinja2 import TemplateError

    check_chat_template(template, option=option)
    try:
        compiled = JinjaRenderer(template, **context)
    except TemplateError as exc:
        raise ValueError(f"{option}: the chat template does not compile: {exc}") from None

    def render(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return compiled(messages, add_generation_prompt)
        except TemplateError as exc:  # raise_exception(...) or a render-time error
            raise ValueError(f"{option}: the chat template refused the messages: {exc}") from None

    return render
