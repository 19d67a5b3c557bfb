"""Soft votes: each voter's probability of every choice, summed instead of counted.

A hard vote keeps one sample per voter and throws the rest of its distribution
away; a soft vote keeps the distribution. It is read from the logprobs of the
constrained answer step's **first token**:

- Rule: every allowed answer text is tokenized alone (``first_tokens``) and its
  probability is that of its first token at the answer's first position. This
  is sound when the allowed texts start with pairwise different tokens (then
  the first token decides the answer) and exact for one-token answers (the
  letters of ``debias: labels``). When two allowed texts share their first
  token the rule does not apply and ``first_tokens`` refuses, naming both
  (the vote mode reports it on ``collaboration.soft``; ``debias: labels`` always
  qualifies). Multi-token sequence scoring is not done: it would cost one
  forced request per choice and voter.
- Renormalisation: the engine reports the top ``SOFT_TOP_LOGPROBS`` tokens of
  the whole vocabulary at that position (vLLM: after the structured-output
  mask, so usually the allowed tokens already hold all the mass; other engines
  may report the unconstrained distribution). The probabilities of the allowed
  first tokens are renormalised over the allowed texts; a text whose token is
  not among the reported ones counts 0. ``SoftBallot.mass`` keeps the
  probability before renormalisation. When no allowed token was reported (a
  sample that took another tokenization), the ballot falls back to the sampled
  answer with probability 1 (``SoftBallot.fallback``).

Calibration across voters (``calibrate``):

- ``off``: each voter's renormalised distribution counts as it is.
- ``position``: with debiased views (voters see the choices in different
  orders) a voter's preference for a *position* can be measured apart from
  content: the position prior is the mean distribution over shown positions of
  the first ``k * (n // k)`` voters (whole Latin squares of ``voter_order``, so
  each choice stands at each position equally often and content averages out).
  Each voter's distribution is divided by that prior, position by position,
  and renormalised (the prior-removal of PriDe, Zheng et al. 2023, measured
  on the vote's own voters: no extra request). With fewer than ``k`` ballots
  in those blocks there is no prior and nothing is calibrated.
- ``content``: contextual calibration (Zhao et al. 2021, arXiv 2102.09690):
  for each distinct view of the choices, one more constrained answer step is
  asked with the question replaced by the content-free text ``CONTENT_FREE``
  (the same instructions and listing, the context's system turns kept). Its
  distribution over the shown positions is the model's prior for that
  listing, whatever the question (a preference for "yes", for a word, for the
  first position); each voter's distribution is divided by its view's prior and
  renormalised. Costs one short request per distinct view (two for a debiased
  two-choice vote); only ``style: direct`` (the content-free step is a direct
  answer).

``SoftTally`` sums canonical distributions; its exact early-stop test is the
hard tally's with each outstanding voter worth at most 1 to any choice, and
its tie rule is the hard tally's (the choice listed first wins). With every
voter certain (one-hot distributions) it gives what ``Tally`` gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs

from ..engine_bridge import MAX_TOP_LOGPROBS, TokenLogprob

SOFT_CALIBRATIONS = ("off", "position", "content")
#: the question a ``content`` calibration asks instead of the real one
CONTENT_FREE = "N/A"
#: alternatives asked per answer token (the most an engine gives)
SOFT_TOP_LOGPROBS = MAX_TOP_LOGPROBS


class SharedFirstToken(ValueError):
    """Two allowed answers start with one token: the first-token rule cannot tell them apart."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(
            f"answers {first!r} and {second!r} start with the same token, so their "
            "probabilities cannot be read from the first token"
        )
        self.first = first
        self.second = second


