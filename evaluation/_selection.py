"""Choosing a configuration, on the selection part only.

The rule: the highest accuracy, ties going to fewer completion tokens per item,
then to the name; and a candidate must beat greedy's accuracy on the selection
part, or greedy is the choice. ``choose`` is given the selection part's scores
alone: nothing of the report part can reach it.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._candidates import GREEDY


@attrs.frozen
class Score:
    """A configuration's results on one part.

    Attributes:
        n: items.
        correct: items it got right.
        completion_tokens: mean completion tokens per item.
    """

    n: int
    correct: int
    completion_tokens: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0


@attrs.frozen
class Choice:
    """What ``choose`` chose, and why.

    Attributes:
        name: the chosen configuration (``greedy`` when no candidate beat it).
        beat_greedy: whether a candidate beat greedy on the selection part.
        reason: one sentence for the report.
    """

    name: str
    beat_greedy: bool
    reason: str


def choose(selection: Mapping[str, Score]) -> Choice:
    """The configuration to use, from the selection part's scores (greedy's included).

    Raises:
        KeyError: greedy's score is missing.
    """
    greedy = selection[GREEDY]
    candidates = {name: s for name, s in selection.items() if name != GREEDY}
    if not candidates:
        return Choice(GREEDY, False, "no candidate was given")
    best = min(
        candidates, key=lambda n: (-candidates[n].accuracy, candidates[n].completion_tokens, n)
    )
    score = candidates[best]
    if score.accuracy > greedy.accuracy:
        return Choice(
            best,
            True,
            f"{best} had the highest selection accuracy, {score.accuracy:.3f} against "
            f"greedy's {greedy.accuracy:.3f}",
        )
    return Choice(
        GREEDY,
        False,
        f"no candidate beat greedy on the selection part: the best, {best}, had "
        f"{score.accuracy:.3f} against greedy's {greedy.accuracy:.3f}",
    )
