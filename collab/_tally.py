"""Answers: normalisation, tallies, the tie rule and the exact early-stop test.

Tie rule (documented, deterministic): among answers with the most votes, the
one listed first in ``choices`` wins; for free-text answers, the one whose
*first* vote came first wins — but early stopping never relies on arrival
order for free text: it stops only when the leader is strictly ahead of every
possible rival.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

import attrs

_PUNCT = re.compile(r"[^\w\s.+-]|\.(?!\d)|(?<!\d)\.")
_SPACE = re.compile(r"\s+")
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*[:=]\s*(.+)", re.IGNORECASE)


def normalize_answer(text: str, choices: Sequence[str] | None = None) -> str:
    """Normalise a free-text answer so that equal answers compare equal.

    With ``choices``, the answer maps to the choice it names (case and
    punctuation insensitive; the first choice found wins), else to "".
    Without, it takes an explicit "Answer: …" line if there is one, then
    lower-cases, strips punctuation and collapses spaces.
    """
    raw = unicodedata.normalize("NFKC", text).strip()
    if choices is not None:
        canon = {_canon(c): c for c in choices}
        key = _canon(raw)
        if key in canon:
            return canon[key]
        words = _canon(raw).split()
        for choice in choices:  # a choice named as a whole word inside the text
            c = _canon(choice)
            if c and (c in words or (" " in c and f" {c} " in f" {' '.join(words)} ")):
                return choice
        return ""
    match = _ANSWER_LINE.search(raw)
    if match:
        raw = match.group(1)
    first_line = raw.splitlines()[0] if raw else ""
    return _canon(first_line)


def _canon(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCT.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


@attrs.define
class Tally:
    """Votes counted so far, in arrival order, with the exact early-stop test."""

    total_voters: int
    choices: tuple[str, ...] | None = None
    counts: dict[str, int] = attrs.field(factory=dict)
    first_seen: dict[str, int] = attrs.field(factory=dict)
    cast: int = 0

    def add(self, answer: str) -> None:
        """Count one vote (an empty answer is an abstention: counted as cast, no answer)."""
        if self.cast >= self.total_voters:
            raise ValueError("more votes than voters")
        self.cast += 1
        if not answer:
            return
        if answer not in self.counts:
            self.first_seen[answer] = self.cast
        self.counts[answer] = self.counts.get(answer, 0) + 1

    @property
    def remaining(self) -> int:
        return self.total_voters - self.cast

    def _rank(self, answer: str) -> tuple[int, int]:
        """Sort key for the tie rule: lower wins among equal counts."""
        if self.choices is not None and answer in self.choices:
            return (self.choices.index(answer), 0)
        return (len(self.choices or ()), self.first_seen.get(answer, 1 << 30))

    def leader(self) -> str:
        """The current winner under the tie rule ("" when no answer yet)."""
        if not self.counts:
            return ""
        return min(self.counts, key=lambda a: (-self.counts[a], self._rank(a)))

    def decided(self) -> bool:
        """True when the remaining voters can no longer change the winner.

        Every rival (a seen answer, an unseen choice, or — for free text — an
        unseen string) must be unable to reach the leader's count, or reach it
        only to lose the tie under a rule that does not depend on the future.
        """
        if self.remaining == 0:
            return True
        lead = self.leader()
        if not lead:
            return False
        top = self.counts[lead]
        for rival, count in self.counts.items():
            if rival != lead and not self._beats(lead, top, rival, count + self.remaining):
                return False
        # answers not seen yet
        if self.choices is not None:
            for rival in self.choices:
                if rival not in self.counts and not self._beats(lead, top, rival, self.remaining):
                    return False
            return True
        return self.remaining < top  # a new free-text answer has no known tie rank

    def _beats(self, lead: str, lead_count: int, rival: str, rival_best: int) -> bool:
        if rival_best < lead_count:
            return True
        if rival_best > lead_count:
            return False
        if self.choices is None:  # free text: rank by first arrival, already fixed for seen answers
            return rival in self.first_seen and self._rank(lead) < self._rank(rival)
        return self._rank(lead) < self._rank(rival)

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items(), key=lambda kv: (-kv[1], self._rank(kv[0]))))


def majority(answers: Iterable[str], choices: Sequence[str] | None = None) -> str:
    """The winner of a full vote over ``answers`` (arrival order) under the tie rule."""
    items = list(answers)
    tally = Tally(total_voters=len(items), choices=tuple(choices) if choices else None)
    for a in items:
        tally.add(a)
    return tally.leader()


def all_agree(answers: Mapping[str, str]) -> bool:
    """Whether every agent gave the same non-empty normalised answer."""
    values = set(answers.values())
    return len(values) == 1 and "" not in values