def first_tokens(texts: Sequence[str], tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    """The first token id of each text, tokenized alone.

    Raises:
        SharedFirstToken: two texts start with the same token (or one is empty).
    """
    out: list[int] = []
    owner: dict[int, str] = {}
    for text in texts:
        ids = list(tokenize(text))
        if not ids:
            raise SharedFirstToken(text, text)
        if ids[0] in owner:
            raise SharedFirstToken(owner[ids[0]], text)
        owner[ids[0]] = text
        out.append(ids[0])
    return tuple(out)


@attrs.frozen
class SoftBallot:
    """One voter's probabilities over the answers in the order it was shown them.

    Attributes:
        order: ``shown[j] = choices[order[j]]`` (the identity without debiasing).
        probs: probability of each shown answer, summing to 1.
        mass: their probability before renormalisation (as the engine reported it).
        fallback: no allowed token was reported: ``probs`` is the sampled answer, one-hot.
    """

    order: tuple[int, ...]
    probs: tuple[float, ...]
    mass: float = 1.0
    fallback: bool = False

    def __attrs_post_init__(self) -> None:
        if sorted(self.order) != list(range(len(self.probs))):
            raise ValueError(f"order {self.order} is not a permutation of {len(self.probs)}")

    def canonical(self) -> tuple[float, ...]:
        """The probabilities in the canonical order of the choices."""
        out = [0.0] * len(self.probs)
        for j, i in enumerate(self.order):
            out[i] = self.probs[j]
        return tuple(out)

    def calibrated(self, prior: Sequence[float]) -> SoftBallot:
        """This ballot with a prior over shown positions divided out (zero prior gives 0)."""
        raw = [p / q if q > 0 else 0.0 for p, q in zip(self.probs, prior, strict=True)]
        total = sum(raw)
        if total <= 0:
            return self
        return attrs.evolve(self, probs=tuple(r / total for r in raw))


def read_ballot(
    first: TokenLogprob | None,
    token_ids: Sequence[int],
    order: Sequence[int],
    sampled: int | None,
) -> SoftBallot | None:
    """A voter's ballot from the logprobs of its answer's first token.

    Args:
        first: the first output token's logprobs (None when the engine gave none).
        token_ids: the first token of each shown answer (``first_tokens``).
        order: the voter's permutation of the canonical choices.
        sampled: the shown position of the answer it sampled (None: it named none).

    Returns:
        The renormalised ballot, a one-hot fallback on ``sampled``, or None (an
        abstention: no reported probability and no sampled answer).
    """
    logprobs: dict[int, float] = {}
    if first is not None:
        logprobs.update(first.top)
        logprobs.setdefault(first.token_id, first.logprob)
    raw = [math.exp(logprobs[t]) if t in logprobs else 0.0 for t in token_ids]
    mass = sum(raw)
    if mass > 0 and all(math.isfinite(r) for r in raw):
        return SoftBallot(tuple(order), tuple(r / mass for r in raw), mass)
    if sampled is None:
        return None
    one_hot = tuple(1.0 if j == sampled else 0.0 for j in range(len(token_ids)))
    return SoftBallot(tuple(order), one_hot, 0.0, fallback=True)


def position_prior(ballots: Sequence[SoftBallot | None], k: int) -> tuple[float, ...] | None:
    """The mean distribution over shown positions of the first ``k * (n // k)`` voters.

    ``ballots`` is in voter order (None: that voter abstained). Returns None when
    fewer than ``k`` of those voters have a ballot.
    """
    block = [b for b in ballots[: k * (len(ballots) // k)] if b is not None]
    if len(block) < k:
        return None
    return tuple(sum(b.probs[j] for b in block) / len(block) for j in range(k))


def calibrate(
    ballots: Sequence[SoftBallot | None],
    k: int,
    how: str,
    priors: Sequence[Sequence[float] | None] | None = None,
) -> tuple[list[SoftBallot | None], tuple[float, ...] | None]:
    """The ballots under calibration ``how`` (``SOFT_CALIBRATIONS``) and the prior it used.

    ``priors`` (for ``content``): each voter's content-free distribution over its shown
    positions (None: none measured, that ballot stays as it is). The returned prior is
    the position prior (``position``) or None.
    """
    if how not in SOFT_CALIBRATIONS:
        raise ValueError(f"calibration must be one of {SOFT_CALIBRATIONS}, got {how!r}")
    if how == "content":
        if priors is None or len(priors) != len(ballots):
            raise ValueError("content calibration needs one prior (or None) per ballot")
        return [
            b if b is None or q is None else b.calibrated(q)
            for b, q in zip(ballots, priors, strict=True)
        ], None
    prior = position_prior(ballots, k) if how == "position" else None
    if prior is None:
        return list(ballots), None
    return [None if b is None else b.calibrated(prior) for b in ballots], prior


@attrs.define
class SoftTally:
    """Summed probabilities per choice, with the exact early-stop test.

    An empty distribution is an abstention (counted as cast, adding nothing).
    """

    total_voters: int
    choices: tuple[str, ...]
    sums: dict[str, float] = attrs.field(init=False)
    cast: int = 0

    def __attrs_post_init__(self) -> None:
        self.sums = dict.fromkeys(self.choices, 0.0)

    def add(self, probs: Sequence[float]) -> None:
        """Count one voter's canonical distribution (``()`` for an abstention)."""
        if self.cast >= self.total_voters:
            raise ValueError("more votes than voters")
        self.cast += 1
        if not probs:
            return
        if len(probs) != len(self.choices):
            raise ValueError(f"{len(probs)} probabilities for {len(self.choices)} choices")
        for choice, p in zip(self.choices, probs, strict=True):
            self.sums[choice] += p

    @property
    def remaining(self) -> int:
        return self.total_voters - self.cast

    def leader(self) -> str:
        """The choice with the largest sum, the first listed among equals ("" before any mass)."""
        if not any(self.sums.values()):
            return ""
        return max(self.choices, key=lambda c: (self.sums[c], -self.choices.index(c)))

    def decided(self) -> bool:
        """True when the outstanding voters (at most 1 each) can no longer change the leader."""
        if self.remaining == 0:
            return True
        lead = self.leader()
        if not lead:
            return False
        top = self.sums[lead]
        rank = self.choices.index(lead)
        for i, rival in enumerate(self.choices):
            if rival == lead:
                continue
            best = self.sums[rival] + self.remaining
            if best > top or (best == top and i < rank):
                return False
        return True

    def distribution(self) -> dict[str, float]:
        """The sums normalised to 1 (all 0 before any mass), largest first."""
        total = sum(self.sums.values())
        return {
            c: (self.sums[c] / total if total else 0.0)
            for c in sorted(self.choices, key=lambda c: (-self.sums[c], self.choices.index(c)))
        }


def soft_winner(
    ballots: Sequence[SoftBallot | None], choices: Sequence[str], how: str = "off"
) -> tuple[str, SoftTally, tuple[float, ...] | None]:
    """The winner of a full soft vote over ``ballots`` (voter order), its tally and prior."""
    items = tuple(choices)
    used, prior = calibrate(ballots, len(items), how)
    tally = SoftTally(total_voters=len(used), choices=items)
    for b in used:
        tally.add(() if b is None else b.canonical())
    return tally.leader(), tally, prior


def rounded(values: Mapping[str, float], digits: int = 4) -> dict[str, float]:
    """``values`` rounded for reporting (events, details)."""
    return {k: round(v, digits) for k, v in values.items()}
