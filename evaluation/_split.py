"""Splitting items into a selection part and a report part, by a fixed seed.

A configuration is chosen on the selection part only and reported on the other,
so the reported numbers are not the ones the choice was fitted to. The split is
stratified by family (each family is split in the same proportion) and depends
only on the seed, the fraction and the items' contents: reordering the file does
not move an item from one part to the other.

An item that says its ``part`` is pinned there whatever the seed: a test set you
already hold out stays in the report part, and is never chosen on. Only the
unpinned items are split by the seed, exactly as they would be without the
pinned ones, so adding pinned items moves none of the others.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Final

import attrs

from ._items import EvalItem

DEFAULT_SEED: Final = 40
DEFAULT_SELECT_FRACTION: Final = 0.5


@attrs.frozen
class Split:
    """The two parts, each in file order.

    Attributes:
        selection: the items a configuration is chosen on.
        report: the items the chosen configuration is reported on (never chosen on).
    """

    selection: tuple[EvalItem, ...]
    report: tuple[EvalItem, ...]


def split_items(
    items: Sequence[EvalItem],
    seed: int = DEFAULT_SEED,
    select_fraction: float = DEFAULT_SELECT_FRACTION,
) -> Split:
    """Split ``items`` into selection and report parts, per family.

    An item pinned to a part (``EvalItem.part``) stays there. The others: each
    family's items are ordered by content, shuffled by a generator seeded with
    ``seed`` and the family's name, and the first ``round(n * select_fraction)`` go
    to selection; a family of two or more unpinned items keeps at least one on each
    side.

    Raises:
        ValueError: ``select_fraction`` is not strictly between 0 and 1.
    """
    if not 0.0 < select_fraction < 1.0:
        raise ValueError(f"select_fraction must be between 0 and 1, got {select_fraction}")
    families: dict[str, list[EvalItem]] = defaultdict(list)
    chosen: set[str] = set()
    for item in items:
        if item.part == "selection":
            chosen.add(item.key)
        elif item.part is None:
            families[item.family].append(item)
    for family, members in families.items():
        ordered = sorted(members, key=lambda i: (i.content_hash, i.line))
        random.Random(f"{seed}:{family}").shuffle(ordered)
        k = round(len(ordered) * select_fraction)
        if len(ordered) >= 2:
            k = min(max(k, 1), len(ordered) - 1)
        chosen |= {i.key for i in ordered[:k]}
    return Split(
        selection=tuple(i for i in items if i.key in chosen),
        report=tuple(i for i in items if i.key not in chosen),
    )
