"""Every built-in mode end to end on the real engine (default model, ≥ 1 000-token context).

Hand-offs — prompts that extend an earlier generation's handle — must be served
from the prefix cache: the bridge knows each such handle is resident, so its
expected cached tokens are every full block of it (≥ its length − 128), and
``cache_miss`` would be set if the engine served fewer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
from _engine import RealEngine
from microagent.collab import AgentSpec, CollaborationEvent, Outcome, collaborate
from microagent.engine_bridge import VLLMBridge

pytestmark = pytest.mark.engine

SOURCE = (Path(__file__).parent.parent / "demos" / "data" / "inventory.py").read_text()
CONTEXT = [
    {"role": "system", "content": "You are a careful Python reviewer. Be brief."},
    {
        "role": "user",
        "content": f"```python\n{SOURCE}\n```\n"
        "Does reserve() reject a reservation of exactly the available units?",
    },
]
HANDOFF_LABELS = {"answer", "critique", "revise", "aggregate", "round 2", "verify"}


def run(
    real_engine: RealEngine, mode: str, agents: list[AgentSpec] | None = None, **options: Any
) -> tuple[Outcome, list[CollaborationEvent]]:
    events: list[CollaborationEvent] = []

    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge, mode, CONTEXT, agents, on_event=events.append, **options
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    return outcome, events


def check_handoffs(events: list[CollaborationEvent], expected_labels: set[str]) -> None:
    finished = [
        e
        for e in events
        if e.type == "agent_finished" and e.data.get("finish_reason") in ("stop", "length")
    ]
    handoffs = [e for e in finished if e.data.get("label") in HANDOFF_LABELS]
    assert {e.data["label"] for e in handoffs} >= expected_labels, [
        e.data.get("label") for e in finished
    ]
    for e in handoffs:
        data = e.data
        assert data["expected_cached_tokens"] >= 128, data  # it extends a resident handle
        assert data["cached_tokens"] >= data["expected_cached_tokens"], data
        assert not data["cache_miss"], data
    # the shared context (> 2 000 tokens) was computed once, not once per role
    firsts = [e for e in finished if e.data.get("label") not in HANDOFF_LABELS]
    assert sum(e.data["cached_tokens"] for e in firsts) >= (len(firsts) - 1) * 2048


def test_vote_reason_then_answer(real_engine: RealEngine) -> None:
    outcome, events = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=3)],
        answer={"choices": ["yes", "no"]},
        style="reason",
        max_tokens=48,
        early_stop=False,
    )
    assert outcome.answer in ("yes", "no")
    assert outcome.votes is not None and sum(outcome.votes.values()) <= 3
    check_handoffs(events, {"answer"})


def test_vote_early_stop_aborts_running_voters(real_engine: RealEngine) -> None:
    # three quick greedy voters agree while two long reasoners are still decoding
    agents = [AgentSpec("fast", count=3, max_tokens=8), AgentSpec("slow", count=2, max_tokens=400)]
    aborted_before = real_engine.bridge.stats().requests_aborted
    outcome, events = run(
        real_engine,
        "vote",
        agents,
        answer={"choices": ["yes", "no"]},
        style="reason",
        temperature=0.0,
    )
    assert outcome.early_stopped
    slow = [a for a in outcome.agents if a.name.startswith("slow")]
    assert all(a.finish_reason == "pruned" for a in slow), [
        (a.name, a.finish_reason) for a in outcome.agents
    ]
    assert all(a.completion_tokens < 400 for a in slow)  # stopped mid-generation
    assert real_engine.bridge.stats().requests_aborted >= aborted_before + 2
    assert [e.agent for e in events if e.type == "pruned"]
    assert real_engine.bridge.live_requests() == frozenset()
    # vLLM's own scheduler (its stats, from the engine process) runs none of them any more,
    # well before the 400 tokens the pruned ones would have taken
    assert real_engine.call(real_engine.bridge.wait_idle, 2.0)
    stats = real_engine.bridge.stats()
    assert stats.scheduler_running == 0 and stats.scheduler_waiting == 0


def test_vote_waves_never_start_unneeded_voters(real_engine: RealEngine) -> None:
    outcome, _ = run(
        real_engine,
        "vote",
        [AgentSpec("voter", count=5)],
        answer={"choices": ["yes", "no"]},
        style="direct",
        max_tokens=4,
        temperature=0.0,
        wave=3,
    )
    assert outcome.early_stopped  # greedy voters agree: decided after the first wave
    unstarted = [a for a in outcome.agents if a.finish_reason == "pruned" and a.requests == 0]
    assert len(unstarted) == 2  # pruned before their prefill: never reached the engine


def test_debate_two_rounds(real_engine: RealEngine) -> None:
    outcome, events = run(
        real_engine,
        "debate",
        [AgentSpec("debater", count=3)],
        rounds=2,
        max_tokens=32,
        early_stop=False,
    )
    assert outcome.rounds == 2
    check_handoffs(events, {"round 2"})


def test_reflect_with_validator(real_engine: RealEngine) -> None:
    outcome, events = run(
        real_engine,
        "reflect",
        None,
        rounds=2,
        max_tokens=40,
        validator={"type": "json_schema", "schema": {"type": "object", "required": ["bug"]}},
    )
    assert outcome.answer
    assert "valid" in outcome.details
    check_handoffs(events, {"critique"})


def test_aggregate(real_engine: RealEngine) -> None:
    agents = [
        AgentSpec("proposer", count=2, instructions="Propose a fix."),
        AgentSpec("aggregator", role="aggregator"),
    ]
    outcome, events = run(real_engine, "aggregate", agents, max_tokens=40)
    assert outcome.answer
    check_handoffs(events, {"aggregate"})


def test_lora_role_runs_under_its_adapter(real_engine: RealEngine) -> None:
    # a shorter context: LoRA prefill is several times slower than the base model's on CPU
    context = [
        {"role": "user", "content": SOURCE[:2400] + "\nSummarise this code in one sentence."}
    ]
    agents = [
        AgentSpec("plain"),
        AgentSpec("tuned", adapter="lora-a"),
        AgentSpec("aggregator", role="aggregator"),
    ]

    async def go() -> Outcome:
        return await collaborate(real_engine.bridge, "aggregate", context, agents, max_tokens=16)

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    tuned = next(a for a in outcome.agents if a.name == "tuned")
    plain = next(a for a in outcome.agents if a.name == "plain")
    assert tuned.adapter == "lora-a" and tuned.completion_tokens > 0
    assert plain.prompt_tokens == tuned.prompt_tokens > 512
    # LoRA blocks never share KV with the base model: the adapter's fork computed the context itself
    assert tuned.cached_tokens == 0 or tuned.cached_tokens < plain.prompt_tokens - 256


def test_cascade_across_two_engines(real_engine: RealEngine) -> None:
    """Two engines in one process (the same weights under two names)."""

    async def go() -> tuple[Outcome, bool]:
        async with VLLMBridge(
            "default", served_name="large", max_num_seqs=4, progress=False
        ) as large:
            agents = [
                AgentSpec("drafter", count=2, temperature=1.0),
                AgentSpec("verifier", model="large", role="verifier"),
            ]
            outcome = await collaborate(
                real_engine.bridge,
                "cascade",
                CONTEXT,
                agents,
                engines={"large": large},
                verify="always",
                max_tokens=24,
            )
            idle = await large.wait_idle(5)
            return outcome, idle

    outcome, idle = real_engine.call(go)
    assert idle
    assert outcome.details["escalated"] is True
    assert outcome.details["retokenized"] is False  # same tokenizer: token ids crossed as they are
    verifier = next(a for a in outcome.agents if a.role == "verifier")
    assert verifier.model == "large" and verifier.completion_tokens > 0
    real_engine.assert_idle()


def test_graph_planner_coders_reviewer_loop(real_engine: RealEngine) -> None:
    """planner -> 2 coders -> reviewer -> (reject: back to the coders, at most 2 times) -> final."""
    from test_graph import review_graph

    events: list[CollaborationEvent] = []

    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge,
            "graph",
            "Write a Python function is_even(n).",
            graph=review_graph(2),
            max_tokens=24,
            on_event=events.append,
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    nodes = outcome.details["nodes"]
    assert nodes["planner"]["iterations"] == 1
    assert 1 <= nodes["coder"]["iterations"] <= 3  # the first run + at most 2 loops
    assert nodes["coder"]["iterations"] == nodes["reviewer"]["iterations"]
    assert nodes["final"]["iterations"] == 1
    assert outcome.answer
    names = {e.data.get("node") for e in events if e.type == "node_finished"}
    assert {"planner", "coder", "reviewer", "final"} <= names
    # the coders' hand-off from the planner is served from cache
    coder_turns = [
        e for e in events if e.type == "agent_finished" and str(e.agent).startswith("coder")
    ]
    assert coder_turns and all(not e.data["cache_miss"] for e in coder_turns)


def test_agents_call_a_python_tool_in_the_loop(real_engine: RealEngine) -> None:
    """Each debater's first step is a constrained call; the result joins its thread, cached.

    The argument is an enum: free integers let the 135M model write digits until
    its budget runs out (seen), a bounded schema is how tools should be declared.
    """
    calls: list[str] = []

    def population(city: Literal["Paris", "Lyon", "Nice"]) -> str:
        """The population of a French city."""
        calls.append(city)
        return {"Paris": "2.1 million", "Lyon": "0.5 million", "Nice": "0.3 million"}[city]

    events: list[CollaborationEvent] = []

    async def go() -> Outcome:
        return await collaborate(
            real_engine.bridge,
            "debate",
            [{"role": "user", "content": "How many people live in Lyon?"}],
            [AgentSpec("analyst", count=2)],
            rounds=1,
            max_tokens=40,
            tools=[population],
            tool_choice="required",
            max_tool_steps=1,
            on_event=events.append,
        )

    outcome = real_engine.call(go)
    real_engine.assert_idle()
    assert len(calls) == 2 and set(calls) <= {"Paris", "Lyon", "Nice"}
    assert sum(r.tool_calls for r in outcome.agents) == 2
    results = [e for e in events if e.type == "tool_result"]
    assert len(results) == 2 and all(
        e.data["ok"] and "million" in e.data["output"] for e in results
    )
    answers = [
        e
        for e in events
        if e.type == "agent_finished" and e.data.get("finish_reason") in ("stop", "length")
    ]
    # the step after the call extends the retained call step: only the result is computed
    followups = answers[2:]
    assert followups
    for e in followups:
        assert e.data["cached_tokens"] >= e.data["expected_cached_tokens"] > 0, e.data
