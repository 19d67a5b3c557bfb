"""Collaboration modes on the ScriptedEngine: every role an actor, handles through mailboxes."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import anyio
import pytest
from microagent.collab import (
    AgentSpec,
    CollaborationContext,
    CollaborationEvent,
    CollaborationFailed,
    CollaborationOp,
    InvalidCollaboration,
    ModeConfig,
    ModeRegistry,
    ModeResult,
    ServicePolicy,
    Turn,
    collaborate,
    collaboration_modes,
    prepare_collaboration,
    register_mode,
    unregister_mode,
)
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

CONTEXT = "Is the sky blue on a clear day? " * 20


def reply_by_agent(replies: dict[str, str], default: str = "yes") -> object:
    """A script keyed on the role instructions found in the prompt."""

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        text = request.prompt.text
        if request.sampling.choices is not None:
            for key, reply in replies.items():
                if key in text:
                    return reply
            return default
        return None

    return script


async def test_builtin_modes_are_registered() -> None:
    assert {"vote", "debate", "reflect", "aggregate", "cascade"} <= set(collaboration_modes())


async def test_vote_direct_majority_and_early_stop() -> None:
    # voters 1-3 say yes, 4-5 say no: after 3 yes votes of 5, "no" cannot win.
    answers = iter(["yes", "yes", "yes", "no", "no"])

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return next(answers) if request.sampling.choices else None

    async with ScriptedEngine(script=script, decode_time_per_token=0.01) as engine:
        events: list[CollaborationEvent] = []
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=5)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            max_tokens=8,
            on_event=events.append,
        )
        assert outcome.answer == "yes"
        assert outcome.votes is not None and outcome.votes["yes"] == 3
        assert engine.live_requests() == frozenset()
        assert await engine.wait_idle(1.0)
    types = [e.type for e in events]
    assert types[-1] == "final"
    assert types.count("vote") >= 3


async def test_vote_tallies_the_extracted_number_of_free_answers() -> None:
    # three phrasings of 4 and one 5: a whole-reply tally would split them four ways
    replies = iter(["2 + 2 = 4", "The answer is 4.", "4", "I think 5"])

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return next(replies)

    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            "What is 2 + 2?",
            [AgentSpec("voter", count=4)],
            answer={"extract": "number"},
            style="direct",
            early_stop=False,
            max_tokens=8,
        )
    assert outcome.answer == "4"
    assert outcome.votes == {"4": 3, "5": 1}
    assert all(r.sampling.choices is None and r.sampling.regex is None for r in engine.history)


async def test_vote_early_stop_prunes_and_aborts() -> None:
    # slow decoding so the late voters are still running when the vote is decided
    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        if request.sampling.choices:
            return "yes"
        return None

    async with ScriptedEngine(
        script=script, decode_time_per_token=0.05, max_num_seqs=3, reply_words=(30, 30)
    ) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=5)],
            answer={"choices": ["yes", "no"]},
            style="reason",
            max_tokens=64,
        )
        assert outcome.answer == "yes"
        assert outcome.early_stopped
        pruned = [a for a in outcome.agents if a.finish_reason == "pruned"]
        assert pruned, [a.finish_reason for a in outcome.agents]
        assert outcome.usage.saved_completion_tokens > 0
        assert engine.live_requests() == frozenset()
        assert engine.stats().requests_aborted >= 1 or any(a.requests == 0 for a in pruned)
        assert await engine.wait_idle(1.0)


async def test_reason_then_answer_hits_cache_on_reasoning() -> None:
    async with ScriptedEngine(script=reply_by_agent({}, "no"), block_size=16) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=3)],
            answer={"choices": ["yes", "no"]},
            style="reason",
            max_tokens=64,
            early_stop=False,
        )
        assert outcome.answer == "no"
        # every voter made two requests; the answer step re-used its reasoning from cache
        for agent in outcome.agents:
            assert agent.requests == 2
        answer_steps = [r for r in engine.history if r.sampling.choices]
        assert len(answer_steps) == 3


def _disagreeing_debate(rounds: int) -> Callable[[object, object], str]:
    """A script whose three debaters never agree: round after round 4, 5, 6."""
    replies = iter(["Answer: 4", "Answer: 5", "Answer: 6"] * rounds)
    return lambda p, r: next(replies)


async def test_debate_threads_are_append_only_and_cached() -> None:
    async with ScriptedEngine(block_size=16, script=_disagreeing_debate(2)) as engine:
        events: list[CollaborationEvent] = []
        outcome = await collaborate(
            engine,
            "debate",
            CONTEXT,
            [AgentSpec("debater", count=3)],
            rounds=2,
            max_tokens=32,
            layout="threads",
            on_event=events.append,
        )
        assert outcome.rounds == 2 and outcome.details["layout"] == "threads"
        assert [e.data["round"] for e in events if e.type == "round"] == [1, 2]
        round1 = [r for r in engine.history if ServicePolicy.critical_offset(r.priority) == -1]
        round2 = [r for r in engine.history if ServicePolicy.critical_offset(r.priority) == -2]
        assert len(round1) == len(round2) == 3
        for req in round2:  # each round-2 prompt extends exactly one agent's round-1 handle
            assert sum(prev.prompt.is_prefix_of(req.prompt) for prev in round1) >= 1
        assert engine.live_requests() == frozenset()


async def test_debate_transcript_is_one_shared_prefix_per_round() -> None:
    """From 3 agents on (auto), every reader's prompt is context → all answers so far →
    its own turn: the transcript is shared by the round's readers and round r's is a
    prefix of round r+1's, so each answer is prefilled once for all of them."""
    async with ScriptedEngine(block_size=16, script=_disagreeing_debate(3)) as engine:
        outcome = await collaborate(
            engine, "debate", CONTEXT, [AgentSpec("debater", count=3)], rounds=3, max_tokens=32
        )
        assert outcome.rounds == 3 and outcome.details["layout"] == "transcript"
        by_round = {
            r: [q for q in engine.history if ServicePolicy.critical_offset(q.priority) == -r]
            for r in (1, 2, 3)
        }
        assert all(len(reqs) == 3 for reqs in by_round.values())

        def shared(reqs: list[EngineRequest]) -> tuple[int, ...]:
            ids = [q.prompt.token_ids for q in reqs]
            n = 0
            while all(len(x) > n for x in ids) and len({x[n] for x in ids}) == 1:
                n += 1
            return ids[0][:n]

        for r in (2, 3):
            prefix = shared(by_round[r])
            text = engine.detokenize(prefix)
            # everything but the own turn is common: every earlier answer is in it
            for earlier in range(1, r):
                for n in (1, 2, 3):
                    assert f"Round {earlier}, agent debater-{n}: Answer:" in text
            names = set()
            for q in by_round[r]:  # each reader's own turn names it, after the transcript
                full = engine.detokenize(q.prompt.token_ids)
                assert full.startswith(text)
                (own,) = [n for n in (1, 2, 3) if f"those of agent debater-{n}." in full]
                # after every answer: the own turn is last
                assert full.index(f"those of agent debater-{own}.") > text.rindex("Answer:")
                names.add(own)
            assert names == {1, 2, 3}
        # round 2's transcript (its shared prefix up to the own turn) is a prefix of round 3's
        r2, r3 = (engine.detokenize(shared(by_round[r])) for r in (2, 3))
        transcript2 = r2[: r2.rindex("\nThese are the answers")]
        assert r3.startswith(transcript2) and len(r3) > len(transcript2) + 100
        ids2 = shared(by_round[2])
        cut = next(k for k in range(len(ids2)) if engine.detokenize(ids2[:k]) == transcript2)
        assert shared(by_round[3])[:cut] == ids2[:cut]  # the same token ids, not only text
        assert engine.live_requests() == frozenset()


