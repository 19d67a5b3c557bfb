"""Tool-call formats: which text a model writes for a call, named as vLLM's tool parsers are.

``serve --tool-call-parser NAME`` picks one per server (every model alike), as
``vllm serve`` does. Two are read, written and constrained here:

* ``hermes`` (the default): ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
  sections in free text (``_tool_calls.py`` holds its machinery).
* ``llama3_json`` (and ``llama4_json``, vLLM's alias of the same parser): a reply
  that *is* a call starts with a JSON object ``{"name": …, "parameters": {…}}``
  (after an optional ``<|python_tag|>``); several calls follow one another
  (``;``-separated, or as one JSON array). Text that does not start so is content.

``ToolFormat.templated``: render the tools and the history's calls with the
model's own chat template where that template has a tool format; set when the
parser is named (without the flag, the Hermes description goes into the
system turn, as before). ``ToolFormat.auto``: whether ``tool_choice: "auto"``
is allowed (vLLM's ``--enable-auto-tool-choice``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

#: what ``--tool-call-parser`` accepts here (vLLM's names), the format each reads
CALL_PARSERS: Mapping[str, Literal["hermes", "json"]] = {
    "hermes": "hermes",
    "llama3_json": "json",
    "llama4_json": "json",
}
#: the token a Llama 3.x model may write before a JSON call
PYTHON_TAG = "<|python_tag|>"


def _known(_: object, __: attrs.Attribute[str], value: str) -> None:
    if value not in CALL_PARSERS:
        raise ValueError(
            f"tool-call parser {value!r} is not read here (supported: {sorted(CALL_PARSERS)})"
        )


@attrs.frozen
class ToolFormat:
    """The tool-call format of one served model's replies.

    Attributes:
        parser: vLLM's name of the parser that reads the model's calls.
        templated: render the request's tools (and the history's calls and results)
            with the model's chat template where it has a tool format.
        auto: whether ``tool_choice: "auto"`` is allowed (vLLM refuses it unless
            ``--enable-auto-tool-choice``; without ``--tool-call-parser`` it always is).
    """

    parser: str = attrs.field(default="hermes", validator=_known)
    templated: bool = False
    auto: bool = True

    @property
    def json_calls(self) -> bool:
        """Whether a call is a bare JSON object (``llama3_json``), not a tagged section."""
        return CALL_PARSERS[self.parser] == "json"

    @property
    def arguments_key(self) -> str:
        """The key a call's arguments sit under in the text the model writes."""
        return "parameters" if self.json_calls else "arguments"


#: today's behaviour: Hermes calls, described in the system turn, ``auto`` allowed
HERMES = ToolFormat()


def json_system_text(listing: str) -> str:
    """The tool description for a ``llama3_json`` model whose template has no tool format."""
    return (
        "You may call functions to help with the user's request. The functions are:\n"
        f"{listing}\n"
        "To call a function, respond with only a JSON object in the format "
        '{"name": <function-name>, "parameters": <arguments-object>}, and nothing else.'
    )


def json_call_text(name: str, arguments: object) -> str:
    """One call as a ``llama3_json`` model writes it."""
    return json.dumps({"name": name, "parameters": arguments})


def json_body(text: str) -> str | None:
    """The text of a reply that starts a JSON call (its ``<|python_tag|>`` removed), or
    ``None`` when the reply is content (its first character is no ``{`` or ``[``)."""
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    return body if body.startswith(("{", "[")) else None


def json_undecided(text: str) -> bool:
    """Whether a streamed reply's start could still become a JSON call (only whitespace,
    or a prefix of ``<|python_tag|>`` and whitespace after it, so far)."""
    head = text.lstrip()
    if head.startswith(PYTHON_TAG):
        head = head[len(PYTHON_TAG) :].lstrip()
        return not head
    return not head or PYTHON_TAG.startswith(head)


def json_calls(body: str) -> list[Mapping[str, Any]]:
    """The calls at the start of ``body`` (``json_body``), in order, each normalized to
    ``{"name", "arguments"}``; reading stops at the first text that is no whole call (a
    cut one, trailing words). An object without a ``name`` string and an arguments
    object (``parameters`` or ``arguments``) is no call: then there are none."""
    decoder = json.JSONDecoder()
    found: list[object] = []
    at = 0
    while True:
        while at < len(body) and body[at] in " \t\r\n;,":
            at += 1
        if at >= len(body):
            break
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            if body.startswith("[", at):  # a cut array: the objects it completed
                found.extend(array_items(body, at + 1))
            break
        if isinstance(value, list):
            found.extend(value)
        elif isinstance(value, dict):
            found.append(value)
        else:
            break
    calls: list[Mapping[str, Any]] = []
    for item in found:
        call = _json_call(item)
        if call is None:
            return []
        calls.append(call)
    return calls


def array_items(body: str, at: int) -> list[object]:
    """The whole JSON values of the array whose first item starts at ``at`` (just past its
    ``[``), up to the end or the first value cut short: what a cut array completed."""
    decoder = json.JSONDecoder()
    items: list[object] = []
    while True:
        while at < len(body) and body[at] in " \t\r\n,":
            at += 1
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return items
        items.append(value)


def _json_call(item: object) -> Mapping[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("parameters", item.get("arguments"))
    if not isinstance(arguments, dict):
        return None
    return {"name": item["name"], "arguments": arguments}
