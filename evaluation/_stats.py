"""The statistics of an evaluation: Wilson intervals and the exact McNemar test.

Shared with the benchmarks (``bench/_collab_tasks.wilson``,
``bench/_accuracy_tasks.mcnemar`` call these), so a number a user's evaluation
prints and one the project publishes come from one computation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (95 % by default) of a proportion; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p of a paired comparison from its discordant counts.

    The binomial probability, under no difference (each discordant item equally
    likely to go either way), of a split at least as uneven as ``a_only`` against
    ``b_only``; 1.0 when there are no discordant items.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError("discordant counts cannot be negative")
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, j) for j in range(k + 1)) / (1 << n)
    return min(1.0, 2 * tail)


@attrs.frozen
class PairedTable:
    """Paired outcomes of a candidate and greedy on the same items.

    Attributes:
        both: items both got right.
        only_greedy: items only greedy got right.
        only_candidate: items only the candidate got right.
        neither: items both got wrong.
    """

    both: int
    only_greedy: int
    only_candidate: int
    neither: int

    @classmethod
    def of(cls, candidate: Sequence[bool], greedy: Sequence[bool]) -> PairedTable:
        """The table of two outcome lists over the same items, in the same order."""
        if len(candidate) != len(greedy):
            raise ValueError("paired outcomes must have the same length")
        pairs = list(zip(candidate, greedy, strict=True))
        return cls(
            both=sum(1 for c, g in pairs if c and g),
            only_greedy=sum(1 for c, g in pairs if g and not c),
            only_candidate=sum(1 for c, g in pairs if c and not g),
            neither=sum(1 for c, g in pairs if not c and not g),
        )

    @property
    def p(self) -> float:
        """The exact two-sided McNemar p of the candidate against greedy."""
        return mcnemar_p(self.only_candidate, self.only_greedy)


def paired_difference_interval(table: PairedTable, z: float = 1.96) -> tuple[float, float]:
    """95 % interval (by default) of the candidate's accuracy minus greedy's, paired.

    Newcombe's hybrid score interval for a difference of paired proportions (method 10
    of Newcombe 1998, Stat. Med. 17:2635): the two accuracies' Wilson intervals,
    combined with the correlation of the paired outcomes. Unlike the Wald interval it
    stays within [-1, 1] and behaves at 0 and 1. (0, 0) when there are no items.
    """
    n = table.both + table.only_greedy + table.only_candidate + table.neither
    if n == 0:
        return 0.0, 0.0
    p1 = (table.both + table.only_candidate) / n  # the candidate's accuracy
    p2 = (table.both + table.only_greedy) / n  # greedy's
    l1, u1 = wilson(table.both + table.only_candidate, n, z)
    l2, u2 = wilson(table.both + table.only_greedy, n, z)
    margins = (
        (table.both + table.only_candidate)
        * (table.only_greedy + table.neither)
        * (table.both + table.only_greedy)
        * (table.only_candidate + table.neither)
    )
    cross = table.both * table.neither - table.only_candidate * table.only_greedy
    phi = cross / math.sqrt(margins) if margins > 0 else 0.0
    d = p1 - p2
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, d - below), min(1.0, d + above)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input's order: compare each with alpha as is.

    Controls the family-wise error over all the tests (Holm 1979): the k-th smallest
    p is multiplied by ``m - k + 1``, and the adjusted values are made monotone.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