async def test_debate_transcript_computes_fewer_prompt_tokens_than_threads() -> None:
    """Five debaters with long answers: threads prefill 5·4 answers a round, the
    transcript 5 (once, for all readers)."""
    computed = {}
    for layout in ("threads", "transcript"):
        words = " ".join(f"w{i}" for i in range(40))
        replies = iter([f"{words} Answer: {n}" for n in range(5)] * 2)
        script = lambda p, r, replies=replies: next(replies)  # noqa: E731
        async with ScriptedEngine(block_size=16, script=script) as engine:
            outcome = await collaborate(
                engine,
                "debate",
                CONTEXT,
                [AgentSpec("debater", count=5)],
                rounds=2,
                max_tokens=128,
                layout=layout,
            )
            assert outcome.rounds == 2 and outcome.details["layout"] == layout
            computed[layout] = outcome.usage.computed_prompt_tokens
    assert computed["transcript"] < 0.6 * computed["threads"], computed


async def test_debate_of_two_keeps_threads_and_rejects_an_unknown_layout() -> None:
    async with ScriptedEngine(script=_disagreeing_debate(2)) as engine:
        outcome = await collaborate(
            engine, "debate", CONTEXT, [AgentSpec("debater", count=2)], rounds=2
        )
        assert outcome.details["layout"] == "threads"
        with pytest.raises(InvalidCollaboration) as info:
            await collaborate(engine, "debate", CONTEXT, None, layout="flat")
        assert info.value.field == "collaboration.layout"


