"""Answers: normalisation, tallies, the tie rule, the exact early-stop test and adaptive stops.

Tie rule (documented, deterministic): among answers with the most votes, the
one listed first in ``choices`` wins; for free-text answers, the one whose
*first* vote came first wins — but early stopping never relies on arrival
order for free text: it stops only when the leader is strictly ahead of every
possible rival.

Adaptive stop rules (``StopRule``) are checked after each whole wave of
voters. They stop sampling when the leader is *probably* the majority, not
certainly (that is ``Tally.decided``); the answer is always the leader of the
votes cast so far. ``beta`` is Adaptive-Consistency's rule (Aggarwal et al.,
2023): with ``a`` votes for the leader and ``b`` for the runner-up, stop when
``P(p > 1/2) >= confidence`` for ``p ~ Beta(a + 1, b + 1)`` (a uniform prior
on the leader's share among the top two). ``window`` is early-stopping
self-consistency's rule (Li et al., 2024): stop when every vote of the
latest wave names the same answer.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeAlias

import attrs
import regex

from ._errors import InvalidCollaboration

#: a compiled ``answer.extract`` pattern (the ``regex`` module's: it can time out)
Extractor: TypeAlias = "regex.Pattern[str]"

#: the longest one ``answer.extract`` match may take on a reply: a pattern that
#: backtracks catastrophically fails the collaboration instead of stalling the loop
EXTRACT_TIMEOUT_S = 0.05

_PUNCT = re.compile(r"[^\w\s.+-]|\.(?!\d)|(?<!\d)\.")
_SPACE = re.compile(r"\s+")
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*[:=]\s*(.+)", re.IGNORECASE)


def normalize_answer(
    text: str, choices: Sequence[str] | None = None, extract: Extractor | None = None
) -> str:
    """Normalise a free-text answer so that equal answers compare equal.

    With ``choices``, the answer maps to the choice it names (case and
    punctuation insensitive; the first choice found wins), else to "".
    With ``extract`` (``AnswerSpec.extractor``), the answer is the pattern's last
    match in the text (its first group, if it has one), else "" (an abstention).
    Otherwise it takes an explicit "Answer: …" line if there is one, then
    lower-cases, strips punctuation and collapses spaces.
    """
    raw = unicodedata.normalize("NFKC", text).strip()
    if extract is not None and choices is None:
        try:
            matches = list(extract.finditer(raw, concurrent=True, timeout=EXTRACT_TIMEOUT_S))
        except TimeoutError:
            raise InvalidCollaboration(
                "answer.extract",
                f"the pattern took over {EXTRACT_TIMEOUT_S * 1000:.0f} ms on a reply "
                "(catastrophic backtracking): simplify it",
            ) from None
        if not matches:
            return ""
        last = matches[-1]
        found = last.group(1) if extract.groups else last.group(0)
        return _number(found) or _canon(found)
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


#: a number as written in a reply: an optional sign, optional thousands commas, decimals
NUMBER_PATTERN = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER = re.compile(NUMBER_PATTERN)


def _number(text: str) -> str:
    """A numeric answer by its value ("+1,000.50" and "1000.5" both "1000.5"), else ""."""
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return ""
    value = text.replace(",", "").lstrip("+")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return "0" if value in ("-0", "") else value


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


STOP_RULES = ("off", "beta", "window")


def beta_majority_probability(lead: int, runner_up: int) -> float:
    """``P(p > 1/2)`` for ``p ~ Beta(lead + 1, runner_up + 1)``, exactly.

    For integer parameters the Beta tail is a binomial sum:
    ``P(p > 1/2) = P(Binomial(lead + runner_up + 1, 1/2) <= lead)``.
    """
    if lead < 0 or runner_up < 0:
        raise ValueError("vote counts must be >= 0")
    n = lead + runner_up + 1
    return float(sum(math.comb(n, j) for j in range(lead + 1))) / float(2**n)


@attrs.frozen
class StopRule:
    """An adaptive stop rule, checked after each wave (see the module docstring).

    Attributes:
        kind: ``off``, ``beta`` or ``window``.
        confidence: the ``beta`` rule's threshold, in (0.5, 1).
    """

    kind: str = "off"
    confidence: float = 0.95

    def __attrs_post_init__(self) -> None:
        if self.kind not in STOP_RULES:
            raise ValueError(f"stop rule must be one of {STOP_RULES}, got {self.kind!r}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")

    def stops(self, tally: Tally, window: Sequence[str]) -> bool:
        """Whether to stop sampling after a wave whose votes were ``window``."""
        if self.kind == "off" or not tally.counts:
            return False
        if self.kind == "window":
            return len(window) >= 2 and len(set(window)) == 1 and window[0] != ""
        ranked = sorted(tally.counts.values(), reverse=True)
        runner_up = ranked[1] if len(ranked) > 1 else 0
        return beta_majority_probability(ranked[0], runner_up) >= self.confidence


def adaptive_vote(
    answers: Sequence[str],
    wave: int,
    rule: StopRule,
    choices: Sequence[str] | None = None,
    *,
    exact: bool = True,
) -> tuple[str, int]:
    """What an adaptive vote over ``answers`` (in voter order) returns, and the votes it uses.

    Voters are sampled ``wave`` at a time; after each wave the exact test
    (when ``exact``) and then ``rule`` may stop. This is the vote mode's
    procedure as a pure function (a vote that stops inside a wave on the
    exact test gives the same answer with fewer votes).
    """
    if wave < 1:
        raise ValueError("wave must be >= 1")
    tally = Tally(total_voters=len(answers), choices=tuple(choices) if choices else None)
    for start in range(0, len(answers), wave):
        window = answers[start : start + wave]
        for a in window:
            tally.add(a)
        if (exact and tally.decided()) or rule.stops(tally, window):
            break
    return tally.leader(), tally.cast
