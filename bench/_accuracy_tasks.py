"""Pure parts of the accuracy benchmark: question sets, paired statistics, vote replays.

Nothing here touches an engine (``tests/test_bench_accuracy.py`` runs it fast).

Question sets (deterministic for a seed):

- ``easy_set``: the issue's easy closed questions, a third each of "which
  number is larger" (two choices), "is X the capital of Y" (yes/no, half
  true) and small sums with two choices;
- ``mc_set``: the collaboration benchmark's multiple-choice items
  (``_collab_tasks.task_set``), the question without its "Choices:" line —
  the vote mode lists the choices itself (in each voter's order when debiased).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from _collab_tasks import _CAPITALS, task_set
from microagent.collab._tally import StopRule, adaptive_vote
from microagent.evaluation import PairedTable, wilson

__all__ = ["Item", "easy_set", "mc_set", "mcnemar", "replay", "wilson"]


@dataclass(frozen=True)
class Item:
    """One question: the user's text, the choices (canonical order; empty for a free
    answer, which ``bench/_quality_tasks.grade`` scores) and the answer."""

    id: str
    family: str
    question: str
    choices: tuple[str, ...]
    answer: str


def _larger(rng: random.Random, i: int) -> Item:
    a, b = rng.sample(range(2, 100), 2)
    question = f"Which number is larger, {a} or {b}?"
    return Item(f"easy-{i}", "larger", question, (str(a), str(b)), str(max(a, b)))


def _capital(rng: random.Random, i: int, true: bool) -> Item:
    country = rng.choice(sorted(_CAPITALS))
    city = _CAPITALS[country]
    if not true:
        city = rng.choice(sorted(c for c in _CAPITALS.values() if c != city))
    question = f"Is {city} the capital of {country}?"
    return Item(f"easy-{i}", "capital", question, ("yes", "no"), "yes" if true else "no")


def _sum(rng: random.Random, i: int) -> Item:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    right = a + b
    wrong = right + rng.choice((-2, -1, 1, 2))
    choices = [str(right), str(wrong)]
    rng.shuffle(choices)
    return Item(f"easy-{i}", "sum", f"What is {a} + {b}?", tuple(choices), str(right))


def easy_set(n: int = 60, seed: int = 14) -> list[Item]:
    """``n`` easy closed questions, families interleaved, the same for a given seed."""
    rng = random.Random(seed)
    out: list[Item] = []
    capitals = 0
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(_larger(rng, i))
        elif kind == 1:
            out.append(_capital(rng, i, true=capitals % 2 == 0))
            capitals += 1
        else:
            out.append(_sum(rng, i))
    return out


def mc_set(n: int = 60, seed: int = 1234) -> list[Item]:
    """The first ``n`` of the collaboration benchmark's 240 multiple-choice items."""
    return [
        Item(f"mc-{t.id}", f"mc-{t.kind}", t.question, t.choices, t.answer)
        for t in task_set(240, seed)[:n]
    ]


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Exact two-sided McNemar test of paired outcomes (the same items, in the same order).

    Returns ``a_only`` (items only ``a`` got right), ``b_only`` and ``p``: the
    binomial probability, under no difference, of a split of the discordant
    items at least as uneven as the one seen.
    """
    table = PairedTable.of(a, b)  # raises on outcomes of different lengths
    return {"a_only": table.only_candidate, "b_only": table.only_greedy, "p": table.p}


def replay(
    ordered: Sequence[str],
    choices: Sequence[str],
    *,
    voters: int,
    wave: int,
    rule: str = "off",
    confidence: float = 0.95,
    exact: bool = True,
) -> tuple[str, int]:
    """What a vote of the first ``voters`` of a full vote's answers (voter order) returns.

    Applies the vote mode's own procedure (``adaptive_vote``), so a full
    9-voter run gives, on the same samples, the answers and sample counts of
    vote-5, the exact early stop and each adaptive rule: a paired comparison.
    """
    answers = list(ordered[:voters])
    return adaptive_vote(answers, wave, StopRule(rule, confidence), choices, exact=exact)