async def test_debate_stops_when_all_agree() -> None:
    async with ScriptedEngine(script=lambda p, r: "Answer: 4") as engine:
        outcome = await collaborate(
            engine, "debate", "What is 2+2?", [AgentSpec("d", count=3)], rounds=3
        )
        assert outcome.rounds == 1 and outcome.early_stopped
        assert "4" in outcome.answer


async def test_reflect_with_validator_repairs_output() -> None:
    replies = iter(['{"name": 1}', "the name must be a string", '{"name": "ok"}'])

    async with ScriptedEngine(script=lambda p, r: next(replies)) as engine:
        outcome = await collaborate(
            engine,
            "reflect",
            "Give JSON with a string name.",
            None,
            validator={
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
            rounds=3,
        )
        assert outcome.answer == '{"name": "ok"}'
        assert outcome.details["valid"] is True
        assert outcome.rounds == 2


async def test_aggregate_splices_proposals() -> None:
    async with ScriptedEngine() as engine:
        outcome = await collaborate(
            engine,
            "aggregate",
            CONTEXT,
            [
                AgentSpec("p", count=3, instructions="Propose."),
                AgentSpec("aggregator", role="aggregator"),
            ],
        )
        roles = [a.role for a in outcome.agents]
        assert roles.count("proposer") == 3 and roles.count("aggregator") == 1
        final = engine.history[-1]
        first_proposal = engine.history[0]
        assert first_proposal.prompt.is_prefix_of(final.prompt)
        assert ServicePolicy.critical_offset(final.priority) == -1


async def test_cascade_escalates_only_on_disagreement() -> None:
    async with (
        ScriptedEngine(model="small", script=lambda p, r: "Answer: 7") as small,
        ScriptedEngine(model="large", script=lambda p, r: "ACCEPT") as large,
    ):
        agents = [
            AgentSpec("drafter", count=2),
            AgentSpec("verifier", model="large", role="verifier"),
        ]
        outcome = await collaborate(
            small, "cascade", "What is 3+4?", agents, engines={"large": large}
        )
        assert outcome.details["escalated"] is False
        assert large.history == []
    answers = iter(["Answer: 7", "Answer: 8"])
    async with (
        ScriptedEngine(model="small", script=lambda p, r: next(answers)) as small,
        ScriptedEngine(model="large", script=lambda p, r: "ACCEPT") as large,
    ):
        outcome = await collaborate(
            small, "cascade", "What is 3+4?", agents, engines={"large": large}
        )
        assert outcome.details["escalated"] is True
        assert outcome.details["verdict"] == "accepted"
        assert len(large.history) == 1


async def test_cascade_never_keeps_drafts_that_name_no_choice() -> None:
    """Two drafts that agree on naming no choice are not an answer: the verifier is asked
    for one of the choices, held to them by the same constraint as a voter's answer step."""
    agents = [AgentSpec("drafter", count=2), AgentSpec("verifier", model="large", role="verifier")]
    async with (
        ScriptedEngine(model="small", script=lambda p, r: "I am not sure.") as small,
        ScriptedEngine(model="large", script=lambda p, r: "yes") as large,
    ):
        outcome = await collaborate(
            small,
            "cascade",
            "Is 17 prime?",
            agents,
            engines={"large": large},
            answer={"choices": ["yes", "no"]},
        )
        assert outcome.details["escalated"] is True and outcome.details["verdict"] == "answered"
        assert outcome.answer == "yes"
        (asked,) = large.history
        assert asked.sampling.choices == ("yes", "no")
        assert "None of the drafts names one of: yes, no" in large.detokenize(
            asked.prompt.token_ids
        )


async def test_cascade_verifier_of_agreeing_drafts_is_not_constrained() -> None:
    """When the drafts named a choice the verifier replies freely (ACCEPT or a rewrite)."""
    agents = [AgentSpec("drafter", count=2), AgentSpec("verifier", model="large", role="verifier")]
    drafts = iter(["yes", "no"])
    async with (
        ScriptedEngine(model="small", script=lambda p, r: next(drafts)) as small,
        ScriptedEngine(model="large", script=lambda p, r: "ACCEPT") as large,
    ):
        outcome = await collaborate(
            small,
            "cascade",
            "Is 17 prime?",
            agents,
            engines={"large": large},
            answer={"choices": ["yes", "no"]},
        )
        assert outcome.details["verdict"] == "accepted"
        (asked,) = large.history
        assert asked.sampling.choices is None


@pytest.mark.parametrize(
    ("mode", "agents", "options", "field"),
    [
        ("nope", None, {}, "collaboration.mode"),
        ("vote", [{"name": "v", "count": 0}], {}, "agents[0].count"),
        ("vote", [{"name": "v", "bogus": 1}], {}, "agents[0].bogus"),
        ("vote", None, {"rounds": 99}, "collaboration.rounds"),
        ("vote", None, {"rounds": 2}, "collaboration.rounds"),
        ("debate", None, {"rounds": 0}, "collaboration.rounds"),
        ("vote", None, {"answer": {"choices": []}}, "collaboration.answer.choices"),
        ("vote", None, {"style": "weird"}, "collaboration.style"),
        ("vote", None, {"whatever": 1}, "collaboration.whatever"),
        ("debate", [{"name": "solo"}], {}, "agents"),
        ("reflect", None, {"validator": {"type": "nope"}}, "collaboration.validator.type"),
    ],
)
async def test_invalid_collaborations_name_the_field(
    mode: str, agents: object, options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration(mode, agents, options)  # type: ignore[arg-type]
    assert info.value.field == field, str(info.value)


async def test_unknown_adapter_and_model_are_invalid() -> None:
    async with ScriptedEngine() as engine:
        with pytest.raises(InvalidCollaboration, match="adapter"):
            await collaborate(engine, "vote", CONTEXT, [{"name": "v", "adapter": "missing"}])
        with pytest.raises(InvalidCollaboration, match="model"):
            await collaborate(engine, "vote", CONTEXT, [{"name": "v", "model": "missing"}])


class BestOfN(CollaborationOp[ModeConfig]):
    """A custom mode written against the public API: N candidates, a judge picks one."""

    name = "best_of_n"
    default_agents = (AgentSpec("candidate", count=3), AgentSpec("judge"))

    async def run(self, ctx: CollaborationContext[ModeConfig]) -> ModeResult:
        *candidate_specs, judge_spec = ctx.agents
        candidates = await ctx.spawn_all(candidate_specs, role="candidate")
        judge = await ctx.spawn("judge", judge_spec, role="judge")
        outputs = {}
        async with anyio.create_task_group() as tg:
            for c in candidates:

                async def one(c=c) -> None:  # type: ignore[no-untyped-def]
                    outputs[c.agent] = await ctx.turn(
                        c, Turn(ctx.prompt(c.spec), ctx.sampling(c.spec))
                    )

                tg.start_soon(one)
        parts: list[object] = []
        for name in sorted(outputs):
            parts += [f"Candidate {name}: ", outputs[name].result.output]
        pick = await ctx.turn(
            judge,
            Turn(
                ctx.prompt(judge_spec, parts=parts, instructions="Pick the best."),
                ctx.sampling(judge_spec),
                priority=-1,
            ),
        )
        return ModeResult(answer=pick.content, details={"candidates": sorted(outputs)})


async def test_custom_mode_registered_by_name() -> None:
    register_mode(BestOfN)
    try:
        assert "best_of_n" in collaboration_modes()
        async with ScriptedEngine() as engine:
            outcome = await collaborate(engine, "best_of_n", CONTEXT)
            assert outcome.mode == "best_of_n"
            assert [a.role for a in outcome.agents] == ["candidate"] * 3 + ["judge"]
            assert outcome.answer
            assert outcome.details == {"candidates": ["candidate-1", "candidate-2", "candidate-3"]}
    finally:
        unregister_mode("best_of_n")


async def test_a_registry_of_your_own_leaves_the_default_alone() -> None:
    registry = ModeRegistry([BestOfN])
    assert registry.names() == ["best_of_n"] and "best_of_n" not in collaboration_modes()
    async with ScriptedEngine() as engine:
        outcome = await collaborate(engine, "best_of_n", CONTEXT, registry=registry)
        assert outcome.mode == "best_of_n"
        with pytest.raises(InvalidCollaboration, match="unknown mode 'vote'"):
            await collaborate(engine, "vote", CONTEXT, registry=registry)


async def test_role_failure_is_a_clear_error_never_a_hang() -> None:
    class Boom(CollaborationOp[ModeConfig]):
        name = "boom"

        async def run(self, ctx: CollaborationContext[ModeConfig]) -> ModeResult:
            (role,) = await ctx.spawn_all([AgentSpec("a")])
            await ctx.turn(role, Turn(ctx.prompt(role.spec), ctx.sampling(role.spec)))
            return ModeResult(answer="unreachable")

    async with ScriptedEngine() as engine:
        engine.fail_next("boom")
        with anyio.fail_after(5), pytest.raises(CollaborationFailed) as info:
            await collaborate(engine, Boom, CONTEXT)
        assert info.value.records and info.value.records[0].finish_reason == "error"
        assert engine.live_requests() == frozenset()


async def test_cancelling_a_collaboration_leaves_no_live_requests() -> None:
    async with ScriptedEngine(decode_time_per_token=0.05, reply_words=(200, 200)) as engine:
        started = anyio.Event()

        def on_event(e: CollaborationEvent) -> None:
            if e.type == "delta":
                started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: collaborate(
                    engine,
                    "debate",
                    CONTEXT,
                    [AgentSpec("d", count=3)],
                    max_tokens=256,
                    on_event=on_event,
                )
            )
            await started.wait()
            assert engine.live_requests()
            tg.cancel_scope.cancel()
        assert engine.live_requests() == frozenset()
        assert await engine.wait_idle(1.0)


def _names(agents: Sequence[AgentSpec]) -> list[str]:
    return [n for a in agents for n in a.agent_names()]


async def test_agent_names_expand_counts() -> None:
    assert _names([AgentSpec("v", count=2), AgentSpec("j")]) == ["v-1", "v-2", "j"]


# --- debiased and adaptive votes ----------------------------------------------------------


def first_listed(request: EngineRequest) -> str:
    """A maximally position-biased voter: it answers whatever it was offered first."""
    return request.sampling.choices[0] if request.sampling.choices else ""


async def test_debias_order_gives_each_voter_its_own_order_and_maps_votes_back() -> None:
    choices = ["yes", "no", "maybe"]

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return first_listed(request) if request.sampling.choices else None

    async with ScriptedEngine(script=script) as engine:
        plain = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=6)],
            answer={"choices": choices},
            style="direct",
            early_stop=False,
        )
        assert plain.votes == {"yes": 6}  # the bias, amplified by the vote
        engine.history.clear()
        events: list[CollaborationEvent] = []
        debiased = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=6)],
            answer={"choices": choices},
            style="direct",
            early_stop=False,
            debias=True,
            on_event=events.append,
        )
    # every choice was shown first to two of six voters, so the bias cancels out
    assert debiased.votes == {"yes": 2, "no": 2, "maybe": 2}
    assert debiased.details["debias"] == "order"
    offered = sorted(r.sampling.choices or () for r in engine.history)
    assert len(set(offered)) == 6 and all(sorted(o) == sorted(choices) for o in offered)
    for request in engine.history:  # the instructions list the choices as offered
        assert f"one of: {', '.join(request.sampling.choices or ())}." in request.prompt.text
    votes = [e for e in events if e.type == "vote"]
    assert all(e.data["answer"] == e.data["shown"][0] for e in votes)


