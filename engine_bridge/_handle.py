"""KVHandle: an immutable reference to a token sequence in the engine's prefix cache.

Actors pass handles, never text: a handle's tokens are spliced into the next
prompt exactly as the engine produced them, so the engine serves them from its
prefix cache. Identity is (token ids, model, adapter, engine epoch); lineage
(``parent``) says which handle this one extends, and ``since(ancestor)`` gives
the segment added over it — what gets spliced into another role's prompt.

A remote model's handle also carries the chat messages it stands for
(``conversation``): an endpoint receives messages, not token ids, so those
messages are what is sent, exactly as composed; its ids only count tokens.
Such a handle grows by whole chat turns (``ChatIds`` that name their turn),
never by bare ids (see ``docs/remote.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import cached_property

import attrs

from ._errors import HandleMismatch


@attrs.frozen
class AdapterRef:
    """A LoRA adapter known to a bridge: vLLM keys cached blocks by name *and* path."""

    name: str
    path: str


Decoder = Callable[[Sequence[int]], str]


def _token_tuple(ids: Iterable[int]) -> tuple[int, ...]:
    return ids if type(ids) is tuple else tuple(ids)  # a ChatIds keeps its ids only


@attrs.frozen
class ChatTurn:
    """One chat message of a remote handle, as its endpoint receives it: a role, exact text."""

    role: str
    content: str


@attrs.frozen
class Conversation:
    """The chat messages a remote model's handle stands for: what its endpoint is sent.

    Attributes:
        turns: the messages, in order, their contents exactly as composed or generated.
        open: the last turn is an assistant turn still being written (a generation
            prompt opened it; the model's output goes into it).
    """

    turns: tuple[ChatTurn, ...] = ()
    open: bool = False

    def add(self, turn: ChatTurn) -> Conversation:
        """These turns and ``turn``; an open turn is closed first, as it stands."""
        return Conversation((*self.turns, turn))

    def opened(self) -> Conversation:
        """An empty assistant turn opened for the model to write (an open one is closed)."""
        return Conversation((*self.turns, ChatTurn("assistant", "")), open=True)

    def written(self, text: str) -> Conversation:
        """``text`` added to the open turn (what the model generated into it).

        Raises:
            HandleMismatch: no turn is open.
        """
        if not self.open:
            raise HandleMismatch("no assistant turn is open to write into")
        last = self.turns[-1]
        return Conversation((*self.turns[:-1], ChatTurn(last.role, last.content + text)), open=True)

    def closed(self) -> Conversation:
        """The same turns, the open one (if any) closed as it stands."""
        return Conversation(self.turns) if self.open else self

    def messages(self) -> list[dict[str, str]]:
        """The turns as chat completions ``messages``; a still empty open turn is no message."""
        turns = self.turns
        if self.open and turns and not turns[-1].content:
            turns = turns[:-1]
        return [{"role": t.role, "content": t.content} for t in turns]


class ChatIds(tuple[int, ...]):
    """Token ids that also say which chat text they stand for (a remote model's composer).

    A tuple, so it goes wherever token ids go (``handle.extend(chat.turn(...))``).
    ``text`` is the content the ids spell; ``turn`` the whole chat turn they add,
    when they are one. A handle with a ``conversation`` extends only by a turn.
    """

    text: str
    turn: ChatTurn | None

    def __new__(cls, ids: Iterable[int], text: str, turn: ChatTurn | None = None) -> ChatIds:
        self = super().__new__(cls, (int(t) for t in ids))
        self.text = text
        self.turn = turn
        return self


@attrs.frozen(eq=False, repr=False)
class KVHandle:
    """A token-id sequence that the engine has (or had) in its prefix cache.

    Attributes:
        token_ids: the exact token ids, never re-tokenized.
        model: the served model name the tokens belong to.
        adapter: the LoRA adapter whose KV the tokens are cached under, or None.
        epoch: the engine epoch the handle was made in (bumped on engine restart).
        parent: the handle this one extends, if any (lineage, not identity).
        conversation: for a remote model's prompt, the chat messages it stands for
            (part of its identity: two conversations can spell the same ids); None
            for a local model's handle and for a piece of text (a segment).
    """

    token_ids: tuple[int, ...] = attrs.field(converter=_token_tuple)
    model: str
    adapter: AdapterRef | None = None
    epoch: int = 0
    parent: KVHandle | None = None
    decoder: Decoder | None = attrs.field(default=None, kw_only=True)
    conversation: Conversation | None = attrs.field(default=None, kw_only=True)

    # -- identity --------------------------------------------------------------
    def _key(self) -> tuple[object, ...]:
        return (self.token_ids, self.model, self.adapter, self.epoch, self.conversation)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVHandle):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        adapter = f", adapter={self.adapter.name!r}" if self.adapter else ""
        size = len(self.token_ids)
        turns = "" if self.conversation is None else f", {len(self.conversation.turns)} turns"
        return f"KVHandle({size} tokens{turns}, model={self.model!r}{adapter}, epoch={self.epoch})"

    # -- text (lazy) -------------------------------------------------------------
    @cached_property
    def text(self) -> str:
        """The tokens decoded to text (computed once, on first use)."""
        if self.decoder is None:
            raise HandleMismatch("this handle has no decoder; decode it with bridge.detokenize()")
        return self.decoder(self.token_ids)

    # -- building ----------------------------------------------------------------
    def extend(self, tokens: Iterable[int] | KVHandle) -> KVHandle:
        """A new handle: these tokens followed by ``tokens`` (ids, or another handle's ids).

        Extending by a handle requires the same model (token ids mean nothing across
        tokenizers; cross-model hand-offs go through an explicit re-tokenization).
        A handle with a ``conversation`` extends only by ids that name a whole chat
        turn (its bridge's ``chat.turn``); the turn joins the conversation.

        Raises:
            HandleMismatch: another model's handle, or bare ids or a handle added to a
                conversation (they say no turn: compose with the bridge's ``chat``).
        """
        if isinstance(tokens, KVHandle):
            if tokens.model != self.model:
                raise HandleMismatch(
                    f"cannot splice a {tokens.model!r} handle into a {self.model!r} handle; "
                    "re-tokenize explicitly (bridge.retokenize) to cross models"
                )
            extra: tuple[int, ...] = tokens.token_ids
        else:
            extra = tuple(int(t) for t in tokens)
        if self.conversation is None or not extra:
            return attrs.evolve(self, token_ids=self.token_ids + extra, parent=self)
        turn = tokens.turn if isinstance(tokens, ChatIds) else None
        if turn is None:
            raise HandleMismatch(
                f"a {self.model!r} handle stands for chat messages: extend it by whole turns "
                "with its bridge's chat composer (chat.append, chat.turn), not by bare ids"
            )
        return attrs.evolve(
            self,
            token_ids=self.token_ids + extra,
            parent=self,
            conversation=self.conversation.add(turn),
        )

    def with_adapter(self, adapter: AdapterRef | None) -> KVHandle:
        """The same tokens, cached under another adapter (no KV is shared across adapters)."""
        return attrs.evolve(self, adapter=adapter, parent=self.parent)

    def with_epoch(self, epoch: int) -> KVHandle:
        """The same tokens, claimed for another engine epoch (after a restart)."""
        return attrs.evolve(self, epoch=epoch)

    # -- lineage -------------------------------------------------------------------
    def is_prefix_of(self, other: KVHandle | Sequence[int]) -> bool:
        """Whether these tokens are an exact prefix of ``other``'s tokens."""
        ids = other.token_ids if isinstance(other, KVHandle) else tuple(other)
        n = len(self.token_ids)
        return len(ids) >= n and tuple(ids[:n]) == self.token_ids

    def common_prefix_length(self, other: KVHandle | Sequence[int]) -> int:
        """How many leading tokens these tokens share with ``other``'s."""
        ids = other.token_ids if isinstance(other, KVHandle) else tuple(other)
        mine = self.token_ids
        n, k = min(len(mine), len(ids)), 0
        while k < n and mine[k] == ids[k]:
            k += 1
        return k

    def since(self, ancestor: KVHandle | None) -> tuple[int, ...]:
        """The tokens added over ``ancestor`` (all tokens when it is None).

        Raises:
            HandleMismatch: ``ancestor``'s tokens are not a prefix of these.
        """
        if ancestor is None:
            return self.token_ids
        if not ancestor.is_prefix_of(self):
            raise HandleMismatch(f"{ancestor!r} is not a prefix of {self!r}")
        return self.token_ids[len(ancestor.token_ids) :]

    def segment(self, ancestor: KVHandle | None) -> KVHandle:
        """``since(ancestor)`` as a handle of its own (to splice into another prompt)."""
        return KVHandle(
            self.since(ancestor),
            model=self.model,
            adapter=self.adapter,
            epoch=self.epoch,
            parent=None,
            decoder=self.decoder,
        )

    def lineage(self) -> list[KVHandle]:
        """This handle and its ancestors, newest first."""
        out: list[KVHandle] = []
        node: KVHandle | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out
