"""Tool calls on a model that was never trained for them: described, constrained, parsed.

The request's ``tools`` are described to the model in its system turn, in the
Hermes format that open models share (``<tools>…</tools>``, calls written as
``<tool_call>{"name": …, "arguments": {…}}</tool_call>``), and the engine's
structured outputs make every call valid JSON against its function's
``parameters`` schema, so even the 135M default model emits calls a client
can execute:

* ``tool_choice="required"`` or a named function: the whole reply is a call
  (a JSON array of calls when ``parallel_tool_calls``), under ``json_schema``.
* ``"auto"``: the model writes text freely; once it writes ``<tool_call>``,
  the section up to ``</tool_call>`` is constrained (vLLM's structural tags).
* ``"none"``: the tools are not described and nothing is parsed.

An assistant message with ``tool_calls`` and a ``tool`` message in the history
are rendered back in the same format, so a conversation continues after a
tool result.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from ._errors import RequestRefused
from ._tool_formats import (
    HERMES,
    ToolFormat,
    array_items,
    json_body,
    json_call_text,
    json_calls,
    json_system_text,
    json_undecided,
)
from ._types import Sampling, TaggedJson

#: What a tool may be called (OpenAI's rule); ``TOOL_NAME_PATTERN`` is its JSON Schema form.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_NAME_PATTERN = f"^{TOOL_NAME.pattern}$"

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
#: the longest string argument a call may write when its schema sets no bound (``bounded_strings``)
ARGUMENT_STRING_LENGTH = 64
#: the most calls one reply may make when ``parallel_tool_calls`` (a bound for tiny models)
MAX_PARALLEL_CALLS = 8

ToolChoice = Literal["none", "auto", "required", "named"]


@attrs.frozen
class FunctionTool:
    """One ``{"type": "function", "function": {...}}`` entry of ``tools``."""

    name: str
    description: str
    parameters: Mapping[str, Any] = attrs.field(hash=False)

    def describe(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@attrs.frozen
class ToolPlan:
    """How one request uses its tools: which are offered, how calls are constrained.

    ``parallel``: ``parallel_tool_calls`` as the client sent it (``None``: not sent).
    A whole reply is a JSON array of calls only when it is ``True``; otherwise one
    call (OpenAI's default permits several calls, it never requires them, and a
    small model asked for an array repeats its call until ``max_tokens`` cuts it:
    on the default model, 3 of 10 LangGraph-style requests made no call as an
    array, 0 of 10 as one call). An ``auto`` reply may write several
    ``<tool_call>`` sections unless it is ``False``.
    """

    tools: tuple[FunctionTool, ...]
    choice: ToolChoice
    named: str | None = None
    parallel: bool | None = None
    #: the text a call is written in (``llama3_json``: a bare JSON object); Hermes by default
    call_format: ToolFormat = HERMES

    @property
    def active(self) -> bool:
        """Whether the model may call a tool at all."""
        return bool(self.tools) and self.choice != "none"

    @property
    def whole_reply(self) -> bool:
        """Whether the reply is nothing but calls (``required`` or a named function)."""
        return self.choice in ("required", "named")

    def offered(self) -> tuple[FunctionTool, ...]:
        if self.choice == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools

    def system_text(self) -> str:
        """The tool description the model reads in its system turn."""
        listing = "\n".join(json.dumps(t.describe()) for t in self.offered())
        if self.call_format.json_calls:
            return json_system_text(listing)
        return (
            "You may call functions to help with the user's request. The functions are "
            f"described inside <tools></tools>:\n<tools>\n{listing}\n</tools>\n"
            "To call a function, write a JSON object with its name and arguments inside "
            f'{CALL_OPEN}{CALL_CLOSE} tags: {CALL_OPEN}{{"name": <function-name>, '
            f'"arguments": <arguments-object>}}{CALL_CLOSE}'
        )

    def call_schema(self, budget: int | None = None) -> dict[str, Any]:
        """The JSON schema of one call to one of the offered functions.

        ``budget``: the reply's ``max_tokens`` when the whole reply is the call. Its free
        strings are then bounded so that the call closes within it (``string_bound``):
        under a grammar the default model runs a string on (a digit per token) until
        the budget cuts the call, and a cut call is no call. The arguments sit under
        the key the format's parser reads (``parameters`` for ``llama3_json``).
        """
        key = self.call_format.arguments_key
        branches = [
            {
                "type": "object",
                "properties": {
                    "name": {"enum": [t.name]},
                    key: bounded_strings(
                        t.parameters,
                        ARGUMENT_STRING_LENGTH
                        if budget is None
                        else string_bound(t.name, t.parameters, budget),
                    )
                    or {"type": "object"},
                },
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t in self.offered()
        ]
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def constrain(self, sampling: Sampling) -> Sampling:
        """``sampling`` with the constraint that keeps this plan's calls valid.

        ``required`` and a named function: the grammar is the call itself (its first
        token opens the call), sized to close within ``sampling.max_tokens``. An
        ``auto`` reply in a JSON format is not constrained (a call is told from text by
        its first character only): it is parsed, and a call that is no JSON is content.
        """
        if not self.active:
            return sampling
        if self.whole_reply:
            schema = self.call_schema(sampling.max_tokens)
            if self.parallel is True:
                schema = {
                    "type": "array",
                    "items": schema,
                    "minItems": 1,
                    "maxItems": MAX_PARALLEL_CALLS,
                }
            return attrs.evolve(sampling, json_schema=json.dumps(schema))
        if self.call_format.json_calls:
            return sampling
        stop = sampling.stop if self.parallel is not False else (*sampling.stop, CALL_CLOSE)
        tagged = TaggedJson(CALL_OPEN, json.dumps(self.call_schema()), CALL_CLOSE)
        return attrs.evolve(sampling, tagged=tagged, stop=stop)

    def parse(self, text: str, *, complete: bool = True) -> tuple[str | None, list[dict[str, Any]]]:
        """The reply's content (``None`` when it is only calls) and its ``tool_calls``.

        ``complete=False``: the reply was cut short (``max_tokens``). Its whole calls
        still count, a partial one never becomes content: a whole-reply plan's cut
        array gives the calls it completed and no content (OpenAI's ``length``
        answer carries no half-written call), an ``auto`` reply keeps the text
        before its first ``<tool_call>``. Identical calls in one reply are made
        once (a small model repeats its call until the budget ends).
        """
        if not self.active:
            return text, []
        if self.call_format.json_calls:
            return self._parse_json(text, complete=complete)
        if self.whole_reply:
            try:
                value = json.loads(text)
            except ValueError:  # cut short: the calls it completed, never raw JSON
                return (None if not complete else text), _unique(_whole_items(text))
            items = value if isinstance(value, list) else [value]
            return None, _unique(c for c in items if isinstance(c, dict))
        head, sep, rest = text.partition(CALL_OPEN)
        if not sep:
            return text, []
        calls: list[Mapping[str, Any]] = []
        for section in (CALL_OPEN + rest).split(CALL_OPEN)[1:]:
            body = section.split(CALL_CLOSE, 1)[0].strip()
            try:
                value = json.loads(body)
            except ValueError:  # a section cut short: not a call
                continue
            if isinstance(value, dict):
                calls.append(value)
        content = head.strip() or None
        if calls:
            return content, _unique(calls)
        return (text, []) if complete else (content, [])

    def _parse_json(self, text: str, *, complete: bool) -> tuple[str | None, list[dict[str, Any]]]:
        """``parse`` for a JSON format: a reply that starts with a call is calls only
        (what follows its last whole call is dropped, as vLLM's parser drops it)."""
        body = json_body(text)
        calls = json_calls(body) if body is not None else []
        if calls:
            return None, _unique(calls)
        if body is not None and (self.whole_reply or not complete):
            return (None if not complete else text), []  # a cut call is never content
        return text, []


def bounded_strings(
    schema: Mapping[str, Any], limit: int = ARGUMENT_STRING_LENGTH
) -> dict[str, Any]:
    """A copy of ``schema`` whose free strings are at most ``limit`` characters long.

    A small model under a grammar can write a string argument that never ends (a
    digit run, a repeated word) until ``max_tokens`` cuts the call. A string with
    no ``maxLength``, ``pattern``, ``format``, ``enum`` or ``const`` of its own gets
    the bound; a client that needs longer strings sets ``maxLength`` itself.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, Mapping):
            return node
        out = {k: walk(v) for k, v in node.items()}
        if _free_string(out):
            out["maxLength"] = limit
        return out

    return dict(walk(schema))


def string_bound(name: str, parameters: Mapping[str, Any], budget: int) -> int:
    """The longest free string argument (at most ``ARGUMENT_STRING_LENGTH``) that lets a
    call to ``name`` close within ``budget`` tokens, each free string written in full.

    The grammar allows no free whitespace, and a token is at least one character, so a
    string of n characters costs at most n tokens; the call's other text (names, keys,
    punctuation) is counted as half its characters (it runs at about three a token on
    the default model's tokenizer), a string the client bounded itself as 16 at most.
    """
    chars, free = _skeleton(parameters)
    frame = len(json.dumps({"name": name, "arguments": {}}, separators=(",", ":"))) - 2
    room = budget - (frame + chars + 1) // 2
    return max(1, min(ARGUMENT_STRING_LENGTH, room // max(1, free)))


def _free_string(node: Mapping[str, Any]) -> bool:
    types = node.get("type")
    strings = types == "string" or (isinstance(types, list) and "string" in types)
    bounded = any(k in node for k in ("maxLength", "pattern", "format", "enum", "const"))
    return strings and not bounded


def _skeleton(node: object) -> tuple[int, int]:
    """A compact instance of ``node``'s characters beside its free strings, and how many
    free strings it writes (an array's items once, a choice's widest branch)."""
    if not isinstance(node, Mapping):
        return 4, 0
    if "const" in node:
        return len(json.dumps(node["const"])), 0
    if isinstance(node.get("enum"), list) and node["enum"]:
        return max(len(json.dumps(v)) for v in node["enum"]), 0
    branches = node.get("anyOf") or node.get("oneOf")
    if isinstance(branches, list) and branches:
        sizes = [_skeleton(b) for b in branches]
        return max(c for c, _ in sizes), max(f for _, f in sizes)
    if _free_string(node):
        return 2, 1
    types = node.get("type")
    kind = types[0] if isinstance(types, list) and types else types
    if kind == "string":
        length = node.get("maxLength")  # the client's own bound: it may hold the budget
        return 2 + min(length if isinstance(length, int) else 16, 16), 0
    if kind == "object" or isinstance(node.get("properties"), Mapping):
        props = node.get("properties")
        chars, free = 2, 0
        for key, child in props.items() if isinstance(props, Mapping) else ():
            c, f = _skeleton(child)
            chars, free = chars + len(json.dumps(key)) + 2 + c, free + f
        return chars, free
    if kind == "array":
        c, f = _skeleton(node.get("items"))
        return 2 + c, f
    return 5, 0


def _whole_items(text: str) -> list[Mapping[str, Any]]:
    """The objects a cut JSON array (or a lone object) completed before it was cut."""
    at = len(text) - len(text.lstrip())
    if not text.startswith("[", at):
        return []
    return [value for value in array_items(text, at + 1) if isinstance(value, dict)]


def _unique(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each distinct call once, in order, as ``tool_calls`` entries."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for item in items:
        key = json.dumps([item.get("name"), item.get("arguments", {})], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(_call(item))
    return out


def _call(value: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": str(value.get("name", "")),
            "arguments": json.dumps(value.get("arguments", {})),
        },
    }


class ToolCallStream:
    """Splits a streamed ``auto`` reply into content to send now and calls for the end.

    Text is released as content until ``<tool_call>`` appears; a tail that could
    still grow into the tag is held back. From the tag on, everything is kept
    for ``ToolPlan.parse``. A ``whole_reply`` plan releases no content at all.
    """

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._text = ""  # everything fed so far (one string: feed runs once per delta)
        self._sent = 0
        self._in_call = plan.whole_reply and plan.active
        self._json = plan.call_format.json_calls
        self._decided = False  # a JSON format: whether the reply's start told call from text

    def feed(self, text: str) -> str:
        """Add streamed text; returns the content that can be sent now."""
        self._text += text
        whole = self._text
        if self._in_call or not self._plan.active:
            return "" if self._in_call else self._release(len(whole))
        if self._json:  # the first character tells a call from text: hold until it shows
            if not self._decided:
                if json_undecided(whole):
                    return ""
                self._decided = True
                self._in_call = json_body(whole) is not None
                if self._in_call:
                    return ""
            return self._release(len(whole))
        at = whole.find(CALL_OPEN, max(0, self._sent - len(CALL_OPEN)))
        if at >= 0:
            self._in_call = True
            return self._release(at)
        hold = _partial_tag(whole)
        return self._release(len(whole) - hold)

    @property
    def text(self) -> str:
        return self._text

    def finish(self, *, complete: bool = True) -> tuple[str, list[dict[str, Any]]]:
        """The content not sent yet and the reply's calls, once the generation ended.

        ``complete=False``: it was cut short (``ToolPlan.parse``): a partial call is
        never sent as content.
        """
        content, calls = self._plan.parse(self.text, complete=complete)
        if calls or not complete:
            unsent = (content or "")[self._sent :] if not self._plan.whole_reply else ""
            return unsent.rstrip(), calls
        return self.text[self._sent :], []

    def _release(self, end: int) -> str:
        end = max(end, self._sent)
        out = self._text[self._sent : end]
        self._sent = end
        return out


def _partial_tag(text: str) -> int:
    """How many trailing characters of ``text`` could begin ``<tool_call>``."""
    for n in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-n:]):
            return n
    return 0


# -- conversations --------------------------------------------------------------------------------


def render_tool_calls(
    content: str | None,
    calls: Sequence[Mapping[str, Any]],
    where: str,
    call_format: ToolFormat = HERMES,
) -> str:
    """An assistant turn that made ``calls``, as the model wrote it (content, then the calls)."""
    parts = [content] if content else []
    written: list[str] = []
    for j, call in enumerate(calls):
        field = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise RequestRefused(f"{field}.function", "function.name is required")
        raw = fn.get("arguments", "{}")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise RequestRefused(
                f"{field}.function.arguments", "function.arguments must be JSON text"
            ) from None
        if call_format.json_calls:
            written.append(json_call_text(fn["name"], arguments))
        else:
            written.append(
                f"{CALL_OPEN}{json.dumps({'name': fn['name'], 'arguments': arguments})}{CALL_CLOSE}"
            )
    if call_format.json_calls:  # the calls one after another, as the parser reads them
        written = ["; ".join(written)] if written else []
    return "\n".join([*parts, *written])


def render_tool_result(content: str, call_format: ToolFormat = HERMES) -> str:
    """A ``tool`` message's content as the model reads it (a JSON format: as it is)."""
    if call_format.json_calls:
        return content
    return f"<tool_response>\n{content}\n</tool_response>"


def with_tool_instructions(
    messages: Sequence[Mapping[str, Any]], plan: ToolPlan
) -> list[dict[str, Any]]:
    """``messages`` with the plan's tool description in the (first) system turn."""
    out = [dict(m) for m in messages]
    if not plan.active:
        return out
    tools = plan.system_text()
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{tools}".lstrip()
    else:
        out.insert(0, {"role": "system", "content": tools})
    return out
