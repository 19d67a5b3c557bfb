"""Token-level chat composition: prompts are built from token ids, never re-tokenized text.

A model's chat template is rendered once with sentinel contents and split on
the sentinels; only the template's own fragments (turn opens, turn closes, the
generation prompt) are tokenized. Contents are spliced in as token ids — text
is tokenized on its own, a ``KVHandle`` is used exactly as the engine made it —
so a handle that sits in the prefix cache stays a cache hit inside any prompt.

Splitting rule (``ChatTemplate.from_renderer``): the text between two contents
is cut right after the end-of-turn text plus any whitespace that follows it.
What comes before the cut closes the earlier turn (e.g. ChatML ``<|im_end|>\\n``),
what comes after opens the next one, starting at its role marker (e.g.
``<|im_start|>user\\n``). Text before the first content is the document prefix
(a BOS token, say) followed by the first turn's open; the open is found by its
role marker (the user open with ``user`` replaced by the role's name). Text
between two contents without any end-of-turn text is all open (empty close).

Compose with what is shared *first* (the task context) and what is
role-specific after it, or nothing is shared in the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

import attrs

from ._bridge import EngineBridge
from ._handle import AdapterRef, KVHandle
from ._tool_template import ChatRenderer, has_tool_format

Renderer = Callable[[list[dict[str, str]], bool], str]
Encoder = Callable[[str], list[int]]
Tokens = tuple[int, ...]

_DEFAULT_ROLES = ("system", "user", "assistant")
#: what ``ChatComposer.splice`` puts between a spliced handle and text that follows it
SEGMENT_SEPARATOR = "\n\n"


def _ids(ids: Iterable[int]) -> Tokens:
    return tuple(int(t) for t in ids)


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _freeze(mapping: Mapping[str, Sequence[int]]) -> Mapping[str, Tokens]:
    return MappingProxyType({role: tuple(ids) for role, ids in mapping.items()})


@attrs.frozen
class ChatTemplate:
    """Token ids of the template fragments around each turn.

    Attributes:
        opens: per role, the ids before the content (the turn open, role marker included).
        closes: per role, the ids after the content (the turn close: the end-of-turn
            token and what follows it up to the next role marker).
        generation: the ids that open the assistant turn to generate (``add_generation_prompt``).
        eot_token_id: the end-of-turn token (ChatML: ``<|im_end|>``).
        prefix: the ids at the start of every conversation (e.g. a BOS token); often empty.
        default_system: the ids of the system turn the template inserts when a
            conversation does not start with a system message (SmolLM2's does);
            composition inserts it the same way, so prompts equal the template's
            own rendering (and vLLM's OpenAI server's).
        markers: the texts of the tokens that end a turn or a text (the end-of-turn
            token's first); they never belong to a message's content.
    """

    opens: Mapping[str, Tokens] = attrs.field(converter=_freeze, hash=False)
    closes: Mapping[str, Tokens] = attrs.field(converter=_freeze, hash=False)
    generation: Tokens = attrs.field(converter=_ids)
    eot_token_id: int
    prefix: Tokens = attrs.field(default=(), converter=_ids)
    default_system: Tokens = attrs.field(default=(), converter=_ids)
    markers: tuple[str, ...] = attrs.field(default=(), converter=_strings, eq=False)

    def __attrs_post_init__(self) -> None:
        if set(self.opens) != set(self.closes):
            raise ValueError("opens and closes must name the same roles")

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles this template can compose."""
        return tuple(self.opens)

    def open(self, role: str) -> Tokens:
        """The ids that open a ``role`` turn."""
        try:
            return self.opens[role]
        except KeyError:
            raise ValueError(
                f"role {role!r} is not in the chat template (roles: {self.roles})"
            ) from None

    def close(self, role: str) -> Tokens:
        """The ids that close a ``role`` turn (end-of-turn token included)."""
        try:
            return self.closes[role]
        except KeyError:
            raise ValueError(
                f"role {role!r} is not in the chat template (roles: {self.roles})"
            ) from None

    def close_after(self, role: str, content: Sequence[int]) -> Tokens:
        """The part of ``role``'s close still needed after ``content``.

        A content that already ends with the end-of-turn token (a generation that
        stopped on it) gets only what follows the token; one that already ends
        with the whole close gets nothing. Never a second end-of-turn token.
        """
        close = self.close(role)
        eot = self.eot_token_id
        if eot not in close:
            return close
        tail = close[close.index(eot) + 1 :]
        head = close[: len(close) - len(tail)]
        ids = tuple(content)
        if ids[-len(close) :] == close:
            return ()
        if ids[-len(head) :] == head or (ids and ids[-1] == eot):
            return tail
        return close

    # -- construction ------------------------------------------------------------------
    @classmethod
    def chatml(
        cls,
        encode: Encoder,
        eot_token_id: int,
        roles: Sequence[str] = _DEFAULT_ROLES,
    ) -> ChatTemplate:
        """The ChatML template (``<|im_start|>role\\n … <|im_end|>\\n``).

        Args:
            encode: text to ids, special-token text mapped to the special tokens.
            eot_token_id: the id of ``<|im_end|>``.
            roles: the roles to support.
        """
        newline = tuple(encode("\n"))
        opens = {r: tuple(encode(f"<|im_start|>{r}\n")) for r in roles}
        closes = {r: (eot_token_id, *newline) for r in roles}
        generation = tuple(encode("<|im_start|>assistant\n"))
        markers = ("<|im_end|>", "<|endoftext|>")
        return cls(opens, closes, generation, eot_token_id, markers=markers)

    @classmethod
    def from_renderer(
        cls,
        render: Renderer,
        encode: Encoder,
        eot_token_id: int,
        eot_text: str,
        roles: Sequence[str] = _DEFAULT_ROLES,
        markers: Sequence[str] = (),
    ) -> ChatTemplate:
        """Derive the fragments by rendering the template with sentinel contents.

        The fragments are derived from a rendering that starts with a system
        message; a default system turn that the template inserts when none is
        given (SmolLM2's does) is derived separately (``default_system``) and
        inserted by ``ChatComposer.context`` in the same case. See the module
        docstring for the splitting rule.

        Args:
            render: ``render(messages, add_generation_prompt) -> text``, e.g.
                ``lambda m, g: tok.apply_chat_template(m, tokenize=False,
                add_generation_prompt=g)``.
            encode: text to ids for template fragments (special-token text mapped
                to the special tokens, no BOS added), e.g.
                ``lambda s: tok.encode(s, add_special_tokens=False)``.
            eot_token_id: the end-of-turn token id.
            eot_text: its text (what ``render`` writes for it).
            roles: the roles to support; must include ``"user"`` and ``"assistant"``.
            markers: texts of other tokens that end a text (an end-of-sequence token).

        Raises:
            ValueError: the template drops or reorders contents, or lacks a role.
        """
        if "user" not in roles or "assistant" not in roles:
            raise ValueError("roles must include 'user' and 'assistant'")
        base = ["system", "user", "assistant"] if "system" in roles else ["user", "assistant"]
        seq = [*base, "user"]
        parts = _render_parts(render, seq, add_generation_prompt=False)
        opens: dict[str, str] = {}
        closes: dict[str, str] = {}
        for i in range(len(seq) - 1):
            close, open_ = _split_between(parts[i + 1], eot_text)
            closes.setdefault(seq[i], close)
            opens.setdefault(seq[i + 1], open_)
        prefix, first_open = _split_first(parts[0], seq[0], opens)
        opens.setdefault(seq[0], first_open)
        for role in roles:
            if role in opens:
                continue
            extra = _render_parts(render, [*base, role, "user"], add_generation_prompt=False)
            k = len(base)
            _, opens[role] = _split_between(extra[k], eot_text)
            closes[role], _ = _split_between(extra[k + 1], eot_text)
        head = [{"role": r, "content": _sentinel(i)} for i, r in enumerate(base[:-1])]
        with_gen = render(head, True)
        without = render(head, False)
        generation = (
            with_gen[len(without) :] if with_gen.startswith(without) else opens["assistant"]
        )

        default_system = ""
        if "system" in roles:
            user_first = _render_parts(render, ["user"], add_generation_prompt=False)[0]
            if user_first.startswith(prefix) and user_first.endswith(opens["user"]):
                default_system = user_first[len(prefix) : len(user_first) - len(opens["user"])]

        def ids(text: str) -> Tokens:
            return tuple(encode(text)) if text else ()

        return cls(
            {r: ids(opens[r]) for r in roles},
            {r: ids(closes[r]) for r in roles},
            ids(generation),
            eot_token_id,
            ids(prefix),
            ids(default_system),
            (eot_text, *(m for m in markers if m and m != eot_text)),
        )


def _sentinel(i: int) -> str:
    return f"MICROAGENTSENTINEL{i}X"


def _render_parts(
    render: Renderer, roles: Sequence[str], *, add_generation_prompt: bool
) -> list[str]:
    messages = [{"role": r, "content": _sentinel(i)} for i, r in enumerate(roles)]
    text = render(messages, add_generation_prompt)
    parts: list[str] = []
    pos = 0
    for i, role in enumerate(roles):
        sentinel = _sentinel(i)
        at = text.find(sentinel, pos)
        if at < 0:
            raise ValueError(f"the chat template dropped or reordered message {i} ({role!r})")
        parts.append(text[pos:at])
        pos = at + len(sentinel)
    parts.append(text[pos:])
    return parts


def _split_between(text: str, eot_text: str) -> tuple[str, str]:
    """Cut after the end-of-turn text and the whitespace that follows it."""
    at = text.find(eot_text)
    if at < 0:
        return "", text
    end = at + len(eot_text)
    while end < len(text) and text[end].isspace():
        end += 1
    return text[:end], text[end:]


def _split_first(text: str, role: str, opens: Mapping[str, str]) -> tuple[str, str]:
    """Separate the document prefix from the first turn's open (found by its role marker)."""
    marker = opens.get(role)
    if marker is None and "user" in opens.get("user", ""):
        marker = opens["user"].replace("user", role, 1)
    if marker:
        at = text.rfind(marker)
        if at >= 0:
            return text[:at], text[at:]
    return "", text


@attrs.frozen
class Message:
    """One chat turn: text, or a handle whose token ids are spliced in as they are."""

    role: str
    content: str | KVHandle


MessageLike = Message | Mapping[str, "str | KVHandle"]


@attrs.frozen(eq=False)
class ChatComposer:
    """Builds prompt handles turn by turn from a ``ChatTemplate`` and a bridge.

    Every method returns a handle that *extends* its input (the input is its
    parent), so lineage — and with it cache-miss detection — is kept.

    ``renderer``: the model's chat template rendered whole (``render_prompt``), for a
    conversation with tools when the template has a tool format of its own.
    """

    template: ChatTemplate
    bridge: EngineBridge
    renderer: ChatRenderer | None = None

    def renders_tools(self) -> bool:
        """Whether the model's template has a tool format (cached per template)."""
        return self.renderer is not None and has_tool_format(self.renderer)

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None,
        *,
        adapter: str | AdapterRef | None = None,
    ) -> KVHandle:
        """The whole conversation rendered by the template, generation prompt included, as
        one handle: ``tools`` and the messages' ``tool_calls``/``tool`` turns where the
        template puts them. Its text is tokenized once (special-token text becoming the
        special tokens), as vLLM's own server does.

        Raises:
            ValueError: no renderer, or the template refused the conversation.
        """
        if self.renderer is None:
            raise ValueError(f"model {self.bridge.model!r} has no chat template to render")
        try:
            text = self.renderer(messages, True, tools)
        except ValueError:
            raise
        except Exception as exc:  # jinja's TemplateError: the template's own message
            raise ValueError(f"the chat template refused the conversation: {exc}") from None
        return self.bridge.handle(self.bridge.tokenize(text), adapter=adapter)

    def context(
        self,
        messages: Sequence[MessageLike],
        *,
        adapter: str | AdapterRef | None = None,
    ) -> KVHandle:
        """A handle of the whole conversation ``messages`` (no generation prompt).

        Like the template itself, it starts with the template's default system
        turn when the first message is not a system message.
        """
        handle = self._start(adapter)
        first_role = _unpack(messages[0])[0] if messages else None
        if self.template.default_system and first_role != "system":
            handle = handle.extend(self.template.default_system)
        for message in messages:
            role, content = _unpack(message)
            handle = self.append(handle, role, content)
        return handle

    def _start(self, adapter: str | AdapterRef | None) -> KVHandle:
        """The handle every conversation starts from: the template's prefix ids."""
        return self.bridge.handle(self.template.prefix, adapter=adapter)

    def prompt(
        self,
        messages: Sequence[MessageLike],
        *,
        adapter: str | AdapterRef | None = None,
    ) -> KVHandle:
        """``context(messages)`` followed by the generation prompt."""
        return self.generation_prompt(self.context(messages, adapter=adapter))

    def turn(self, role: str, content: str | KVHandle | Sequence[int]) -> Tokens:
        """The ids of one whole turn (open, content, close)."""
        if isinstance(content, KVHandle):
            if content.model != self.bridge.model:
                raise ValueError(
                    f"a {content.model!r} handle cannot be spliced into a {self.bridge.model!r} "
                    "prompt; re-tokenize it explicitly"
                )
            ids: Tokens = content.token_ids
        elif isinstance(content, str):
            ids = tuple(self.bridge.tokenize(content)) if content else ()
        else:
            ids = tuple(content)
        return (*self.template.open(role), *ids, *self.template.close_after(role, ids))

    def append(self, handle: KVHandle, role: str, content: str | KVHandle) -> KVHandle:
        """``handle`` followed by one ``role`` turn.

        A handle's content is spliced as token ids, never re-tokenized; when it
        already ends with the end-of-turn token (a generation that stopped), no
        second one is added.
        """
        return handle.extend(self.turn(role, content))

    def generation_prompt(self, handle: KVHandle) -> KVHandle:
        """``handle`` followed by the opening of the assistant turn to generate."""
        return handle.extend(self.template.generation)

    def close_turn(self, handle: KVHandle, role: str = "assistant") -> KVHandle:
        """Close the turn a generation left open.

        Adds the end-of-turn token (and what follows it) only when the output did
        not end with it (``finish_reason="length"``); otherwise only what follows it.
        """
        return handle.extend(self.template.close_after(role, handle.token_ids))

    def splice(self, pieces: Sequence[str | KVHandle]) -> Tokens:
        """Token ids of mixed content: text is tokenized, handles are spliced as they are.

        A handle spliced mid-turn drops its trailing end-of-turn token (a generation
        that stopped ends with one), so a turn never holds a stray end-of-turn.
        Whatever follows a spliced handle starts on a new line: unless the next
        text already starts with a line break, ``SEGMENT_SEPARATOR`` (a blank line)
        is put between them. Without it an instruction after a peer's answer reads
        as that answer's continuation ("...is 12These are the answers...") and a
        small model parrots the seam.
        """
        eot_id = self.template.eot_token_id
        ids: list[int] = []
        after_handle = False
        for piece in pieces:
            if isinstance(piece, KVHandle):
                if piece.model != self.bridge.model:
                    raise ValueError(
                        f"a {piece.model!r} handle cannot be spliced into a "
                        f"{self.bridge.model!r} prompt; re-tokenize it explicitly"
                    )
                tokens = piece.token_ids
                if tokens and tokens[-1] == eot_id:
                    tokens = tokens[:-1]
                if not tokens:
                    continue
                if after_handle:
                    ids.extend(self.bridge.tokenize(SEGMENT_SEPARATOR))
                ids.extend(tokens)
                after_handle = True
            elif piece:
                if after_handle and not piece.startswith(("\n", "\r")):
                    ids.extend(self.bridge.tokenize(SEGMENT_SEPARATOR))
                ids.extend(self.bridge.tokenize(piece))
                after_handle = False
        return tuple(ids)

    def content(self, text: str) -> str:
        """Generated ``text`` as message content: without the template's end-of-turn markers."""
        for marker in self.template.markers:
            text = text.replace(marker, "")
        return text

    def continue_with(self, handle: KVHandle, text: str) -> KVHandle:
        """``handle`` followed by raw ``text`` tokens inside the current turn (an answer cue)."""
        return handle.extend(self.bridge.tokenize(text) if text else ())


def _unpack(message: MessageLike) -> tuple[str, str | KVHandle]:
    if isinstance(message, Message):
        return message.role, message.content
    role = message["role"]
    if not isinstance(role, str):
        raise TypeError(f"a message's role must be a str, got {type(role).__name__}")
    return role, message["content"]