async def test_debias_labels_counterbalances_yes_no_and_maps_letters_back() -> None:
    """A voter that reads the lettered options and names the letter of "no" (the truth)."""
    option = re.compile(r"([A-Z])\) (yes|no)")

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        if not request.sampling.choices:
            return None
        assert request.sampling.choices == ("A", "B")
        letters = {word: letter for letter, word in option.findall(request.prompt.text)}
        return letters["no"]

    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=4)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            early_stop=False,
            debias="labels",
        )
        shown = sorted(option.findall(r.prompt.text)[0][1] for r in engine.history)
    assert outcome.answer == "no" and outcome.votes == {"no": 4}
    assert shown == ["no", "no", "yes", "yes"]  # half the voters see "A) yes", half "A) no"
    assert all(a.answer == "no" for a in outcome.agents)


async def test_debias_in_reason_style_lists_the_voters_order_in_the_cue() -> None:
    async with ScriptedEngine(script=lambda p, r: first_listed(r) or None) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=2, instructions="Be careful.")],
            answer={"choices": ["yes", "no"]},
            style="reason",
            early_stop=False,
            debias="order",
            max_tokens=32,
        )
        cues = [r.prompt.text for r in engine.history if r.sampling.choices]
        reasons = [r.prompt.text for r in engine.history if not r.sampling.choices]
    assert outcome.votes == {"yes": 1, "no": 1}
    assert any(c.endswith("one of: yes, no.<|im_end|>\n<|im_start|>assistant\n") for c in cues)
    assert any(c.endswith("one of: no, yes.<|im_end|>\n<|im_start|>assistant\n") for c in cues)
    assert all("Be careful.\nThink step by step" in r for r in reasons)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"debias": True}, "collaboration.debias"),  # no fixed choices to reorder
        ({"debias": "shuffle", "answer": {"choices": ["a", "b"]}}, "collaboration.debias"),
        ({"adaptive": "sometimes"}, "collaboration.adaptive"),
        ({"adaptive": "beta", "confidence": 0.5}, "collaboration.confidence"),
        ({"adaptive": "beta", "confidence": True}, "collaboration.confidence"),
        ({"adaptive": "window", "wave": 1}, "collaboration.wave"),
    ],
)
async def test_bad_debias_and_adaptive_options_name_their_field(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("vote", None, options)
    assert info.value.field == field


async def test_adaptive_window_stops_after_a_unanimous_wave() -> None:
    voter = re.compile(r"voter number (\d+)")
    answers = ["yes", "no", "yes", "no", "no", "no", "yes", "yes", "yes"]

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return answers[int(voter.findall(request.prompt.text)[-1])]

    specs = [AgentSpec(f"v{i}", instructions=f"You are voter number {i}.") for i in range(9)]
    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            specs,
            answer={"choices": ["yes", "no"]},
            style="direct",
            adaptive="window",
            wave=3,
        )
        assert engine.live_requests() == frozenset()
    # waves: (yes no yes) (no no no) -> stop: "no" leads 4 to 2, with 3 voters never started
    assert outcome.answer == "no" and outcome.votes == {"no": 4, "yes": 2}
    assert outcome.early_stopped and outcome.details["stopped_by"] == "window"
    assert outcome.details["samples"] == 6
    assert [a.finish_reason for a in outcome.agents].count("pruned") == 3
    assert len(engine.history) == 6


async def test_adaptive_beta_stops_once_the_leader_is_probably_the_majority() -> None:
    # 9 voters, all "yes": the exact rule needs 5 votes; Beta(5, 1) gives
    # P(p > 1/2) = 0.969 >= 0.95 after 4 votes (waves of 2: two waves)
    async with ScriptedEngine(script=lambda p, r: "yes" if r.sampling.choices else None) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=9)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            adaptive="beta",
            wave=2,
        )
    assert outcome.answer == "yes"
    assert outcome.details["samples"] == 4 and outcome.details["stopped_by"] == "beta"
    async with ScriptedEngine(script=lambda p, r: "yes" if r.sampling.choices else None) as engine:
        exact = await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=9)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            wave=2,
        )
    # the exact rule decides on the 5th vote (a 6th of the same wave may land too)
    assert exact.details["samples"] in (5, 6) and exact.details["stopped_by"] == "exact"
