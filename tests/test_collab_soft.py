"""Soft votes (``collab/_soft.py`` and ``vote``'s ``soft``/``calibrate``) on the ScriptedEngine."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import trio
import trio.testing
from _prob_engine import ProbEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from microagent.collab import (
    AgentSpec,
    CollaborationEvent,
    InvalidCollaboration,
    collaborate,
    prepare_collaboration,
)
from microagent.collab._soft import (
    SharedFirstToken,
    SoftBallot,
    SoftTally,
    calibrate,
    first_tokens,
    position_prior,
    read_ballot,
    soft_winner,
)
from microagent.collab._tally import Tally
from microagent.engine_bridge import EngineRequest, TokenLogprob
from microagent.testing import ScriptedEngine
from strategies import soft_ballots, vote_sequences

pytestmark = pytest.mark.anyio

CONTEXT = "Is the sky blue on a clear day?"
VOTER = re.compile(r"voter number (\d+)")
OPTION = re.compile(r"([A-Z])\) (\w+)")


def voters(n: int) -> list[AgentSpec]:
    return [AgentSpec(f"v{i}", instructions=f"You are voter number {i}.") for i in range(n)]


def run_virtual(fn, *args):  # type: ignore[no-untyped-def]
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


# --- pure parts ---------------------------------------------------------------------------


def test_read_ballot_renormalises_over_the_allowed_tokens() -> None:
    # the engine reports the whole vocabulary's top: tokens 7 and 9 are allowed
    first = TokenLogprob(
        7, math.log(0.3), ((3, math.log(0.5)), (7, math.log(0.3)), (9, math.log(0.1)))
    )
    ballot = read_ballot(first, (7, 9), (1, 0), sampled=0)
    assert ballot is not None and not ballot.fallback
    assert ballot.probs == pytest.approx((0.75, 0.25))
    assert ballot.mass == pytest.approx(0.4)
    assert ballot.canonical() == pytest.approx((0.25, 0.75))  # shown (choice 1, choice 0)


def test_read_ballot_counts_an_unreported_choice_as_zero_and_falls_back_to_the_sample() -> None:
    first = TokenLogprob(7, math.log(0.3), ((3, math.log(0.5)), (7, math.log(0.3))))
    ballot = read_ballot(first, (7, 9), (0, 1), sampled=0)
    assert ballot is not None and ballot.probs == (1.0, 0.0)
    # neither allowed token reported (the sample took another tokenization): one-hot on it
    other = TokenLogprob(4, math.log(0.3), ((3, math.log(0.5)),))
    fallback = read_ballot(other, (7, 9), (0, 1), sampled=1)
    assert fallback is not None and fallback.fallback and fallback.probs == (0.0, 1.0)
    assert read_ballot(None, (7, 9), (0, 1), sampled=None) is None


def test_first_tokens_refuses_answers_that_share_their_first_token() -> None:
    engine = ScriptedEngine()
    assert len(set(first_tokens(["yes", "no", "A"], engine.tokenize))) == 3
    with pytest.raises(SharedFirstToken) as info:
        first_tokens(["new york", "new delhi"], engine.tokenize)
    assert (info.value.first, info.value.second) == ("new york", "new delhi")


def test_position_calibration_removes_a_position_prior_shared_by_every_voter() -> None:
    """Voters prefer the first shown option 4:1 over a content signal of 0.45 : 0.55."""
    bias, truth = (0.8, 0.2), (0.45, 0.55)
    ballots: list[SoftBallot | None] = []
    for order in [(0, 1), (1, 0), (1, 0), (0, 1), (0, 1)]:
        raw = [bias[j] * truth[i] for j, i in enumerate(order)]
        ballots.append(SoftBallot(order, tuple(r / sum(raw) for r in raw)))
    plain, _, _ = soft_winner(ballots, ["yes", "no"], "off")
    fixed, tally, prior = soft_winner(ballots, ["yes", "no"], "position")
    assert plain == "yes"  # three of five voters saw "yes" first: the bias wins
    assert fixed == "no" and prior is not None and prior[0] > 0.7
    assert sum(tally.distribution().values()) == pytest.approx(1.0)
    assert position_prior(ballots[:1], 2) is None  # no whole Latin square: nothing to measure


# --- properties ---------------------------------------------------------------------------


@given(vote_sequences())
def test_soft_votes_equal_hard_votes_when_every_voter_is_certain(
    case: tuple[tuple[str, ...] | None, list[str]],
) -> None:
    choices, answers = case
    assert choices is not None
    hard = Tally(total_voters=len(answers), choices=choices)
    soft = SoftTally(total_voters=len(answers), choices=choices)
    for a in answers:
        hard.add(a)
        soft.add(tuple(1.0 if c == a else 0.0 for c in choices) if a else ())
        assert soft.leader() == hard.leader()
        assert soft.decided() == hard.decided()


@given(soft_ballots())
def test_calibrated_ballots_stay_distributions_and_a_uniform_prior_changes_nothing(
    case: tuple[int, list[tuple[tuple[int, ...], tuple[float, ...]]]],
) -> None:
    k, raw = case
    ballots: list[SoftBallot | None] = [SoftBallot(o, p) for o, p in raw]
    used, prior = calibrate(ballots, k, "position")
    assert (prior is None) == (len(raw) < k)
    for b in used:
        assert b is not None and sum(b.probs) == pytest.approx(1.0)
        assert sorted(b.canonical()) == pytest.approx(sorted(b.probs))
    flat = [SoftBallot(o, p).calibrated([1 / k] * k) for o, p in raw]
    for b, (_, p) in zip(flat, raw, strict=True):
        assert b.probs == pytest.approx(p)


@st.composite
def soft_cases(draw: st.DrawFn) -> tuple[list[tuple[float, float, float]], int]:
    n = draw(st.integers(1, 7))
    dists = []
    for _ in range(n):
        w = draw(st.lists(st.integers(1, 20), min_size=3, max_size=3))
        dists.append(tuple(x / sum(w) for x in w))
    return dists, draw(st.sampled_from([0, 2, 3]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soft_cases())
def test_an_early_stopped_soft_vote_returns_what_the_full_soft_vote_returns(
    case: tuple[list[tuple[float, float, float]], int],
) -> None:
    dists, wave = case
    choices = ("yes", "no", "maybe")

    def probs(request: EngineRequest) -> dict[str, float]:
        i = int(VOTER.findall(request.prompt.text)[-1])
        return dict(zip(choices, dists[i], strict=True))

    expected, _, _ = soft_winner([SoftBallot((0, 1, 2), d) for d in dists], choices, "off")

    async def main() -> None:
        for early in (False, True):
            engine = ProbEngine(probs)
            async with engine:
                outcome = await collaborate(
                    engine,
                    "vote",
                    CONTEXT,
                    voters(len(dists)),
                    answer={"choices": list(choices)},
                    style="direct",
                    soft=True,
                    early_stop=early,
                    wave=wave,
                )
                assert engine.live_requests() == frozenset()
            assert outcome.answer == expected
            if not early:
                assert outcome.details["samples"] == len(dists)

    run_virtual(main)


# --- the vote mode ------------------------------------------------------------------------


async def test_soft_vote_sums_probabilities_where_counting_samples_goes_wrong() -> None:
    # three voters lean "yes" (0.55), two are sure of "no" (0.95): 3-2 counted, 1.75-3.25 summed
    lean = {0: 0.55, 1: 0.55, 2: 0.55, 3: 0.05, 4: 0.05}

    def probs(request: EngineRequest) -> dict[str, float]:
        i = int(VOTER.findall(request.prompt.text)[-1])
        return {"yes": lean[i], "no": 1 - lean[i]}

    events: list[CollaborationEvent] = []
    async with ProbEngine(probs) as engine:
        hard = await collaborate(
            engine, "vote", CONTEXT, voters(5), answer=["yes", "no"], style="direct",
            early_stop=False,
        )  # fmt: skip
        soft = await collaborate(
            engine, "vote", CONTEXT, voters(5), answer=["yes", "no"], style="direct",
            early_stop=False, soft=True, on_event=events.append,
        )  # fmt: skip
        asked = [r.sampling.logprobs for r in engine.history if r.sampling.choices]
    assert hard.answer == "yes" and hard.votes == {"yes": 3, "no": 2}
    assert soft.answer == "no" and soft.votes == {"yes": 3, "no": 2}  # votes stay the samples
    summary = soft.details["soft"]
    assert summary["sums"] == pytest.approx({"no": 3.25, "yes": 1.75})
    assert summary["distribution"] == pytest.approx({"no": 0.65, "yes": 0.35})
    assert summary["calibrate"] == "off" and summary["fallbacks"] == 0
    assert len(soft.details["ballots"]) == 5
    assert asked[5:] == [20] * 5 and asked[:5] == [None] * 5  # only soft votes ask for logprobs
    got = sorted(e.data["p"]["no"] for e in events if e.type == "vote")
    assert got == pytest.approx([0.45, 0.45, 0.45, 0.95, 0.95])


async def test_soft_vote_on_made_up_logprobs_agrees_with_the_hard_vote() -> None:
    answers = iter(["yes", "yes", "yes", "no", "no"])

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return next(answers) if request.sampling.choices else None

    async with ScriptedEngine(script=script, decode_time_per_token=0.01) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=5)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            soft=True,
        )
        assert engine.live_requests() == frozenset()
    # the double makes the sampled token the most likely: each ballot leans its own way
    assert outcome.answer == "yes"
    assert list(outcome.details["soft"]["distribution"]) == ["yes", "no"]


async def test_certain_soft_voters_stop_exactly_where_hard_voters_stop() -> None:
    picks = ["yes", "yes", "yes", "no", "no"]

    def probs(request: EngineRequest) -> dict[str, float]:
        pick = picks[int(VOTER.findall(request.prompt.text)[-1])]
        return {pick: 1.0}

    async with ProbEngine(probs) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            voters(5),
            answer=["yes", "no"],
            style="direct",
            soft=True,
            wave=1,
        )
        assert engine.live_requests() == frozenset()
    assert outcome.answer == "yes" and outcome.early_stopped
    assert outcome.details["stopped_by"] == "exact" and outcome.details["samples"] == 3
    assert outcome.details["soft"]["sums"] == {"yes": 3.0, "no": 0.0}
    assert [a.finish_reason for a in outcome.agents].count("pruned") == 2


async def test_calibrated_soft_labels_vote_undoes_a_position_bias() -> None:
    """Each voter prefers option A 4:1 over a content signal that favours "no" slightly."""
    bias, truth = (0.8, 0.2), {"yes": 0.45, "no": 0.55}

    def probs(request: EngineRequest) -> dict[str, float]:
        letters = dict(OPTION.findall(request.prompt.text))
        raw = {L: bias["AB".index(L)] * truth[w] for L, w in letters.items()}
        return {L: r / sum(raw.values()) for L, r in raw.items()}

    async with ProbEngine(probs) as engine:
        common = {
            "answer": {"choices": ["yes", "no"]},
            "style": "direct",
            "debias": "labels",
            "early_stop": False,
        }
        hard = await collaborate(engine, "vote", CONTEXT, [AgentSpec("v", count=5)], **common)
        plain = await collaborate(
            engine, "vote", CONTEXT, [AgentSpec("v", count=5)], soft=True, **common
        )
        fixed = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("v", count=5)],
            soft=True,
            calibrate="position",
            **common,
        )
    assert hard.answer == "yes" and plain.answer == "yes"  # 3 of 5 voters saw "yes" as A
    assert fixed.answer == "no"
    assert fixed.details["soft"]["position_prior"][0] == pytest.approx(0.798, abs=0.002)
    assert fixed.details["ballots"][0]["shown"] == ["yes", "no"]


async def test_soft_letters_choices_whose_first_tokens_coincide_and_says_so() -> None:
    choices = ["new york", "new delhi"]
    async with ScriptedEngine() as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            voters(2),
            answer=choices,
            style="direct",
            soft=True,
            early_stop=False,
        )
        assert engine.live_requests() == frozenset()
    assert outcome.answer in choices
    fallback = outcome.details["soft_fallback"]
    assert fallback["to"] == "labels" and "'new york'" in fallback["why"]
    assert outcome.details["debias"] == "labels"
    # each voter scored letters, in its own order, and its ballot sums to 1
    assert [b["shown"] for b in outcome.details["ballots"]] == [choices, choices[::-1]]
    for ballot in outcome.details["ballots"]:
        assert sum(ballot["p"]) == pytest.approx(1.0, abs=1e-3)


async def test_soft_over_more_choices_than_letters_falls_back_to_a_hard_vote() -> None:
    choices = [f"new {w}" for w in ("york", "delhi")] + [f"x{i:02d}" for i in range(26)]
    async with ScriptedEngine() as engine:
        outcome = await collaborate(
            engine, "vote", CONTEXT, voters(3), answer=choices, style="direct", soft=True,
            answer_tokens=1,
        )  # fmt: skip
        assert engine.live_requests() == frozenset()
    assert outcome.details["soft_fallback"]["to"] == "hard"
    assert "soft" not in outcome.details
    # the answer budget grew to fit the longest choice: every vote names a whole choice
    assert outcome.answer in choices and sum(outcome.votes.values()) == 3


async def test_soft_vote_in_reason_style_reads_the_answer_step() -> None:
    async with ScriptedEngine(script=lambda p, r: "no" if r.sampling.choices else None) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            voters(3),
            answer=["yes", "no"],
            style="reason",
            soft=True,
            max_tokens=16,
            early_stop=False,
        )
        answer_steps = [r for r in engine.history if r.sampling.choices]
    assert outcome.answer == "no" and len(outcome.details["ballots"]) == 3
    assert all(r.sampling.logprobs == 20 for r in answer_steps)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"soft": True}, "collaboration.soft"),  # no fixed choices
        ({"soft": "yes", "answer": ["a", "b"]}, "collaboration.soft"),
        ({"soft": True, "answer": ["a", "b"], "adaptive": "beta"}, "collaboration.adaptive"),
        ({"calibrate": "position", "answer": ["a", "b"]}, "collaboration.calibrate"),
        ({"soft": True, "calibrate": "position", "answer": ["a", "b"]}, "collaboration.calibrate"),
        ({"soft": True, "calibrate": "prior", "answer": ["a", "b"]}, "collaboration.calibrate"),
    ],
)
def test_bad_soft_options_name_their_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("vote", None, options)
    assert info.value.field == field


def test_position_calibration_needs_as_many_voters_as_choices() -> None:
    options = {"soft": True, "calibrate": "position", "debias": "labels", "answer": ["a", "b", "c"]}
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("vote", [{"name": "v", "count": 2}], options)
    assert info.value.field == "collaboration.calibrate"
    prepare_collaboration("vote", [{"name": "v", "count": 3}], options)


def test_content_calibration_divides_each_ballot_by_its_own_prior() -> None:
    ballots = [SoftBallot((0, 1), (0.8, 0.2)), SoftBallot((1, 0), (0.6, 0.4)), None]
    priors = [(0.8, 0.2), None, (0.5, 0.5)]
    used, prior = calibrate(ballots, 2, "content", priors)
    assert prior is None and used[1] is ballots[1] and used[2] is None
    assert used[0] is not None and used[0].probs == pytest.approx((0.5, 0.5))
    with pytest.raises(ValueError):
        calibrate(ballots, 2, "content")


async def test_content_calibrated_soft_vote_undoes_a_yes_bias() -> None:
    """Each voter says "yes" 3:1 whatever it is asked; the question favours "no" slightly."""
    bias = {"yes": 0.75, "no": 0.25}
    asked: dict[str, str] = {}

    def probs(request: EngineRequest) -> dict[str, float]:
        text = request.prompt.text
        content_free = "N/A" in text and CONTEXT not in text
        asked[request.request_id] = "null" if content_free else "vote"
        signal = {"yes": 0.5, "no": 0.5} if content_free else {"yes": 0.45, "no": 0.55}
        raw = {w: bias[w] * signal[w] for w in ("yes", "no")}
        return {w: r / sum(raw.values()) for w, r in raw.items()}

    async with ProbEngine(probs) as engine:
        common = {"answer": ["yes", "no"], "style": "direct", "soft": True, "debias": "order"}
        plain = await collaborate(engine, "vote", CONTEXT, [AgentSpec("v", count=4)], **common)
        asked.clear()
        fixed = await collaborate(
            engine, "vote", CONTEXT, [AgentSpec("v", count=4)], calibrate="content", **common
        )
        assert engine.live_requests() == frozenset()
    assert plain.answer == "yes" and fixed.answer == "no"
    assert sorted(asked.values()) == ["null"] * 2 + ["vote"] * 4  # a prior per listing
    priors = fixed.details["soft"]["content_priors"]
    assert sorted(tuple(p["shown"]) for p in priors) == [("no", "yes"), ("yes", "no")]
    for p in priors:
        assert dict(zip(p["shown"], p["p"], strict=True))["yes"] == pytest.approx(0.75)
    assert fixed.details["soft"]["distribution"]["no"] == pytest.approx(0.55, abs=1e-3)


def test_content_calibration_needs_direct_answers() -> None:
    options = {"soft": True, "calibrate": "content", "answer": ["yes", "no"], "style": "reason"}
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("vote", None, options)
    assert info.value.field == "collaboration.calibrate"
    prepare_collaboration("vote", None, {**options, "style": "direct"})


async def test_a_one_token_soft_vote_answers_with_whole_choices() -> None:
    choices = ["new york", "los angeles"]  # two tokens each, different first tokens

    def probs(request: EngineRequest) -> dict[str, float]:
        return {"new york": 0.3, "los angeles": 0.7}

    async with ProbEngine(probs) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("v", count=2)],
            answer=choices,
            style="direct",
            soft=True,
            debias="order",
            answer_tokens=1,
        )
        assert engine.live_requests() == frozenset()
    assert outcome.answer == "los angeles" and outcome.votes == {"los angeles": 2}
    assert all(a.completion_tokens == 1 for a in outcome.agents)
    assert outcome.details["soft"]["fallbacks"] == 0


# --- the published configurations never refuse a valid question ------------------------------

PUBLISHED = Path(__file__).resolve().parent.parent / "bench" / "results"
WORDS = ("new", "york", "delhi", "12", "14", "1", "big", "red", "the", "a", "of")


@st.composite
def choice_sets(draw: st.DrawFn) -> list[str]:
    """Choice sets that share first tokens often: numbers with common prefixes, multi-word
    choices over a small vocabulary, long options, up to 30 choices (more than letters)."""
    number = st.integers(0, 200).map(lambda n: f"1{n}")
    phrase = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
    size = draw(st.sampled_from([2, 3, 5, 27, 30]))
    return draw(st.lists(st.one_of(number, phrase), min_size=size, max_size=size, unique=True))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choice_sets(),
    st.sampled_from(["quality_best.json", "quality_best_free.json", "auto"]),
    st.sampled_from([CONTEXT, "What is 12 + 7?"]),  # compute: nothing to compute, or a sum
)
def test_published_configurations_answer_every_choice_set(
    choices: list[str], name: str, question: str
) -> None:
    if name == "auto":
        agents: list[AgentSpec] = [AgentSpec("v", count=3)]
        mode, options = "auto", {}
    else:
        published = json.loads((PUBLISHED / name).read_text())
        agents = [AgentSpec(**a) for a in published["agents"]]
        options = dict(published["collaboration"])
        mode = options.pop("mode")

    async def main() -> None:
        async with ScriptedEngine() as engine:
            outcome = await collaborate(
                engine, mode, question, agents, answer=choices, max_tokens=8, **options
            )
            assert engine.live_requests() == frozenset()
        assert outcome.answer in choices

    run_virtual(main)
