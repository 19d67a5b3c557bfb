"""The report part's numbers, and the table a person reads.

Every figure comes from the replies on the report part, paired item by item with
greedy's: accuracy with its Wilson 95 % interval, the paired table (both right,
only greedy, only the candidate, neither) with the exact McNemar p, tokens and
latency as multiples of greedy's, and the refused, failed and abstained replies
(coverage and accuracy when answered beside accuracy).

A configuration that answers only some items (a gated vote that abstains) is
compared with greedy's own confidence cut-off at the same coverage: greedy's
accuracy on its ``round(coverage * n)`` items of highest answer log-probability
(``Reply.logprob``; ties in item order, greedy replies without one ranked last).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from ._candidates import GREEDY
from ._grading import is_correct
from ._items import EvalItem
from ._runner import Reply
from ._selection import Choice, Score
from ._stats import PairedTable, wilson

#: the significance level the table's verdicts use
ALPHA: Final = 0.05


@attrs.frozen
class ConfigReport:
    """One configuration on the report part.

    Attributes:
        name: the configuration.
        n: report items.
        correct: items it got right.
        accuracy: ``correct / n``.
        wilson: the 95 % Wilson interval of the accuracy.
        answered: items it answered (not refused, failed or abstained).
        coverage: ``answered / n`` (0 when there are no items).
        accuracy_when_answered: right among those answered (None when none was).
        greedy_at_coverage: greedy's accuracy on its most confident items, as many as
            this configuration answered (``greedy_cutoff``), when its coverage is below 1
            and greedy's replies carry log-probabilities; else None.
        refused: items its configuration refused (the server's 400).
        abstained: items it declined to answer ("no confident answer").
        failed: items whose collaboration produced no answer.
        completion_tokens: mean completion tokens per item.
        prompt_tokens: mean prompt tokens per item.
        seconds: mean wall time per item.
        tokens_vs_greedy: completion tokens as a multiple of greedy's (None: greedy used 0).
        latency_vs_greedy: wall time as a multiple of greedy's (None: greedy took 0).
        paired: the paired table against greedy (None for greedy itself).
        p_vs_greedy: its exact two-sided McNemar p (None for greedy).
        families: family -> (items, accuracy) where the items have families.
    """

    name: str
    n: int
    correct: int
    accuracy: float
    wilson: tuple[float, float]
    answered: int
    coverage: float
    accuracy_when_answered: float | None
    greedy_at_coverage: float | None
    refused: int
    abstained: int
    failed: int
    completion_tokens: float
    prompt_tokens: float
    seconds: float
    tokens_vs_greedy: float | None
    latency_vs_greedy: float | None
    paired: PairedTable | None
    p_vs_greedy: float | None
    families: dict[str, tuple[int, float]]


def score(items: Sequence[EvalItem], replies: Sequence[Reply]) -> Score:
    """The selection rule's view of replies on items (same order)."""
    right = [
        is_correct(r.answer, i.answers, i.choices) for i, r in zip(items, replies, strict=True)
    ]
    tokens = statistics.fmean(r.completion_tokens for r in replies) if replies else 0.0
    return Score(len(items), sum(right), tokens)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def greedy_cutoff(right: Sequence[bool], greedy: Sequence[Reply], k: int) -> float | None:
    """Greedy's accuracy on its ``k`` items of highest answer log-probability.

    ``right[i]``: whether greedy's reply ``greedy[i]`` is right. Ties keep item order;
    replies without a log-probability rank last. None when ``k`` is 0 or no reply
    carries a log-probability (nothing to rank by).
    """
    if k <= 0 or all(r.logprob is None for r in greedy):
        return None
    scores = [-math.inf if r.logprob is None else r.logprob for r in greedy]
    ranked = sorted(range(len(greedy)), key=lambda i: -scores[i])
    top = ranked[:k]
    return sum(right[i] for i in top) / len(top)


def config_report(
    name: str,
    items: Sequence[EvalItem],
    replies: Sequence[Reply],
    greedy: Sequence[Reply],
) -> ConfigReport:
    """``name``'s report on ``items`` from its replies and greedy's (all in item order)."""
    right = [
        is_correct(r.answer, i.answers, i.choices) for i, r in zip(items, replies, strict=True)
    ]
    base = [is_correct(r.answer, i.answers, i.choices) for i, r in zip(items, greedy, strict=True)]
    n = len(items)
    answered = [ok for ok, r in zip(right, replies, strict=True) if r.answered]
    coverage = len(answered) / n if n else 0.0
    cutoff = (
        greedy_cutoff(base, greedy, round(coverage * n))
        if name != GREEDY and coverage < 1
        else None
    )

    def mean(values: Sequence[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    tokens = mean([r.completion_tokens for r in replies])
    seconds = mean([r.seconds for r in replies])
    paired = None if name == GREEDY else PairedTable.of(right, base)
    families: dict[str, tuple[int, float]] = {}
    for family in dict.fromkeys(i.family for i in items if i.family):
        mine = [ok for ok, i in zip(right, items, strict=True) if i.family == family]
        families[family] = (len(mine), sum(mine) / len(mine))
    return ConfigReport(
        name=name,
        n=n,
        correct=sum(right),
        accuracy=sum(right) / n if n else 0.0,
        wilson=wilson(sum(right), n),
        answered=len(answered),
        coverage=coverage,
        accuracy_when_answered=sum(answered) / len(answered) if answered else None,
        greedy_at_coverage=cutoff,
        refused=sum(r.refused is not None for r in replies),
        abstained=sum(r.abstained for r in replies),
        failed=sum(r.failed is not None for r in replies),
        completion_tokens=tokens,
        prompt_tokens=mean([r.prompt_tokens for r in replies]),
        seconds=seconds,
        tokens_vs_greedy=_ratio(tokens, mean([r.completion_tokens for r in greedy])),
        latency_vs_greedy=_ratio(seconds, mean([r.seconds for r in greedy])),
        paired=paired,
        p_vs_greedy=None if paired is None else paired.p,
        families=families,
    )


def _f(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def verdict(choice: Choice, reports: Mapping[str, ConfigReport]) -> str:
    """What the run found, in plain words: the choice and how it held on the report part."""
    if not choice.beat_greedy:
        return (
            f"Nothing beat greedy on your questions: {choice.reason}. Use plain greedy "
            "(one call at temperature 0, no collaboration); no preset was written."
        )
    chosen, greedy = reports[choice.name], reports[GREEDY]
    diff = 100 * (chosen.accuracy - greedy.accuracy)
    paired = chosen.paired
    assert paired is not None
    held = (
        "a significant gain"
        if chosen.p_vs_greedy is not None
        and chosen.p_vs_greedy < ALPHA
        and paired.only_candidate > paired.only_greedy
        else "a significant loss"
        if chosen.p_vs_greedy is not None and chosen.p_vs_greedy < ALPHA
        else "not significant at p < 0.05"
    )
    return (
        f"Chosen: {choice.name} ({choice.reason}). On the report part it scores "
        f"{chosen.accuracy:.3f} against greedy's {greedy.accuracy:.3f} ({diff:+.1f} points, "
        f"won {paired.only_candidate}, lost {paired.only_greedy}, McNemar p = "
        f"{chosen.p_vs_greedy:.3g}: {held}) at {_x(chosen.tokens_vs_greedy)} greedy's tokens."
    )


def render_table(
    selection: Mapping[str, Score],
    reports: Sequence[ConfigReport],
    choice: Choice,
    heading: str,
) -> str:
    """The run as text: the selection scores, the report table, per family, the verdict."""
    lines = [heading, "", "Selection part (where the choice is made):"]
    lines.append(f"  {'configuration':24s} {'items':>5s} {'accuracy':>8s} {'tokens/item':>11s}")
    for name, s in selection.items():
        mark = "  <- chosen" if name == choice.name else ""
        lines.append(f"  {name:24s} {s.n:5d} {s.accuracy:8.3f} {s.completion_tokens:11.1f}{mark}")
    n = reports[0].n if reports else 0
    lines += ["", f"Report part ({n} items, never used to choose):"]
    lines.append(
        f"  {'configuration':24s} {'accuracy':>8s} {'95% interval':>15s} {'both':>5s} "
        f"{'greedy':>6s} {'cand.':>6s} {'neither':>7s} {'McNemar p':>9s} {'tokens':>7s} "
        f"{'latency':>7s} {'refused':>7s} {'abstain':>7s} {'failed':>6s} {'cover':>5s} "
        f"{'acc|ans':>7s} {'greedy@c':>8s}"
    )
    for r in reports:
        lo, hi = r.wilson
        t = r.paired
        cells: tuple[str, ...] = (
            ("–", "–", "–", "–", "–")
            if t is None
            else (
                str(t.both),
                str(t.only_greedy),
                str(t.only_candidate),
                str(t.neither),
                f"{r.p_vs_greedy:.3g}",
            )
        )
        lines.append(
            f"  {r.name:24s} {r.accuracy:8.3f} {f'[{lo:.3f}, {hi:.3f}]':>15s} {cells[0]:>5s} "
            f"{cells[1]:>6s} {cells[2]:>6s} {cells[3]:>7s} {cells[4]:>9s} "
            f"{_x(r.tokens_vs_greedy):>7s} {_x(r.latency_vs_greedy):>7s} {r.refused:7d} "
            f"{r.abstained:7d} {r.failed:6d} {r.coverage:5.2f} {_f(r.accuracy_when_answered):>7s} "
            f"{_f(r.greedy_at_coverage):>8s}"
        )
    lines.append(
        "  (both/greedy/cand./neither: items both right, only greedy, only the candidate, "
        "neither; tokens and latency: multiples of greedy's; cover: share answered; acc|ans: "
        "accuracy when answered; greedy@c: greedy's accuracy on its most confident items at "
        "that coverage, by its answer's log-probability)"
    )
    families = list(dict.fromkeys(f for r in reports for f in r.families))
    if len(families) > 1:
        lines += ["", "Report part per family (accuracy, items):"]
        lines.append(f"  {'configuration':24s} " + " ".join(f"{f[:12]:>12s}" for f in families))
        for r in reports:
            shown = [
                f"{r.families[f][1]:.3f} ({r.families[f][0]})" if f in r.families else "–"
                for f in families
            ]
            lines.append(f"  {r.name:24s} " + " ".join(f"{c:>12s}" for c in shown))
    by_name = {r.name: r for r in reports}
    lines += ["", verdict(choice, by_name)]
    return "\n".join(lines) + "\n"
