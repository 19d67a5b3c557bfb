"""LangGraph peer: the same collaborations as graphs of the real ``langgraph`` package.

Runs in ``bench/.venv-peers`` (langgraph + openai; they conflict with vLLM's
pins) as ``python bench/_collab_peer.py '<json job>'`` and prints one JSON
object per run. Each role is a graph node that makes one OpenAI-SDK call to
the same ``vllm serve`` endpoint; parallel roles are parallel branches of one
superstep (LangGraph waits for every branch, so votes cannot stop early).
"""

from __future__ import annotations

import asyncio
import json
import operator
import sys
import time
from typing import Annotated, Any, TypedDict

import _collab_client as C
import _collab_prompts as P
from _collab_tasks import extract_choice, majority


class State(TypedDict, total=False):
    outputs: Annotated[list[tuple[str, str]], operator.add]
    round2: Annotated[list[tuple[str, str]], operator.add]
    thread: list[P.Message]
    draft: str
    error: str | None
    round: int
    answer: str


def build(workload: dict[str, Any], ctx: str, choices: list[str], caller: C.Caller) -> Any:
    """A compiled StateGraph for one workload."""
    from langgraph.graph import END, START, StateGraph

    kind, cfg = workload["kind"], workload
    g: Any = StateGraph(State)
    temp, mt = cfg["temperature"], cfg["max_tokens"]

    if kind == "vote":
        style, instr = cfg["style"], P.vote_instructions(choices, cfg["style"])
        base = [*P.context(ctx), P.user(instr)]

        def voter(name: str) -> Any:
            async def node(state: State) -> State:
                if style == "direct":
                    out = await caller.call(
                        base, max_tokens=cfg["answer_tokens"], temperature=temp, choices=choices
                    )
                else:
                    reasoning = await caller.call(base, max_tokens=mt, temperature=temp)
                    msgs = [*base, P.assistant(reasoning), P.user(P.answer_cue(choices))]
                    out = await caller.call(
                        msgs, max_tokens=cfg["answer_tokens"], temperature=temp, choices=choices
                    )
                return {"outputs": [(name, out)]}

            return node

        def tally(state: State) -> State:
            answers = [extract_choice(o, choices) for _, o in state["outputs"]]
            return {"answer": majority(answers, choices)}

        for i in range(1, cfg["n"] + 1):
            g.add_node(f"voter-{i}", voter(f"voter-{i}"))
            g.add_edge(START, f"voter-{i}")
            g.add_edge(f"voter-{i}", "tally")
        g.add_node("tally", tally)
        g.add_edge("tally", END)
    elif kind == "debate":
        names = [f"debater-{i}" for i in range(1, cfg["agents"] + 1)]

        def first(name: str) -> Any:
            async def node(state: State) -> State:
                return {
                    "outputs": [
                        (
                            name,
                            await caller.call(
                                C.debate_round1(ctx), max_tokens=mt, temperature=temp
                            ),
                        )
                    ]
                }

            return node

        def second(name: str) -> Any:
            async def node(state: State) -> State:
                prev = dict(state["outputs"])
                if P.debate_layout(cfg["agents"], cfg.get("layout", "auto")) == "transcript":
                    messages = C.debate_transcript(ctx, [prev], name)
                else:
                    others = [(o, prev[o]) for o in sorted(prev) if o != name]
                    messages = C.debate_round2(ctx, prev[name], others)
                out = await caller.call(messages, max_tokens=mt, temperature=temp)
                return {"round2": [(name, out)]}

            return node

        def judge(state: State) -> State:
            latest = dict(state["round2"])
            return {
                "answer": majority([extract_choice(latest[n], choices) for n in names], choices)
            }

        g.add_node("judge", judge)
        for n in names:
            g.add_node(f"r1-{n}", first(n))
            g.add_node(f"r2-{n}", second(n))
            g.add_edge(START, f"r1-{n}")
            g.add_edge(f"r2-{n}", "judge")
        for n in names:  # round 2 starts when every round-1 branch is done
            g.add_edge([f"r1-{m}" for m in names], f"r2-{n}")
        g.add_edge("judge", END)
    elif kind == "aggregate":

        def proposer(i: int) -> Any:
            async def node(state: State) -> State:
                return {
                    "outputs": [
                        (
                            f"proposer-{i}",
                            await caller.call(P.context(ctx), max_tokens=mt, temperature=temp),
                        )
                    ]
                }

            return node

        async def aggregator(state: State) -> State:
            props = [t for _, t in sorted(state["outputs"])]
            final = await caller.call(
                C.aggregate_prompt(ctx, props), max_tokens=mt, temperature=0.0
            )
            return {"answer": P.clean(final)}

        g.add_node("aggregator", aggregator)
        for i in range(1, cfg["proposers"] + 1):
            g.add_node(f"proposer-{i}", proposer(i))
            g.add_edge(START, f"proposer-{i}")
            g.add_edge(f"proposer-{i}", "aggregator")
        g.add_edge("aggregator", END)
    elif kind == "reflect":
        validate = C.format_validator(choices)

        async def draft(state: State) -> State:
            thread = [*P.context(ctx), P.user(P.FIRST_PROMPT)]
            out = await caller.call(thread, max_tokens=mt, temperature=temp)
            return {"thread": thread, "draft": out, "round": 1, "error": validate(out)}

        async def critique(state: State) -> State:
            thread = [
                *state["thread"],
                P.assistant(state["draft"]),
                P.user(f"A validator rejected the answer: {state['error']}\n{P.CRITIC_PROMPT}"),
            ]
            out = await caller.call(thread, max_tokens=mt, temperature=0.0)
            return {"thread": [*thread, P.assistant(out)]}

        async def revise(state: State) -> State:
            thread = [*state["thread"], P.user(P.REVISE_PROMPT)]
            out = await caller.call(thread, max_tokens=mt, temperature=temp)
            return {
                "thread": thread,
                "draft": out,
                "round": state["round"] + 1,
                "error": validate(out),
            }

        def after_validation(state: State) -> str:
            return END if state["error"] is None else "critique"

        def after_critique(state: State) -> str:
            return END if state["round"] >= cfg["rounds"] else "revise"

        g.add_node("draft", draft)
        g.add_node("critique", critique)
        g.add_node("revise", revise)
        g.add_edge(START, "draft")
        g.add_conditional_edges("draft", after_validation)
        g.add_conditional_edges("revise", after_validation)
        g.add_conditional_edges("critique", after_critique)
    else:
        raise ValueError(kind)
    return g.compile()


