"""Property tests of collaborations on the ScriptedEngine, in trio's virtual time.

Early-stopped votes return exactly what the full vote returns on the same
outputs; an adaptive best-of by likelihood returns what all its candidates
would; pruned voters' engine requests are aborted; no actor outlives its
collaboration; cancelling from outside leaves no live engine request.
"""

from __future__ import annotations

import re

import anyio
import trio
import trio.testing
from _prob_engine import LikelihoodEngine
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from microagent.actors import Runtime
from microagent.collab import AgentSpec, CollaborationEvent, collaborate
from microagent.collab._debias import ChoiceView, voter_order
from microagent.collab._tally import StopRule, adaptive_vote, beta_majority_probability, majority
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from strategies import choice_views, stop_rules

CHOICES = ("yes", "no", "maybe")
VOTER = re.compile(r"voter number (\d+)")


def run_virtual(fn, *args):  # type: ignore[no-untyped-def]
    """Run ``fn`` in trio with an autojumping mock clock: sleeps cost no wall time."""
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def voters(n: int) -> list[AgentSpec]:
    return [AgentSpec(f"v{i}", instructions=f"You are voter number {i}.") for i in range(n)]


def engine_for(answers: list[str], lengths: list[int]) -> ScriptedEngine:
    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        i = int(VOTER.findall(request.prompt.text)[-1])
        if request.sampling.choices:
            return answers[i]
        return " ".join(["step"] * lengths[i])  # reasoning of a voter-specific length

    return ScriptedEngine(script=script, decode_time_per_token=0.01, prefill_time_per_token=0.0001)


@st.composite
def vote_cases(draw: st.DrawFn) -> tuple[list[str], list[int], int]:
    n = draw(st.integers(1, 9))
    k = draw(st.integers(2, 3))
    answers = draw(st.lists(st.sampled_from(CHOICES[:k]), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    wave = draw(st.sampled_from([0, 0, 2, 3]))
    return answers, lengths, wave


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vote_cases())
def test_early_stopped_vote_equals_full_vote(case: tuple[list[str], list[int], int]) -> None:
    answers, lengths, wave = case
    k = len(set(answers)) if len(set(answers)) > 1 else 2
    choices = list(CHOICES[: max(k, 2)])
    for a in answers:
        if a not in choices:
            choices.append(a)

    async def main() -> None:
        results = {}
        for early in (False, True):
            engine = engine_for(answers, lengths)
            async with engine, Runtime(engine=engine) as rt:
                outcome = await collaborate(
                    engine,
                    "vote",
                    "Decide.",
                    voters(len(answers)),
                    runtime=rt,
                    answer={"choices": choices},
                    style="reason",
                    early_stop=early,
                    wave=wave,
                    max_tokens=64,
                )
                results[early] = outcome
                # no engine request and no actor survives the collaboration
                assert engine.live_requests() == frozenset()
                assert await engine.wait_idle(5)
                assert rt.actors() == []
                pruned = [a for a in outcome.agents if a.finish_reason == "pruned"]
                if not early:
                    assert not pruned and not outcome.early_stopped
                # a pruned voter's request was aborted, not left to finish: the engine
                # counts at most one abort per pruned voter, and none without pruning
                aborted = engine.stats().requests_aborted
                assert aborted <= len(pruned)
                if not early:
                    assert aborted == 0
                for agent in pruned:
                    assert agent.answer is None
        assert results[True].answer == results[False].answer
        assert results[False].votes is not None
        assert sum(results[False].votes.values()) == len(answers)

    run_virtual(main)


@given(choice_views())
def test_a_voters_view_maps_back_to_the_canonical_choices_one_to_one(
    case: tuple[tuple[str, ...], int, bool],
) -> None:
    choices, voter, labels = case
    view = ChoiceView.for_voter(choices, voter, labels=labels)
    assert sorted(view.shown) == sorted(choices)
    back = [view.to_canonical(a) for a in view.allowed]
    assert sorted(back) == sorted(choices)  # a bijection from what it may answer onto choices
    for j, allowed in enumerate(view.allowed):  # the j-th thing shown maps to what is shown there
        assert view.to_canonical(allowed) == view.shown[j]
    assert view.to_canonical("not an option") == ""
    listing = view.listing()
    positions = [listing.index(c) for c in view.shown]
    assert positions == sorted(positions)  # listed in the voter's own order


@given(st.integers(1, 7), st.integers(0, 5))
def test_every_k_consecutive_voters_see_each_choice_in_each_position_once(
    k: int, block: int
) -> None:
    orders = [voter_order(k, v) for v in range(block * k, block * k + k)]
    for position in range(k):
        assert sorted(o[position] for o in orders) == list(range(k))


@given(st.integers(0, 30), st.integers(0, 30))
def test_beta_rule_probability_is_a_probability_symmetric_and_monotone(a: int, b: int) -> None:
    p = beta_majority_probability(a, b)
    assert 0.0 < p < 1.0
    assert abs(p + beta_majority_probability(b, a) - 1.0) < 1e-12
    assert beta_majority_probability(a + 1, b) > p
    if a == b:
        assert abs(p - 0.5) < 1e-12


@st.composite
def adaptive_cases(draw: st.DrawFn) -> tuple[list[str], int, tuple[str, float], bool]:
    n = draw(st.integers(1, 10))
    answers = draw(st.lists(st.sampled_from(CHOICES), min_size=n, max_size=n))
    rule = draw(stop_rules)
    wave = draw(st.integers(2 if rule[0] == "window" else 1, 4))
    return answers, wave, rule, draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adaptive_cases())
