"""The pure parts of bench/collab.py: tasks, answers, ideal prefill, statistics, writers.

No engine: the benchmark itself is run by hand (see BENCHMARKS.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import _collab_floor as F
import _collab_prompts as P
import _collab_report as R
import _collab_tasks as T
import pytest


def test_task_set_is_fixed_large_and_verifiable() -> None:
    tasks = T.task_set()
    assert len(tasks) >= 200
    assert tasks == T.task_set()  # fixed seed
    assert tasks != T.task_set(seed=99)
    assert {t.kind for t in tasks} == {"arithmetic", "comparison", "fact"}
    for t in tasks:
        assert t.answer in t.choices
        assert len(set(t.choices)) == len(t.choices)
        assert T.is_correct(f"Answer: {t.answer}", t)
        if t.kind == "arithmetic":
            expr = t.question.removeprefix("What is ").removesuffix("?")
            a, op, b = expr.split()
            assert int(t.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        if t.kind == "comparison":
            nums = [int(c) for c in t.choices]
            assert int(t.answer) == (max(nums) if "larger" in t.question else min(nums))


def test_contexts_are_about_2000_tokens_and_differ_from_the_first_line() -> None:
    a, b = T.context_document(1), T.context_document(2)
    assert a.splitlines()[0] != b.splitlines()[0]
    assert 1150 <= len(a.split()) <= 1350  # ~1.7 tokens per word on this tokenizer: ~2 000 tokens
    task = T.task_set()[0]
    assert T.workload_context(1, task).endswith(task.prompt())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paris", "Paris"),
        ("The answer is paris.", "Paris"),
        ("I think Rome... Answer: Paris", "Paris"),
        ("Rome or Paris", "Rome"),
        ("no idea", ""),
        ("12<|im_end|>", "12"),
    ],
)
def test_extract_choice(text: str, expected: str) -> None:
    assert T.extract_choice(text, ["Paris", "Rome", "12"]) == expected


def test_majority_uses_the_choice_order_to_break_ties() -> None:
    assert T.majority(["b", "a", "b"], ["a", "b"]) == "b"
    assert T.majority(["b", "a"], ["a", "b"]) == "a"
    assert T.majority(["", "", "b"], ["a", "b"]) == "b"
    assert T.majority(["", ""], ["a", "b"]) == ""


def test_ideal_prefill_counts_the_context_once_and_suffixes_in_blocks() -> None:
    ctx = list(range(300))
    forks = [(ctx + [1000 + i] * 10, [7] * 20) for i in range(3)]
    # first: all 310; the others share 300 tokens = 2 whole blocks (256) -> 54 each
    assert T.ideal_prefill(forks) == 310 + 54 + 54
    # a follow-up that extends fork 0's prompt + output recomputes from its last whole block
    follow = (forks[0][0] + forks[0][1] + [9] * 5, [1])
    assert T.ideal_prefill([*forks, follow]) == 418 + (335 - 256)
    # the last prompt token is always recomputed, even when everything is shared
    assert T.ideal_prefill([(list(range(256)), []), (list(range(256)), [])]) == 256 + 128
    assert T.ceil_blocks(1) == 128 and T.ceil_blocks(256) == 256


def test_time_split_partitions_the_wall_time() -> None:
    split = T.time_split([(1.0, 2.0, 4.0), (1.5, None, 3.0)], 0.0, 5.0)
    assert split == pytest.approx({"prefill": 1.0, "decode": 2.0, "orchestration": 2.0})
    assert sum(split.values()) == pytest.approx(5.0)


def test_prompts_match_microagent() -> None:
    from microagent.collab.modes import _aggregate as _ops_aggregate
    from microagent.collab.modes import _debate as _ops_debate
    from microagent.collab.modes import _reflect as _ops_reflect
    from microagent.collab.modes import _vote as _ops_vote

    assert P.ANSWER_CUE == _ops_vote.ANSWER_CUE
    assert P.DEBATE_PROMPT == _ops_debate.DEBATE_PROMPT
    assert P.FIRST_PROMPT == _ops_debate.FIRST_PROMPT
    assert P.AGGREGATE_PROMPT == _ops_aggregate.AGGREGATE_PROMPT
    assert P.CRITIC_PROMPT == _ops_reflect.CRITIC_PROMPT
    assert P.REVISE_PROMPT == _ops_reflect.REVISE_PROMPT
    assert P.TRANSCRIPT_PROMPT == _ops_debate.TRANSCRIPT_PROMPT
    assert P.TRANSCRIPT_FROM_AGENTS == _ops_debate.TRANSCRIPT_FROM_AGENTS


@pytest.mark.anyio
async def test_client_transcript_turn_is_microagent_s_text() -> None:
    """The client's transcript-layout debate turn is the text microagent's debate composes."""
    from microagent.collab import AgentSpec, ServicePolicy, collaborate
    from microagent.engine_bridge import EngineRequest
    from microagent.testing import ScriptedEngine

    round1 = {"debater-1": "Answer: 4", "debater-2": "It is 5. Answer: 5", "debater-3": "Answer: 6"}

    def script(prompt: object, request: EngineRequest) -> str:  # by agent: its retention key
        assert request.retain is not None
        return round1[request.retain.key.rsplit("/", 1)[1]]

    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(
            engine, "debate", "What is 2+2?", [AgentSpec("debater", count=3)], rounds=2
        )
        assert outcome.details["layout"] == P.debate_layout(3) == "transcript"
        for request in engine.history:
            if ServicePolicy.critical_offset(request.priority) != -2:
                continue
            text = engine.detokenize(request.prompt.token_ids)
            turn = text[text.rindex("<|im_start|>user\n") + len("<|im_start|>user\n") :]
            turn = turn[: turn.index("<|im_end|>")]
            agent = turn[turn.index("those of agent ") + len("those of agent ") :].split(".")[0]
            assert turn == P.transcript_turn([round1], agent)


def _run(
    system: str, rep: int, wall: float, prompt: int, cached: int, answer: str
) -> dict[str, object]:
    run: dict[str, object] = {
        "system": system,
        "workload": "vote5-direct",
        "rep": rep,
        "wall": wall,
        "answer": answer,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": 10,
        "requests": 5,
        "sum_prefill_s": 1.0,
        "sum_decode_s": 2.0,
        "split": {"prefill": 0.5, "decode": 1.0, "orchestration": 0.1},
    }
    if system.startswith("microagent"):
        run.update(
            ideal=500, context_tokens=480, usage={"saved_completion_tokens": 2}, early_stopped=True
        )
    run["floor_inputs"] = {"floor": 480}
    return run


def test_summary_tables_json_and_plots(tmp_path: Path) -> None:
    runs = [
        _run(s, rep, wall, prompt, cached, ans)
        for rep in range(3)
        for s, wall, prompt, cached, ans in (
            ("microagent", 1.0 + rep, 2500, 2000, "a"),
            ("microagent-full", 1.5 + rep, 2500, 2000, "a"),
            ("client", 2.0 + rep, 2500, 1900, "a" if rep else "b"),
            ("client-nocache", 4.0 + rep, 2500, 0, "a"),
        )
    ]
    acc = [
        {
            "method": "single sample",
            "correct": 3,
            "n": 10,
            "accuracy": 0.3,
            "ci": [0.1, 0.6],
            "completion_tokens": 40.0,
        }
    ]
    data = {"runs": runs, "accuracy": acc, "items": 10, "machine": {"nproc": 2}}
    summary = R.summarize(data)
    cell = summary["cells"]["vote5-direct"]["microagent"]
    assert cell["wall"] == 2.0 and cell["computed"] == 500 and cell["own_ids_optimum_ratio"] == 1.0
    assert cell["floor"] == 480 and cell["floor_ratio"] == pytest.approx(500 / 480)
    assert summary["cells"]["vote5-direct"]["client-nocache"]["floor_ratio"] == pytest.approx(
        2500 / 480
    )
    assert summary["cells"]["vote5-direct"]["client"]["agreement"] == [2, 3]
    assert summary["cells"]["vote5-direct"]["microagent"]["wall_ratio_per_rep"] == pytest.approx(
        2 / 3
    )
    met = {t["target"]: t["met"] for t in summary["targets"]}
    floor_target = "computed prompt tokens <= 1.05 x the workload floor (vote5-direct)"
    assert met[floor_target] is True  # 500 / 480 = 1.04
    (row,) = [t for t in summary["targets"] if t["target"] == floor_target]
    assert set(row["beside"]) == {"microagent", "microagent-full", "client", "client-nocache"}
    assert met[">= 3x fewer computed prompt tokens than client without caching (vote-5)"] is True
    md = R.tables(data, summary)
    assert "| vote5-direct | microagent | 3 | 2.00 (1.00–3.00) | 0.67 |" in md
    assert "| 500 | 480 (1.04×) | 10 |" in md
    assert "| vote5-direct | 480 | 1.04× | 1.04× | 1.25× | 5.21× |" in md  # side by side
    assert (
        "| computed prompt tokens <= 1.05 x the workload floor (vote5-direct) | microagent 1.04×"
        in md
    )
    assert "#### Targets" in R.tables(data, summary, level=4)
    assert "| single sample | 3/10 | 0.300 | 0.100–0.600 | 40 |" in md
    assert json.loads(json.dumps(summary)) == summary
    paths = R.plots(data, summary, tmp_path, "t")
    assert [p.name for p in paths] == ["t_wall.png", "t_prefill.png", "t_accuracy.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size < 200_000 for p in paths)


# -- the workload floor -------------------------------------------------------------------


def test_workload_floor_by_hand() -> None:
    # context 300 -> 3 blocks = 384; two messages of 50 -> 128 each; instruction 20 -> 128;
    # 4 requests -> +4 (vLLM recomputes each prompt's last token)
    assert F.workload_floor(300, [50, 50], [20], 4) == 384 + 2 * 128 + 128 + 4 == 772


def test_workload_floor_rounds_each_item_up_and_adds_one_per_request() -> None:
    # a whole block stays one block, one token past it is a second block, every item is
    # rounded on its own (not the sum), empty items cost nothing, +1 per request
    floor = F.workload_floor(256, [129, 1, 0], [128], 3)
    assert floor == 256 + 256 + 128 + 128 + 3
    assert floor != T.ceil_blocks(256 + 129 + 1 + 128) + 3  # rounding the sum instead
    assert floor != 256 + 129 + 1 + 128 + 3  # no rounding
    assert floor != 256 + 256 + 128 + 128  # no last-token recompute
    assert F.workload_floor(256, [], [], 0) == 256
    assert F.workload_floor(257, [], [], 1) == 385
    assert F.workload_floor(100, [10], [10], 2, block=16) == 112 + 16 + 16 + 2


@pytest.mark.parametrize(
    ("workload", "requests", "started", "expected"),
    [
        ({"kind": "vote", "style": "direct", "n": 5}, 5, None, (["vote"], 0)),
        ({"kind": "vote", "style": "reason", "n": 9}, 18, None, (["vote", "answer_cue"], 9)),
        # early stop: 9 reasoning requests, 5 answer steps read their voter's reasoning
        ({"kind": "vote", "style": "reason", "n": 9}, 14, None, (["vote", "answer_cue"], 5)),
        # waves of 3: 6 voters started, 5 answered
        ({"kind": "vote", "style": "reason", "n": 9}, 11, 6, (["vote", "answer_cue"], 5)),
        ({"kind": "vote", "style": "reason", "n": 5}, 5, None, (["vote"], 0)),
        # round 1's three answers are read in round 2; round 2's by nobody
        (
            {"kind": "debate", "agents": 3, "rounds": 2},
            6,
            None,
            (["debate_first", "debate_next"], 3),
        ),
        (
            {"kind": "debate", "agents": 3, "rounds": 3},
            9,
            None,
            (["debate_first", "debate_next"], 6),
        ),
        # the shared transcript: each debater's own turn is an instruction of its own
        (
            {"kind": "debate", "agents": 3, "rounds": 2, "layout": "auto"},
            6,
            None,
            (["debate_first", *(f"debate_own:debater-{i}" for i in (1, 2, 3))], 3),
        ),
        (
            {"kind": "debate", "agents": 2, "rounds": 2, "layout": "auto"},
            4,
            None,
            (["debate_first", "debate_next"], 2),
        ),
        ({"kind": "aggregate", "proposers": 3}, 4, None, (["aggregate"], 3)),
        # draft, critique, revised draft, critique: every turn but the last is read
        ({"kind": "reflect"}, 4, None, (["reflect_draft", "reflect_critic", "reflect_revise"], 3)),
        ({"kind": "reflect"}, 1, None, (["reflect_draft"], 0)),
    ],
)
def test_floor_plan_per_workload(
    workload: dict[str, object], requests: int, started: int | None, expected: tuple[object, int]
) -> None:
    assert F.plan(workload, requests, started) == expected


def test_voters_started_in_waves() -> None:
    assert F.voters_started(["1"] * 9, 18, 9, 0) == 9
    assert F.voters_started(["", "1", "", "1", "1", "1", "", "1", ""], 14, 9, 0) == 9
    assert F.voters_started(["1", "1", "1", "", "1", "1", "", "", ""], 11, 9, 3) == 6
    assert F.voters_started(["1"] * 6 + [""] * 3, 12, 9, 3) == 6
    assert F.voters_started(["7"] * 9, 18, 9, 3) == 9
    with pytest.raises(ValueError, match="no wave count"):
        F.voters_started(["1"] * 9, 10, 9, 3)


def _words(messages: list[dict[str, object]], generation: bool) -> list[str]:
    """A toy chat template: <s> role words </s> per message, <s> assistant for a reply."""
    out: list[str] = []
    for m in messages:
        out += ["<s>", str(m["role"]), *str(m["content"]).split(), "</s>"]
    return out + (["<s>", "assistant"] if generation else [])


def test_floor_inputs_from_the_workload_texts() -> None:
    counter = F.TurnCounter(_words)
    ctx = [P.user("word " * 298)]  # 298 words + 3 markers = 301 tokens -> 3 blocks
    wl = {"kind": "debate", "agents": 3, "rounds": 2, "max_tokens": 48}
    got = F.floor_inputs(counter, wl, ctx, ["a", "b"], requests=6)
    first = 3 + len(P.FIRST_PROMPT.split()) + 2  # <s> user words </s> <s> assistant
    assert got["context"] == 301
    assert got["instructions"] == {
        "debate_first": first,
        "debate_next": 3 + len(P.DEBATE_PROMPT.split()) + 2,
    }
    assert got["messages_read"] == 3 and got["message_bound"] == 48 + 3
    assert got["floor"] == 384 + 2 * 128 + 3 * 128 + 6
    with pytest.raises(ValueError, match="more than one block"):
        F.floor_inputs(counter, {**wl, "max_tokens": 200}, ctx, ["a"], requests=6)


def test_backfill_rebuilds_contexts_and_checks_them(tmp_path: Path) -> None:
    import collab

    counter = F.TurnCounter(_words)
    tasks = T.task_set()
    wl = {"kind": "vote", "style": "reason", "n": 3, "max_tokens": 48, "answer_tokens": 8}
    ctx = P.context(T.workload_context(10_000 * 1 + 0, tasks[0]))
    micro_ctx = counter.context(ctx) - 7  # microagent's composition left something out
    runs = [
        {
            "workload": "v",
            "rep": 0,
            "task": 0,
            "system": "microagent",
            "requests": 5,
            "answers": ["a", "", "a"],
            "context_tokens": micro_ctx,
        },
        {"workload": "v", "rep": 0, "task": 0, "system": "client", "requests": 6, "answers": []},
    ]
    data = {"plan": {"v": []}, "workloads": {"v": wl}, "runs": runs}
    assert collab.backfill_floor(data, counter) == 2
    micro, client = (r["floor_inputs"] for r in runs)
    assert micro["context"] == client["context"] == counter.context(ctx)
    assert micro["messages_read"] == 2 and client["messages_read"] == 3
    assert client["floor"] - micro["floor"] == 128 + 1  # one more message read, one more request
    assert collab.backfill_floor(data, counter) == 0  # nothing left to add
    # a recorded context that no rebuilt text explains (longer than the rebuilt one)
    stale = {k: v for k, v in runs[0].items() if k != "floor_inputs"}
    bad = {**data, "runs": [{**stale, "context_tokens": micro_ctx + 100}]}
    with pytest.raises(ValueError, match="could not rebuild"):
        collab.backfill_floor(bad, counter)
    # a new run counts its voters from microagent's agent records
    agents = [{"role": "voter", "requests": 2}, {"role": "voter", "requests": 0}]
    assert collab._started({"agents": [*agents, {"role": "judge", "requests": 1}]}) == 1
    assert collab._started({}) is None
