"""Collaboration-level scheduling: least attained service, critical path, aging (no starvation)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.collab import AgentSpec, CollaborationEvent, ServicePolicy, collaborate
from microagent.collab._scheduling import LEVEL_SPAN
from microagent.engine_bridge import Sampling
from microagent.testing import ScriptedEngine, run_virtual

policies = st.builds(
    ServicePolicy,
    level_tokens=st.floats(16, 4096),
    aging_seconds=st.floats(0.5, 120),
)
tokens = st.integers(0, 10**7)
ages = st.floats(0, 10**4)
offsets = st.integers(-LEVEL_SPAN, LEVEL_SPAN)


@given(policies, tokens, tokens, ages)
def test_more_service_never_means_earlier(
    policy: ServicePolicy, a: int, b: int, age: float
) -> None:
    low, high = sorted((a, b))
    assert policy.level(low, age) <= policy.level(high, age)


@given(policies, tokens, ages, ages)
def test_age_never_means_later(policy: ServicePolicy, attained: int, a: float, b: float) -> None:
    young, old = sorted((a, b))
    assert policy.level(attained, old) <= policy.level(attained, young)


@given(policies, tokens, offsets, offsets, offsets)
@settings(max_examples=300)
def test_no_collaboration_starves(
    policy: ServicePolicy, attained: int, mine: int, newcomer: int, other: int
) -> None:
    """However much an old collaboration consumed, it outranks any newcomer once old enough."""
    fresh = policy.priority(0, 0.0, newcomer)  # the best a newcomer can ever be
    levels = policy.level(attained, 0.0) + 2
    old_enough = policy.aging_seconds * levels
    assert policy.priority(attained, old_enough, mine) < fresh
    # and a level is a level: the critical path orders steps inside it, never across
    assert (
        abs(policy.priority(attained, 0.0, mine) - policy.priority(attained, 0.0, other))
        < LEVEL_SPAN
    )


def test_disabled_policy_is_the_critical_path_alone() -> None:
    policy = ServicePolicy(enabled=False)
    assert [policy.priority(10**6, 0.0, c) for c in (-2, 0)] == [-2, 0]


def test_scripted_engine_admits_in_priority_order() -> None:
    """With one slot, waiting requests start lowest priority first, then by arrival."""

    async def main() -> list[str]:
        started: list[str] = []
        async with ScriptedEngine(max_num_seqs=1, decode_time_per_token=0.01) as engine:
            prompt = engine.chat.prompt([{"role": "user", "content": "hello"}])

            async def one(name: str, priority: int) -> None:
                async with engine.stream(prompt, Sampling(max_tokens=4), priority=priority) as gen:
                    async for _ in gen:
                        if name not in started:
                            started.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "blocker", 0)
                await anyio.sleep(0.001)  # the blocker holds the only slot
                for name, priority in (("c", 3), ("a", 1), ("b", 2), ("a2", 1)):
                    tg.start_soon(one, name, priority)
                    await anyio.lowlevel.checkpoint()
        return started

    assert run_virtual(main) == ["blocker", "a", "a2", "b", "c"]


def _latency_of_a_short_collaboration_behind_a_long_one(
    policy: ServicePolicy,
) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        engine = ScriptedEngine(
            max_num_seqs=1,
            decode_time_per_token=0.02,
            prefill_time_per_token=0.0005,
            reply_words=(30, 30),
        )
        done: dict[str, float] = {}
        round_two = anyio.Event()

        def watch(event: CollaborationEvent) -> None:
            if event.type == "round" and event.data.get("round") == 2:
                round_two.set()  # round 3's four requests are about to queue for the slot

        async with engine:

            async def long() -> None:
                await collaborate(
                    engine,
                    "debate",
                    "A long question " * 40,
                    [AgentSpec("debater", count=4)],
                    rounds=4,
                    early_stop=False,
                    scheduling=policy,
                    on_event=watch,
                )
                done["long"] = anyio.current_time()

            async def short(start: float) -> None:
                await collaborate(
                    engine,
                    "vote",
                    "Is 2 a prime?",
                    [AgentSpec("voter", count=1)],
                    answer={"choices": ["yes", "no"]},
                    max_tokens=4,
                    scheduling=policy,
                )
                done["short"] = anyio.current_time() - start

            async with anyio.create_task_group() as tg:
                tg.start_soon(long)
                await round_two.wait()  # the long one has a level now (> 512 tokens)
                tg.start_soon(short, anyio.current_time())
        groups = {r.group for r in engine.history}
        assert len(groups) == 2 and None not in groups  # every request names its collaboration
        return done["short"], done["long"]

    return run_virtual(main)  # type: ignore[no-any-return]


def test_least_attained_service_lets_a_short_collaboration_through() -> None:
    """A hog (past the first level's tokens) is demoted: a newcomer passes its later rounds."""
    las, las_long = _latency_of_a_short_collaboration_behind_a_long_one(
        ServicePolicy(level_tokens=512)
    )
    fifo, fifo_long = _latency_of_a_short_collaboration_behind_a_long_one(
        ServicePolicy(enabled=False)
    )
    print(f"short collaboration latency: LAS {las:.2f} s, critical path only {fifo:.2f} s")
    assert las < fifo / 2  # it no longer waits behind the long one's later rounds
    assert las_long <= fifo_long * 1.2  # and the long one barely notices


def _finish_times_of_a_vote_and_a_later_debate(policy: ServicePolicy) -> tuple[float, float]:
    """A 3-voter reasoned vote, then a 3x2 debate started while the vote's first voter
    runs; one engine slot. The debate's steps carry critical-path offsets (-1, -2)
    that the vote's reasoning (0) does not: by request, they jump the queue."""

    async def main() -> tuple[float, float]:
        engine = ScriptedEngine(max_num_seqs=1, decode_time_per_token=0.01, reply_words=(20, 20))
        done: dict[str, float] = {}
        vote_running = anyio.Event()

        def watch(event: CollaborationEvent) -> None:
            if event.type == "delta":
                vote_running.set()

        async def vote() -> None:
            await collaborate(
                engine,
                "vote",
                "Is the sky blue? " * 10,
                [AgentSpec("voter", count=3)],
                answer={"choices": ["yes", "no"]},
                style="reason",
                scheduling=policy,
                on_event=watch,
            )
            done["vote"] = anyio.current_time()

        async def debate() -> None:
            await collaborate(
                engine,
                "debate",
                "Is grass green? " * 10,
                [AgentSpec("debater", count=3)],
                rounds=2,
                early_stop=False,
                scheduling=policy,
            )
            done["debate"] = anyio.current_time()

        async with engine, anyio.create_task_group() as tg:
            tg.start_soon(vote)
            await vote_running.wait()
            tg.start_soon(debate)
        return done["vote"], done["debate"]

    return run_virtual(main)  # type: ignore[no-any-return]


def test_inside_a_level_the_older_collaboration_finishes_first() -> None:
    """First come first served by collaboration, not by request: the older one is not
    stretched by the newcomer's requests jumping ahead of its own, and the last one
    ends when it did (the same work in all: nothing is wasted)."""
    vote, debate = _finish_times_of_a_vote_and_a_later_debate(ServicePolicy())
    mixed_vote, mixed_debate = _finish_times_of_a_vote_and_a_later_debate(
        ServicePolicy(arrival_order=False)
    )
    print(
        f"by collaboration {vote:.2f}/{debate:.2f} s, "
        f"by request {mixed_vote:.2f}/{mixed_debate:.2f} s"
    )
    assert vote < debate
    assert vote < 0.8 * mixed_vote  # by request, the debate's steps stretched the vote
    assert max(vote, debate) <= max(mixed_vote, mixed_debate) * 1.05


@given(policies, tokens, ages, st.integers(0, 10**12), st.integers(1, 10**6), offsets, offsets)
def test_inside_a_level_an_earlier_arrival_goes_first(
    policy: ServicePolicy, attained: int, age: float, early: int, later: int, x: int, y: int
) -> None:
    late = early + later
    assert policy.priority(attained, age, x, arrival=early) < policy.priority(
        attained, age, y, arrival=late
    )
    # vLLM carries priorities as int64
    assert -(2**63) <= policy.priority(10**15, 0.0, y, arrival=late) < 2**63
    assert -(2**63) <= policy.priority(0, 10**12, y, arrival=late) < 2**63


def test_arrival_numbers_follow_start_order() -> None:
    from microagent.collab._scheduling import arrival_number

    first, second = arrival_number(), arrival_number()
    assert second == first + 1
