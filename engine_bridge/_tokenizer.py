"""ToyTokenizer: the ScriptedEngine's deterministic, reversible word-level tokenizer.

Words (with their leading space), single punctuation marks, single whitespace
characters and a few special tokens (ChatML's ``<|im_start|>`` / ``<|im_end|>``,
``<|endoftext|>``) are tokens. Ids are assigned on first sight, per tokenizer
instance, so ``detokenize(tokenize(text)) == text`` for every text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)


def _pattern(specials: Sequence[str]) -> re.Pattern[str]:
    alternatives = [re.escape(s) for s in sorted(specials, key=len, reverse=True)]
    return re.compile("|".join([*alternatives, r"[ ]?\w+|[ ]?[^\w\s]|\s"]))


class ToyTokenizer:
    """A reversible word-level tokenizer; special tokens get the first ids (0, 1, 2…).

    Args:
        words: pieces to give ids up front (in order), e.g. the vocabulary an
            engine samples from, so their ids do not depend on what was seen first.
        specials: texts that are one token each wherever they appear.
    """

    def __init__(
        self, words: Iterable[str] = (), *, specials: Sequence[str] = SPECIAL_TOKENS
    ) -> None:
        self._pieces: list[str] = []
        self._ids: dict[str, int] = {}
        self._pattern = _pattern(specials)
        for piece in (*specials, *words):
            self._id(piece)

    def _id(self, piece: str) -> int:
        found = self._ids.get(piece)
        if found is None:
            found = len(self._pieces)
            self._pieces.append(piece)
            self._ids[piece] = found
        return found

    @property
    def vocab_size(self) -> int:
        """Ids assigned so far."""
        return len(self._pieces)

    def token_id(self, piece: str) -> int:
        """The id of one piece (a special token, a word…), assigning one if new."""
        return self._id(piece)

    def pieces(self, text: str) -> list[str]:
        """``text`` cut into token pieces; their concatenation is ``text``."""
        return self._pattern.findall(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token text becomes the special token)."""
        return [self._id(p) for p in self._pattern.findall(text)]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``; ids never assigned decode as ``<|id:N|>``."""
        n = len(self._pieces)
        return "".join(self._pieces[t] if 0 <= t < n else f"<|id:{t}|>" for t in token_ids)
