"""bench/early_stop.py without the real engine: the offline decisions, the recorder, the report.

The recorder runs on the ScriptedEngine; the decisions are checked on
synthetic records whose stopping point is known by hand.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _early_stop_report as R
import early_stop as S
import pytest
from _collab_tasks import Task
from microagent.collab._tally import StopRule, adaptive_vote, majority
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine

YES_NO = ("yes", "no")


def recorded(
    arrival_answers: Sequence[str],
    tokens: Sequence[int] | None = None,
    choices: Sequence[str] = YES_NO,
    full_answer: str | None = None,
) -> dict[str, Any]:
    """A recorded all-at-once vote whose votes arrive in the order given.

    Voter ``i`` arrives ``i``-th; it generated ``tokens[i]`` tokens (increasing,
    so arrival order is finishing order). All voters start together and decode one
    token per step, so at voter ``i``'s vote voter ``j`` had ``min(tokens[j], tokens[i])``.
    """
    n = len(arrival_answers)
    tokens = list(tokens or [10 * (i + 1) for i in range(n)])
    assert tokens == sorted(tokens)
    arrivals = [
        {
            "voter": i,
            "answer": a,
            "t": float(tokens[i]),
            "tokens": [min(t, tokens[i]) for t in tokens],
        }
        for i, a in enumerate(arrival_answers)
    ]
    return {
        "id": 0,
        "kind": "fact",
        "gold": "yes",
        "choices": list(choices),
        "answer": majority(arrival_answers, choices) if full_answer is None else full_answer,
        "answers": list(arrival_answers),
        "tokens": tokens,
        "arrivals": arrivals,
        "log_matches": True,
        "wall_s": float(tokens[-1]),
    }


def test_five_agreeing_votes_of_nine_decide_at_the_fifth() -> None:
    item = recorded(["yes"] * 9)
    tokens = item["tokens"]
    d = R.decide(item, R.RULE_BY_KEY["exact-all"])
    assert (d.answer, d.votes, d.started, d.stopped_by) == ("yes", 5, 9, "exact")
    # the four later voters had generated as much as the fifth when it voted
    assert d.tokens == sum(tokens[:5]) + 4 * tokens[4]
    assert d.at == tokens[4]
    one = R.decide(item, R.RULE_BY_KEY["exact-w1"])  # one at a time: voters 6-9 never start
    assert (one.votes, one.started, one.tokens) == (5, 5, sum(tokens[:5]))
    three = R.decide(item, R.RULE_BY_KEY["exact-w3"])  # waves of 3: decided inside the second
    assert (three.votes, three.started) == (5, 6)
    assert three.tokens == sum(tokens[:5]) + tokens[4]


def test_a_late_majority_is_waited_for_and_the_answer_equals_the_full_vote() -> None:
    # yes leads 3-0, but "no" wins 5-4: the exact rule may stop only after the 8th vote
    item = recorded(["yes", "yes", "yes", "no", "no", "no", "no", "no", "yes"])
    assert item["answer"] == "no"
    d = R.decide(item, R.RULE_BY_KEY["exact-all"])
    assert (d.answer, d.votes) == ("no", 8)
    for rule in R.RULES:
        if rule.exact:
            assert R.decide(item, rule).answer == "no", rule
    # the window rule stops on the first wave's three "yes": a different answer
    window = R.decide(item, R.RULE_BY_KEY["window-w3"])
    assert (window.answer, window.votes, window.stopped_by) == ("yes", 3, "window")
    rows = {r["key"]: r for r in R.summarize({"items": [item]})["rules"]}
    assert rows["exact-all"]["agree"] == 1 and rows["window-w3"]["agree"] == 0


def test_agreement_is_checked_against_the_recorded_answer() -> None:
    # a record whose full answer disagrees with its own votes (a broken recorder) is reported
    item = recorded(["yes"] * 9, full_answer="no")
    summary = R.summarize({"items": [item]})
    assert all(r["agree"] == 0 for r in summary["rules"])
    assert not summary["target"]["met"]


def test_tie_rule_and_abstentions_follow_the_library() -> None:
    # 4-4 with one abstention: the first listed choice ("no" here) wins the tie
    item = recorded(["yes", "no", "yes", "no", "yes", "no", "yes", "no", ""], choices=("no", "yes"))
    assert item["answer"] == "no"
    for rule in R.RULES:
        assert R.decide(item, rule).answer == "no"


def _random_item(rng: random.Random) -> dict[str, Any]:
    choices = ("a", "b", "c")[: rng.choice((2, 3))]
    weights = [rng.random() for _ in choices]
    answers = [rng.choices([*choices, ""], [*weights, 0.05])[0] for _ in range(9)]
    tokens = sorted(rng.randint(5, 48) for _ in range(9))
    item = recorded(answers, tokens, choices)
    # voters in index order are not the arrival order: permute the voter indices
    perm = list(range(9))
    rng.shuffle(perm)
    item["answers"] = [""] * 9
    item["tokens"] = [0] * 9
    for a in item["arrivals"]:
        old = a["voter"]
        a["voter"] = perm[old]
        item["answers"][perm[old]] = a["answer"]
        item["tokens"][perm[old]] = tokens[old]
        a["tokens"] = [a["tokens"][perm.index(j)] for j in range(9)]
    return item


def test_replay_agrees_with_the_librarys_adaptive_vote() -> None:
    rng = random.Random(7)
    for _ in range(400):
        item = _random_item(rng)
        choices = item["choices"]
        for rule in R.RULES:
            d = R.decide(item, rule)
            if rule.exact:
                assert d.answer == item["answer"]
            wave = rule.wave or 9
            answer, cast = adaptive_vote(
                item["answers"], wave, StopRule(rule.adaptive, rule.confidence), choices
            )
            assert d.answer == answer, (rule, item)
            assert d.votes <= cast  # the replay may stop inside a wave, as the mode does
            assert d.started == min(9, -(-cast // wave) * wave) or d.stopped_by == "exact"
            assert 0 < d.tokens <= sum(item["tokens"])


def _data(items: list[dict[str, Any]], live: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "settings": {
            **S.VOTE,
            "model": "SmolLM2-135M-Instruct",
            "vllm": "0.0",
            "context_words": 1200,
            "items": len(items),
        },
        "machine": {"cpus": 2, "loadavg_at_start": 0.1, "seconds": 5},
        "items": items,
        "live_rules": ["exact-all"],
        "live": live,
    }


def test_tables_report_every_rule_the_target_and_the_live_runs(tmp_path: Path) -> None:
    a = recorded(["yes"] * 9)
    b = recorded(["no"] * 6 + ["yes"] * 3)
    b["id"] = 1
    live = [
        {"id": 0, "rule": "exact-all", "answer": "yes", "completion_tokens": 300,
         "samples": 5, "early_stopped": True, "wall_s": 1.0},
        {"id": 1, "rule": "exact-all", "answer": "yes", "completion_tokens": 400,
         "samples": 7, "early_stopped": True, "wall_s": 1.0},
    ]  # fmt: skip
    data = _data([a, b], live)
    text = R.tables(data)
    for rule in R.RULES:
        assert f"| {rule.label} | 2 |" in text
    assert "| exact, all 9 at once | 2 | 2/2 (100 %) |" in text
    summary = R.summarize(data)
    w1 = next(r for r in summary["rules"] if r["key"] == "exact-w1")
    assert w1["tokens_stopped"] == sum(a["tokens"][:5]) + sum(b["tokens"][:5])
    assert summary["target"]["best_rule"] == "exact, one at a time"
    assert f"| {R.TARGET} | best exact rule (exact, one at a time)" in text
    (live_row,) = summary["live"]
    assert live_row["tokens_live"] == 700 and live_row["agree"] == 1
    assert "new samples" in text
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n")
    R.update_benchmarks(doc, "first\n", "x.json")
    R.update_benchmarks(doc, text, "x.json")
    out = doc.read_text()
    assert out.count(R.BEGIN) == 1 and "first" not in out and text in out


def test_the_target_is_met_only_with_enough_saved_and_identical_answers() -> None:
    # tokens that rise steeply: stopping at the 5th of 9 saves most of them
    steep = recorded(["yes"] * 9, [1, 1, 1, 1, 1, 100, 100, 100, 100])
    met = R.summarize({"items": [steep]})["target"]
    assert met["met"] and met["saved_pct"] >= 40
    flat = recorded(["yes", "no"] * 4 + ["yes"])  # decided at the last vote: nothing saved
    assert not R.summarize({"items": [flat]})["target"]["met"]


# -- the recorder on the ScriptedEngine ------------------------------------------------


class LoggedScripted(S.TokenLog, ScriptedEngine):
    pass


TASK = Task(0, "fact", "Is the sky blue on a clear day?", YES_NO, "yes")


def _answers(seq: Sequence[str]) -> Any:
    it = iter(seq)

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return next(it) if request.sampling.choices else None

    return script


def _decided_by_hand(yes: int, no: int, remaining: int) -> bool:
    """The exact rule for yes/no ("yes" listed first: it wins a tie), written out."""
    if yes >= no:
        return yes > 0 and no + remaining <= yes
    return yes + remaining < no


@pytest.mark.anyio
async def test_a_recorded_vote_logs_every_token_and_every_vote_in_order() -> None:
    answers = ["yes", "no", "yes", "yes", "no", "yes", "yes", "no", "yes"]
    async with LoggedScripted(
        script=_answers(answers), decode_time_per_token=0.001, reply_words=(5, 40)
    ) as engine:
        rec = await S.record_vote(engine, TASK, "Question: " + TASK.prompt())
    assert rec["log_matches"]
    arrivals = rec["arrivals"]
    assert sorted(a["voter"] for a in arrivals) == list(range(9))
    assert sorted(a["answer"] for a in arrivals) == sorted(answers)
    assert all(rec["answers"][a["voter"]] == a["answer"] for a in arrivals)
    assert arrivals[-1]["tokens"] == rec["tokens"]
    for prev, nxt in itertools.pairwise(arrivals):
        assert all(p <= q for p, q in zip(prev["tokens"], nxt["tokens"], strict=True))
        assert prev["tokens"][prev["voter"]] == rec["tokens"][prev["voter"]]  # done when it voted
    assert rec["answer"] == "yes"
    yes = no = 0
    for k, a in enumerate(arrivals, 1):
        yes, no = yes + (a["answer"] == "yes"), no + (a["answer"] == "no")
        if k == 9 or _decided_by_hand(yes, no, 9 - k):
            break
    d = R.decide(rec, R.RULE_BY_KEY["exact-all"])
    assert (d.answer, d.votes) == ("yes", k)
    assert d.tokens == sum(arrivals[k - 1]["tokens"])


@pytest.mark.anyio
async def test_an_early_decision_leaves_tokens_unspent() -> None:
    async with LoggedScripted(
        script=_answers(["yes"] * 9), decode_time_per_token=0.001, reply_words=(5, 40)
    ) as engine:
        rec = await S.record_vote(engine, TASK, "Question: " + TASK.prompt())
    d = R.decide(rec, R.RULE_BY_KEY["exact-all"])
    assert (d.answer, d.votes) == ("yes", 5)
    assert d.tokens == sum(rec["arrivals"][4]["tokens"]) < sum(rec["tokens"])


@pytest.mark.anyio
async def test_a_live_rule_runs_the_vote_mode_with_its_options() -> None:
    async with LoggedScripted(script=_answers(["yes"] * 9), reply_words=(5, 10)) as engine:
        run = await S.live_vote(
            engine, TASK, "Question: " + TASK.prompt(), R.RULE_BY_KEY["exact-w1"]
        )
        assert engine.log == []
    assert run["answer"] == "yes" and run["early_stopped"] and run["samples"] == 5
    assert run["stopped_by"] == "exact" and run["completion_tokens"] > 0
