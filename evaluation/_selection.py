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


def choose(selection: Mapping[str, Score], max_token_ratio: float | None = None) -> Choice:
    """The configuration to use, from the selection part's scores (greedy's included).

    With ``max_token_ratio``, a candidate whose completion tokens per item exceed that
    multiple of greedy's on the selection part is not eligible: a configuration must
    pay for its tokens within the budget the user gave.

    Raises:
        KeyError: greedy's score is missing.
        ValueError: a ``max_token_ratio`` that is not positive.
    """
    if max_token_ratio is not None and not max_token_ratio > 0:
        raise ValueError(f"max_token_ratio must be positive, got {max_token_ratio}")
    greedy = selection[GREEDY]
    given = {name: s for name, s in selection.items() if name != GREEDY}
    if not given:
        return Choice(GREEDY, False, "no candidate was given")
    budget = None if max_token_ratio is None else max_token_ratio * greedy.completion_tokens
    candidates = {
        name: s for name, s in given.items() if budget is None or s.completion_tokens <= budget
    }
    if not candidates:
        return Choice(
            GREEDY,
            False,
            f"no candidate stayed within {max_token_ratio:g}x greedy's completion tokens "
            "on the selection part",
        )
    best = min(
        candidates, key=lambda n: (-candidates[n].accuracy, candidates[n].completion_tokens, n)
    )
    score = candidates[best]
    within = "" if budget is None else f" within {max_token_ratio:g}x greedy's tokens"
    if score.accuracy > greedy.accuracy:
        return Choice(
            best,
            True,
            f"{best} had the highest selection accuracy{within}, {score.accuracy:.3f} against "
            f"greedy's {greedy.accuracy:.3f}",
        )
    return Choice(
        GREEDY,
        False,
        f"no candidate{within} beat greedy on the selection part: the best, {best}, had "
        f"{score.accuracy:.3f} against greedy's {greedy.accuracy:.3f}",
    )