def test_adaptive_vote_answers_what_its_rule_gives_on_the_votes_it_drew(
    case: tuple[list[str], int, tuple[str, float], bool],
) -> None:
    """On the ScriptedEngine: the mode stops where the pure rule stops, with the same answer,
    and that answer is the plurality of the votes drawn (the full vote's when it never fires)."""
    answers, wave, (kind, confidence), early = case
    rule = StopRule(kind, confidence)
    expected, used = adaptive_vote(answers, wave, rule, CHOICES, exact=early)
    assert expected == majority(answers[:used], CHOICES)
    if kind == "off":
        assert expected == majority(answers, CHOICES)  # the exact test never changes it

    async def main() -> None:
        engine = engine_for(answers, [1] * len(answers))
        async with engine, Runtime(engine=engine) as rt:
            outcome = await collaborate(
                engine,
                "vote",
                "Decide.",
                voters(len(answers)),
                runtime=rt,
                answer={"choices": list(CHOICES)},
                style="direct",
                early_stop=early,
                wave=wave,
                adaptive=kind,
                confidence=confidence,
                max_tokens=8,
            )
            assert outcome.answer == expected
            samples = outcome.details["samples"]
            # the exact test may stop inside a wave (fewer votes, the same answer)
            assert samples == used or (early and samples < used)
            assert engine.live_requests() == frozenset()
            assert await engine.wait_idle(5)

    run_virtual(main)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.floats(0.01, 2.0))
def test_cancelling_from_outside_leaves_nothing_running(
    agents: int, rounds: int, after: float
) -> None:
    async def main() -> None:
        engine = ScriptedEngine(decode_time_per_token=0.01, reply_words=(20, 60))
        async with engine, Runtime(engine=engine) as rt:
            with anyio.move_on_after(after):
                await collaborate(
                    engine,
                    "debate",
                    "Argue.",
                    [AgentSpec("d", count=agents)],
                    runtime=rt,
                    rounds=rounds,
                    early_stop=False,
                )
            assert engine.live_requests() == frozenset()
            assert await engine.wait_idle(5)
            assert rt.actors() == []

    run_virtual(main)


def test_roles_exchange_handles_through_mailboxes() -> None:
    """Each role handled its turns as mailbox messages (not a gather of calls)."""

    async def main() -> None:
        engine = ScriptedEngine()
        events: list[CollaborationEvent] = []
        async with engine:
            outcome = await collaborate(
                engine,
                "debate",
                "Argue.",
                [AgentSpec("d", count=3)],
                rounds=2,
                early_stop=False,
                on_event=events.append,
            )
        for agent in outcome.agents:
            assert agent.messages == agent.requests == 2
        assert [e.type for e in events].count("round") == 2

    run_virtual(main)


def _mass(answers: list[str], probs: list[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for a, p in zip(answers, probs, strict=True):
        out[a] = out.get(a, 0.0) + p
    return out


@st.composite
def likelihood_cases(draw: st.DrawFn) -> tuple[list[str], list[float], list[int], int]:
    n = draw(st.integers(1, 7))
    answers = draw(st.lists(st.sampled_from(["7", "8", "9"]), min_size=n, max_size=n))
    probs = draw(
        st.lists(st.sampled_from([0.2, 0.35, 0.5, 0.65, 0.8, 0.95]), min_size=n, max_size=n)
    )
    lengths = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    return answers, probs, lengths, draw(st.integers(1, 3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(likelihood_cases())
def test_adaptive_best_of_answers_what_every_candidate_would(
    case: tuple[list[str], list[float], list[int], int],
) -> None:
    """It stops at the first wave after which the leader's lead exceeds what the candidates
    left could add (1 each), and its answer is the full sample's most probable answer."""
    answers, probs, lengths, wave = case
    full = _mass(answers, probs)
    ranked = sorted(full.values(), reverse=True)
    assume(len(ranked) == 1 or ranked[0] - ranked[1] > 1e-9)  # ties go by finish order
    expected = max(full, key=lambda a: full[a])
    used = len(answers)
    for k in range(wave, len(answers), wave):
        seen = [*sorted(_mass(answers[:k], probs[:k]).values(), reverse=True), 0.0]
        # a lead exactly at the bound is decided by rounding (sums of probabilities, or
        # of their logprobs' exponentials): either side is right, so the case says nothing
        assume(abs(seen[0] - seen[1] - (len(answers) - k)) > 1e-6)
        if seen[0] > seen[1] + (len(answers) - k):
            used = k
            break
    replies = [" ".join(["so"] * w + [f"it is {a}"]) for a, w in zip(answers, lengths, strict=True)]
    specs = [
        AgentSpec(f"c{i}", instructions=f"You are candidate number {i}.")
        for i in range(len(answers))
    ]

    async def main() -> None:
        engine = LikelihoodEngine(replies, probs)
        async with engine, Runtime(engine=engine) as rt:
            outcome = await collaborate(
                engine,
                "best_of",
                "Decide.",
                specs,
                runtime=rt,
                judge="likelihood",
                adaptive=True,
                wave=wave,
                answer={"extract": "number"},
                max_tokens=16,
            )
            assert outcome.answer == expected
            assert outcome.details["samples"] == used == len(engine.history)
            assert outcome.early_stopped == (used < len(answers))
            assert engine.live_requests() == frozenset()
            assert await engine.wait_idle(5)
            assert rt.actors() == []

    run_virtual(main)
