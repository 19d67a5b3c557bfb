"""Property tests of the graph mode on the ScriptedEngine, in trio's virtual time.

Over random valid DAGs: every node runs at most its bound; every request's
prompt is exactly the documented layout of its predecessors' outputs (token
ids); only nodes the reference semantics allows ever run; pruned branches leave
no live engine request; and, run sequentially (``max_concurrency=1``), the
prompt tokens the engine computed equal what an independent model of the
block-cache rules predicts.
"""

from __future__ import annotations

import re
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from microagent.actors import Runtime
from microagent.collab import CollaborationFailed, collaborate
from microagent.collab.modes._graph import PREVIOUS_LABEL, SEPARATOR, input_label
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from strategies import graph_dags

NODE = re.compile(r"node N(\d+)\.")
CONTEXT = "Solve the task step by step. " * 6
_ = PREVIOUS_LABEL


def run_virtual(fn, *args):  # type: ignore[no-untyped-def]
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def node_of(request: EngineRequest) -> int:
    return int(NODE.findall(request.prompt.text)[-1])


def reply(i: int, yes: bool) -> str:
    return f"out {i} {'yes' if yes else 'no'} result"


def make_engine(says_yes: list[bool], **kw: Any) -> tuple[ScriptedEngine, dict[str, str]]:
    replies: dict[str, str] = {}

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        i = node_of(request)
        text = reply(i, says_yes[i])
        replies[request.request_id] = text
        return text

    return ScriptedEngine(script=script, **kw), replies


def reference_runs(case: dict[str, Any]) -> set[str]:
    """Which nodes may run, by the documented semantics (independent of the scheduler)."""
    says_yes = case["says_yes"]
    joins = {n["name"]: n["join"] for n in case["nodes"]}
    ran: set[str] = {"n0"}
    for i in range(1, len(case["nodes"])):
        name = f"n{i}"
        active = []
        for e in case["edges"]:
            if e["to"] != name:
                continue
            src = e["from"]
            cond = e.get("when")
            yes = says_yes[int(src[1:])]
            holds = cond is None or ("contains" in cond) == yes
            active.append(src in ran and holds)
        if all(active) if joins[name] else any(active):
            ran.add(name)
    return ran


def expected_prompt(
    engine: ScriptedEngine,
    case: dict[str, Any],
    name: str,
    outputs: dict[str, list[tuple[str, tuple[int, ...]]]],
) -> tuple[int, ...]:
    """The documented layout, rebuilt from the chat template and the predecessors' outputs."""
    says_yes = case["says_yes"]
    ids: list[int] = []
    parts = 0
    for e in case["edges"]:
        if e["to"] != name or e["from"] not in outputs:
            continue
        cond = e.get("when")
        if cond is not None and ("contains" in cond) != says_yes[int(e["from"][1:])]:
            continue
        for agent, out in outputs[e["from"]]:
            ids += (
                engine.tokenize(input_label(agent))
                + [t for t in out if t != engine.eot_token_id]
                + engine.tokenize(SEPARATOR)
            )
            parts += 1
    instructions = next(n["instructions"] for n in case["nodes"] if n["name"] == name)
    chat = engine.chat
    context = chat.context([{"role": "user", "content": CONTEXT}])
    if parts:
        handle = context.extend(chat.turn("user", ids + engine.tokenize(instructions)))
    else:
        handle = chat.append(context, "user", instructions)
    return chat.generation_prompt(handle).token_ids


def graph_options(case: dict[str, Any]) -> dict[str, Any]:
    return {k: case[k] for k in ("nodes", "edges", "entry", "output")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_dags(), st.sampled_from([0, 1]))
def test_random_dags_run_their_inputs_and_leave_nothing_running(
    case: dict[str, Any], sequential: int
) -> None:
    ref = reference_runs(case)
    output = case["output"]

    async def main() -> None:
        engine, replies = make_engine(
            case["says_yes"], decode_time_per_token=0.01, prefill_time_per_token=0.001
        )
        async with engine, Runtime(engine=engine) as rt:
            try:
                outcome = await collaborate(
                    engine,
                    "graph",
                    CONTEXT,
                    runtime=rt,
                    max_concurrency=sequential,
                    temperature=0.0,
                    **graph_options(case),
                )
            except CollaborationFailed:
                outcome = None
            assert engine.live_requests() == frozenset()
            assert await engine.wait_idle(5)
            assert rt.actors() == []
        assert (outcome is not None) == (output in ref)
        # which requests belong to which node, and what each finished instance produced
        by_node: dict[str, list[EngineRequest]] = {}
        for req in engine.history:
            if req.sampling.max_tokens == 1:
                continue  # a fan-out warm-up
            by_node.setdefault(f"n{node_of(req)}", []).append(req)
        counts = {n["name"]: n["count"] for n in case["nodes"]}
        for name, reqs in by_node.items():
            assert name in ref, (name, ref)
            assert len(reqs) <= counts[name]  # a DAG node runs at most once (bound 1)
        if outcome is None:
            return
        records = {a.name: a for a in outcome.agents}
        outputs: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for name in sorted(by_node, key=lambda n: int(n[1:])):
            agents = (
                [name] if counts[name] == 1 else [f"{name}-{k}" for k in range(1, counts[name] + 1)]
            )
            if not all(records[a].finish_reason == "stop" for a in agents):
                continue
            out = (*engine.tokenize(replies[by_node[name][0].request_id]), engine.eot_token_id)
            outputs[name] = [(a, out) for a in agents]
        for name, reqs in by_node.items():
            expected = expected_prompt(engine, case, name, outputs)
            for req in reqs:
                assert req.prompt.token_ids == expected, name
        graph = outcome.details["nodes"]
        for name, info in graph.items():
            assert info["iterations"] <= 1
            if info["state"] == "done":
                assert name in ref
        last = int(output[1:])
        assert outcome.answer == SEPARATOR.join(
            [reply(last, case["says_yes"][last])] * counts[output]
        )
        if sequential:
            # every node whose inputs are met starts (its instances then queue for the one
            # slot), so a node generating when its only consumer is pruned is pruned too: its
            # request is the one that may be aborted, and then the cache model's count differs
            aborted = engine.stats().requests_aborted
            started_then_pruned = sum(
                graph[name]["state"] == "pruned" for name, reqs in by_node.items() for _ in reqs
            )
            assert aborted <= started_then_pruned
            if aborted:
                return
            computed = engine.stats().prompt_tokens - engine.stats().cached_tokens
            assert computed == predict_computed(engine, replies)

    run_virtual(main)


def predict_computed(engine: ScriptedEngine, replies: dict[str, str]) -> int:
    """Independent block-cache model for requests run one after another, nothing evicted.

    A block is keyed by the whole token prefix up to its end (the chained hash);
    a prompt hits its leading cached full blocks, at most ``(n - 1) // bs`` (the
    last prompt token is always recomputed); a finished request caches the full
    blocks of ``prompt + output[:-1]``.
    """
    bs = engine.block_size
    cache: set[tuple[int, ...]] = set()
    computed = 0
    for req in engine.history:
        prompt = req.prompt.token_ids
        n = len(prompt)
        hits = 0
        while hits < (n - 1) // bs and prompt[: (hits + 1) * bs] in cache:
            hits += 1
        computed += n - hits * bs
        out = (*engine.tokenize(replies[req.request_id]), engine.eot_token_id)[
            : req.sampling.max_tokens
        ]
        seq = prompt + out[:-1]
        for k in range(len(seq) // bs):
            cache.add(seq[: (k + 1) * bs])
    return computed
