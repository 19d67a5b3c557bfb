"""Debiased voting: each voter sees the choices in its own order (permutation self-consistency).

A small model prefers an option for where it is listed (first, last) or for
what it says ("yes"), and every voter of a plain vote shares that bias, so the
vote amplifies it. Here voter ``i`` sees the choices in an order fixed by ``i``
alone (``voter_order``): rotations, then reversed rotations, so that over
every ``k`` consecutive voters each of ``k`` choices stands in each position
exactly once (a Latin square). Its answer is mapped back to the canonical
choice before the tally (``ChoiceView.to_canonical``), which makes the vote a
vote over contents, with position effects averaged out.

Two presentations (``VoteConfig.debias``):

- ``order``: the instructions list the choices in the voter's order; the
  voter answers with the choice's text (constrained to the choices).
- ``labels``: the choices are listed as ``A) … B) …`` in the voter's order and
  the voter answers with a letter (constrained to the letters), mapped back
  through the voter's permutation. For yes/no questions this is the
  counterbalanced phrasing: half of the voters see "A) yes B) no", the other
  half "A) no B) yes", so a preference for a word or for "A" no longer favours
  one answer.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import attrs

DEBIAS_MODES = ("off", "order", "labels")
#: the letters ``labels`` uses (at most this many choices can be labelled)
LABELS = string.ascii_uppercase


def voter_order(k: int, voter: int) -> tuple[int, ...]:
    """The permutation of ``range(k)`` voter number ``voter`` (0-based) sees.

    Voter ``i`` sees the rotation by ``i mod k``, reversed when ``i // k`` is odd:
    deterministic from the index, every ``k`` consecutive voters a Latin square.
    """
    if k < 1 or voter < 0:
        raise ValueError(f"need k >= 1 and voter >= 0, got k={k}, voter={voter}")
    shift = voter % k
    order = tuple((shift + j) % k for j in range(k))
    return order[::-1] if (voter // k) % 2 else order


@attrs.frozen
class ChoiceView:
    """How one voter sees the canonical ``choices`` and how its answer maps back.

    Attributes:
        choices: the canonical choices (the collaboration's ``answer.choices``).
        order: ``shown[j] = choices[order[j]]``.
        labels: whether the voter answers with letters (``A``, ``B``…) instead of texts.
    """

    choices: tuple[str, ...]
    order: tuple[int, ...]
    labels: bool = False

    def __attrs_post_init__(self) -> None:
        if sorted(self.order) != list(range(len(self.choices))):
            raise ValueError(f"order {self.order} is not a permutation of {len(self.choices)}")
        if self.labels and len(self.choices) > len(LABELS):
            raise ValueError(f"at most {len(LABELS)} choices can be labelled")

    @classmethod
    def for_voter(cls, choices: Sequence[str], voter: int, *, labels: bool = False) -> ChoiceView:
        """The view of voter number ``voter`` (0-based) under ``voter_order``."""
        items = tuple(choices)
        return cls(items, voter_order(len(items), voter), labels)

    @property
    def shown(self) -> tuple[str, ...]:
        """The choices in the order this voter sees them."""
        return tuple(self.choices[i] for i in self.order)

    @property
    def allowed(self) -> tuple[str, ...]:
        """What the voter's constrained answer may be: letters, or the shown texts."""
        if self.labels:
            return tuple(LABELS[: len(self.choices)])
        return self.shown

    def listing(self) -> str:
        """The choices as the voter's instructions list them."""
        if self.labels:
            return " ".join(f"{LABELS[j]}) {c}" for j, c in enumerate(self.shown))
        return ", ".join(self.shown)

    def to_canonical(self, answer: str) -> str:
        """The canonical choice a voter's (normalised) answer names ("" for none).

        With labels, a letter maps through the permutation; without, the
        answer already is a choice's text.
        """
        if not self.labels:
            return answer if answer in self.choices else ""
        key = answer.strip().rstrip(")").strip().upper()
        if len(key) == 1 and key in LABELS[: len(self.choices)]:
            return self.shown[LABELS.index(key)]
        return ""
