"""MessageComposer: a remote model's chat composition, kept as the chat messages themselves.

An endpoint takes chat messages and applies its own template, so a remote
handle carries the ``Conversation`` it stands for: the messages sent, exactly
as the collaboration composed them. Its ChatML ids (the bridge's toy
tokenizer) only count tokens; nothing is rendered to text and parsed back, so
a user text that holds ``<|im_start|>`` stays one message. The methods and
their meaning are the local composer's; what a message list cannot say is
refused: bare ids as content, a conversation as content, writing inside a turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .._chat import SEGMENT_SEPARATOR, ChatComposer
from .._errors import HandleMismatch
from .._handle import AdapterRef, ChatIds, ChatTurn, Conversation, KVHandle


@attrs.frozen(eq=False)
class MessageComposer(ChatComposer):
    """A ``ChatComposer`` whose handles carry their chat messages (``KVHandle.conversation``).

    ``context``, ``append``, ``generation_prompt`` and ``close_turn`` grow the
    conversation; ``turn`` and ``splice`` return ``ChatIds`` that say their text,
    so ``handle.extend(chat.turn(role, chat.splice(pieces)))`` adds one message.
    A handle piece (another role's output, a re-tokenized text) is its text,
    without a trailing end-of-turn marker.
    """

    def _start(self, adapter: str | AdapterRef | None) -> KVHandle:
        start = self.bridge.handle(self.template.prefix, adapter=adapter)
        return attrs.evolve(start, conversation=Conversation())

    def turn(self, role: str, content: str | KVHandle | Sequence[int]) -> ChatIds:
        """The ids of one whole turn, naming the message they add (role, exact text)."""
        text = self._text(content)
        ids = tuple(self.bridge.tokenize(text)) if text else ()
        whole = (*self.template.open(role), *ids, *self.template.close_after(role, ids))
        return ChatIds(whole, text, ChatTurn(role, text))

    def append(self, handle: KVHandle, role: str, content: str | KVHandle) -> KVHandle:
        """``handle``'s conversation followed by one ``role`` message."""
        self._conversation(handle)
        return handle.extend(self.turn(role, content))

    def generation_prompt(self, handle: KVHandle) -> KVHandle:
        """``handle`` with an empty assistant turn opened for the model (not sent as a message)."""
        opened = self._conversation(handle).opened()
        return _grown(handle, self.template.generation, opened)

    def close_turn(self, handle: KVHandle, role: str = "assistant") -> KVHandle:
        """Close the turn a generation left open; its text stays as the model wrote it."""
        closed = self._conversation(handle).closed()
        return _grown(handle, self.template.close_after(role, handle.token_ids), closed)

    def splice(self, pieces: Sequence[str | KVHandle]) -> ChatIds:
        """The text of mixed content (handles as their text), with the local composer's seams.

        Whatever follows a handle starts on a new line (``SEGMENT_SEPARATOR`` unless
        the next text starts with a line break), as it does on a local model.
        """
        out: list[str] = []
        after_handle = False
        for piece in pieces:
            if isinstance(piece, KVHandle):
                text = self._text(piece)
                if not text:
                    continue
                if after_handle:
                    out.append(SEGMENT_SEPARATOR)
                out.append(text)
                after_handle = True
            elif piece:
                if after_handle and not piece.startswith(("\n", "\r")):
                    out.append(SEGMENT_SEPARATOR)
                out.append(piece)
                after_handle = False
        joined = "".join(out)
        return ChatIds(self.bridge.tokenize(joined) if joined else (), joined)

    def content(self, text: str) -> str:
        """The endpoint's text as it is: its chat template is its own, so no marker of ours
        is in it to remove (a reply that spells one keeps it, in the conversation too)."""
        return text

    def continue_with(self, handle: KVHandle, text: str) -> KVHandle:
        """Refused for any text: chat completions start a new assistant message, never
        continue one (an empty ``text`` changes nothing).

        Raises:
            HandleMismatch: ``text`` is not empty.
        """
        self._conversation(handle)
        if text:
            raise HandleMismatch(
                f"remote model {self.bridge.model!r} cannot be given the start of its answer: "
                "chat completions begin a new assistant message"
            )
        return handle

    # -- helpers ---------------------------------------------------------------------------
    def _conversation(self, handle: KVHandle) -> Conversation:
        """``handle``'s conversation; a piece of text or another model's handle is refused."""
        if handle.model != self.bridge.model:
            raise HandleMismatch(
                f"a {handle.model!r} handle cannot be composed with {self.bridge.model!r}'s "
                "chat; transfer its text explicitly"
            )
        if handle.conversation is None:
            raise HandleMismatch(
                f"this {self.bridge.model!r} handle is a piece of text, not a conversation: "
                "start one with bridge.chat.context(messages)"
            )
        return handle.conversation

    def _text(self, content: str | KVHandle | Sequence[int]) -> str:
        """The message text ``content`` stands for."""
        if isinstance(content, str):
            return content
        if isinstance(content, ChatIds):
            return content.text
        if not isinstance(content, KVHandle):
            raise HandleMismatch(
                f"bare token ids say no text to remote model {self.bridge.model!r}: "
                "give text, a handle, or chat.splice(pieces)"
            )
        if content.model != self.bridge.model:
            raise ValueError(
                f"a {content.model!r} handle cannot be spliced into a {self.bridge.model!r} "
                "prompt; re-tokenize it explicitly"
            )
        if content.conversation is not None:
            raise HandleMismatch(
                "a conversation is not a message's content: splice the segment that is "
                "(result.output, handle.segment(prompt))"
            )
        return _without_end(self.bridge.detokenize(content.token_ids), self.template.markers)


def _grown(handle: KVHandle, ids: Iterable[int], conversation: Conversation) -> KVHandle:
    """``handle`` extended by ``ids`` whose meaning is ``conversation`` (lineage kept)."""
    return attrs.evolve(
        handle,
        token_ids=handle.token_ids + tuple(ids),
        parent=handle,
        conversation=conversation,
    )


def _without_end(text: str, markers: Sequence[str]) -> str:
    """``text`` without the end-of-turn markers it ends with (a generation that stopped)."""
    stripped = True
    while stripped:
        stripped = False
        for marker in markers:
            if marker and text.endswith(marker):
                text, stripped = text[: -len(marker)], True
    return text
