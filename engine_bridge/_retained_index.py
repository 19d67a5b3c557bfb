"""The retained handles of one engine epoch, indexed by their whole-block prefixes.

Every request that names no priority asks which retained handle its prompt extends
(its program), and every finished request asks how much of its prompt a retained
handle covered. A scan compares the prompt with every retained handle, token by
token: sessions share their system prompt, so each comparison walks it, and the
cost grows with sessions x prefix length on the engine's hot path. This index keys
each handle's whole-block prefixes by a chained hash (block i's hash covers blocks
0..i, as vLLM's block hashes do), so a lookup hashes the prompt once and probes
from its longest whole-block prefix down; a hit is verified on the tokens, so a
hash collision is a miss, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterator

from ._handle import AdapterRef, KVHandle

#: (cache salt, adapter, chained hash of the first i whole blocks)
_Slot = tuple[str | None, AdapterRef | None, int]


def _chain(tokens: tuple[int, ...], block: int, blocks: int) -> list[int]:
    """The chained hashes of ``tokens``' first 1..``blocks`` whole blocks."""
    out: list[int] = []
    h = 0
    for i in range(blocks):
        h = hash((h, tokens[i * block : (i + 1) * block]))
        out.append(h)
    return out


class RetainedIndex:
    """Retention key -> (cache salt, handle), with prefix lookups that do not scan.

    Iteration, ``in`` and ``len`` see the keys in the order they were first retained.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._entries: dict[str, tuple[str | None, KVHandle, list[_Slot]]] = {}
        # every whole-block prefix of every handle -> the keys holding it (insertion order)
        self._prefixes: dict[_Slot, dict[str, None]] = {}
        # each handle's own whole-block length -> the keys whose handle ends there
        self._ends: dict[_Slot, dict[str, None]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def get(self, key: str) -> tuple[str | None, KVHandle] | None:
        """The salt and handle retained under ``key`` (None: nothing is)."""
        entry = self._entries.get(key)
        return None if entry is None else (entry[0], entry[1])

    def put(self, key: str, salt: str | None, handle: KVHandle) -> None:
        """Retain ``handle`` under ``key`` (replacing what the key held)."""
        self.pop(key)
        blocks = len(handle) // self.block_size
        slots = [
            (salt, handle.adapter, h) for h in _chain(handle.token_ids, self.block_size, blocks)
        ]
        for slot in slots:
            self._prefixes.setdefault(slot, {})[key] = None
        if slots:
            self._ends.setdefault(slots[-1], {})[key] = None
        self._entries[key] = (salt, handle, slots)

    def pop(self, key: str) -> None:
        """Forget ``key`` (nothing when it is not retained)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        slots = entry[2]
        for slot in slots:
            _discard(self._prefixes, slot, key)
        if slots:
            _discard(self._ends, slots[-1], key)

    def clear(self) -> None:
        self._entries.clear()
        self._prefixes.clear()
        self._ends.clear()

    def handles(self) -> Iterator[tuple[str | None, KVHandle]]:
        """Every retained (salt, handle)."""
        for salt, handle, _ in self._entries.values():
            yield salt, handle

    def extended_key(self, prompt: KVHandle, salt: str | None) -> str | None:
        """The key of the longest retained handle whose whole blocks ``prompt`` extends
        (strictly: the prompt is longer than those blocks), under the same salt and adapter."""
        return self._longest(self._ends, prompt, salt)[0]

    def covered(self, prompt: KVHandle, salt: str | None) -> int:
        """Tokens of ``prompt`` in whole blocks (its last token excluded) that some
        retained handle under the same salt and adapter shares with it."""
        return self._longest(self._prefixes, prompt, salt)[1]

    def _longest(
        self, index: dict[_Slot, dict[str, None]], prompt: KVHandle, salt: str | None
    ) -> tuple[str | None, int]:
        """The first key of ``index`` at the longest whole-block prefix of ``prompt`` (its
        last token excluded) whose tokens the key's handle shares, and that prefix's length."""
        block = self.block_size
        blocks = (len(prompt) - 1) // block if self._entries else 0
        chain = _chain(prompt.token_ids, block, blocks)
        for i in range(blocks - 1, -1, -1):
            for key in index.get((salt, prompt.adapter, chain[i]), ()):
                if self._entries[key][1].common_prefix_length(prompt) >= (i + 1) * block:
                    return key, (i + 1) * block
        return None, 0


def _discard(index: dict[_Slot, dict[str, None]], slot: _Slot, key: str) -> None:
    keys = index.get(slot)
    if keys is not None:
        keys.pop(key, None)
        if not keys:
            del index[slot]