async def main(job: dict[str, Any]) -> dict[str, Any]:
    import langgraph
    from openai import AsyncOpenAI

    P.SYSTEM = job.get("system")
    client = AsyncOpenAI(base_url=job["base_url"], api_key="none", max_retries=0, timeout=600)
    caller = C.Caller(client, job["model"])
    graph = build(job["workload"], job["context"], job["choices"], caller)
    t0 = time.monotonic()
    state = await graph.ainvoke({"outputs": [], "round2": []}, {"recursion_limit": 50})
    wall = time.monotonic() - t0
    await client.close()
    version = getattr(langgraph, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("langgraph")
    answer = state.get("answer") or P.clean(state.get("draft", ""))
    return {
        "wall": wall,
        "answer": answer,
        "requests": caller.requests,
        "t0": t0,
        "langgraph": version,
    }


async def load(job: dict[str, Any]) -> dict[str, Any]:
    """``bench/load.py``'s open-loop schedule as LangGraph graphs: every collaboration
    launched at its arrival time, every request recorded (token ids, cached tokens)."""
    from importlib.metadata import version

    from openai import AsyncOpenAI

    P.SYSTEM = job.get("system")
    # the SDK's default retries: a keep-alive connection the server closed is retried
    client = AsyncOpenAI(base_url=job["base_url"], api_key="none", max_retries=2, timeout=600)
    caller = C.RecordingCaller(client, job["model"])
    latencies: list[float] = []
    failures: list[str] = []
    t0 = time.monotonic()

    async def launch(at: float, workload: dict[str, Any], ctx: str) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        start = time.monotonic()
        try:
            graph = build(workload, ctx, job["choices"], caller)
            await graph.ainvoke({"outputs": [], "round2": []}, {"recursion_limit": 50})
            latencies.append(time.monotonic() - start)
        except Exception as exc:  # counted and reported, never hidden
            failures.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(launch(*item) for item in job["schedule"]))
    wall = time.monotonic() - t0
    await client.close()
    records = [
        [r.submitted, r.finished, list(r.prompt), list(r.output), r.cached] for r in caller.records
    ]
    return {
        "latencies": latencies,
        "failures": failures,
        "wall": wall,
        "records": records,
        "langgraph": version("langgraph"),
    }


if __name__ == "__main__":
    # the job as the argument, or on stdin ("-": a load schedule is too long for argv)
    job = json.loads(sys.stdin.read() if sys.argv[1] == "-" else sys.argv[1])
    run = load if job.get("mode") == "load" else main
    print(json.dumps(asyncio.run(run(job))))
