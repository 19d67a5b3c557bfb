"""Confidence in ``microagent eval``: greedy's requests ask for their answer's logprob, in
process and over HTTP; a gated candidate's coverage and greedy's cut-off reach the report;
an old journal without logprobs still reads."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import attrs
import pytest
from microagent.collab.modes import NO_CONFIDENT_ANSWER
from microagent.evaluation import (
    BUILTIN,
    GREEDY_CANDIDATE,
    BridgeRunner,
    EvalReport,
    EvalRequest,
    HTTPRunner,
    Reply,
    candidate_from_dict,
    evaluate,
    parse_items,
    request_for,
)
from microagent.testing import ScriptedEngine
from test_server_helpers import live_server, scripted

CLOSED, FREE = parse_items(
    '{"question": "Is 7 prime?", "answers": ["yes"], "choices": ["yes", "no"]}\n'
    '{"question": "What is 2 + 2?", "answers": ["4"]}'
)
GATED = candidate_from_dict(
    {
        "agents": [{"name": "voter", "count": 3}],
        "collaboration": {"mode": "vote", "style": "direct", "gate": 1.0, "below": "abstain"},
    },
    "gated.json",
    "gated",
)


def test_only_greedys_requests_ask_for_their_answers_logprob() -> None:
    assert request_for(GREEDY_CANDIDATE, CLOSED, 8).logprob
    assert request_for(GREEDY_CANDIDATE, FREE, 8).logprob
    assert not request_for(BUILTIN["vote3"], CLOSED, 8).logprob
    # the request a client sends stays as it was (bench/quality.py sends extra_body)
    assert "logprob" not in request_for(GREEDY_CANDIDATE, FREE, 8).extra_body()["collaboration"]


@pytest.mark.anyio
async def test_in_process_greedy_replies_carry_a_logprob() -> None:
    async with ScriptedEngine() as engine:
        runner = BridgeRunner(engine)
        closed = await runner.run(request_for(GREEDY_CANDIDATE, CLOSED, 8))
        free = await runner.run(request_for(GREEDY_CANDIDATE, FREE, 8))
        vote = await runner.run(request_for(BUILTIN["vote3"], CLOSED, 8))
    assert closed.logprob is not None and closed.logprob < 0
    assert free.logprob is not None and free.logprob < 0
    assert vote.logprob is None


def test_over_http_greedy_replies_carry_a_logprob_and_abstentions_are_read() -> None:
    with live_server(scripted()) as srv:
        runner = HTTPRunner(srv.url, model="scripted", api_key="none")

        async def go() -> tuple[Reply, Reply, Reply]:
            try:
                return (
                    await runner.run(request_for(GREEDY_CANDIDATE, CLOSED, 8)),
                    await runner.run(request_for(GREEDY_CANDIDATE, FREE, 8)),
                    await runner.run(request_for(GATED, FREE, 8)),
                )
            finally:
                await runner.aclose()

        closed, free, gated = anyio.run(go)
    assert closed.logprob is not None and closed.logprob < 0
    assert free.logprob is not None and free.logprob < 0
    # the scripted engine's free answers are seeded random words: three voters disagree
    assert gated.abstained and gated.answer == NO_CONFIDENT_ANSWER and not gated.answered


@attrs.define
class Scored:
    """Greedy right on even items with logprob -i; the gated candidate abstains on items
    divisible by 3 and is right elsewhere."""

    calls: int = 0
    label: str = "fake"

    async def run(self, request: EvalRequest) -> Reply:
        self.calls += 1
        n = int(request.question.split()[2])
        right = str(n + 1)
        if request.logprob:  # greedy
            return Reply(right if n % 2 == 0 else "0", logprob=-float(n))
        if n % 3 == 0:
            return Reply(NO_CONFIDENT_ANSWER, abstained=True)
        return Reply(right)


def _items(n: int) -> str:
    return "\n".join(
        json.dumps({"question": f"What is {i} + 1?", "answers": [str(i + 1)]}) for i in range(n)
    )


def _evaluate(runner: Scored, journal: Path) -> EvalReport:
    async def go() -> EvalReport:
        return await evaluate(
            parse_items(_items(30)), [GATED], runner, seed=3, journal=journal, progress=None
        )

    return anyio.run(go)


def test_the_report_gives_coverage_and_greedys_cutoff_and_old_journals_read(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.jsonl"
    got = _evaluate(Scored(), journal)
    numbers = [int(q) - 1 for q in got.report_items]  # item line i holds question i - 1
    report = {r["name"]: r for r in got.to_dict()["report"]}  # type: ignore[union-attr]
    gated = report["gated"]
    answered = [i for i in numbers if i % 3]
    assert gated["coverage"] == pytest.approx(len(answered) / len(numbers))
    assert gated["accuracy_when_answered"] == 1.0
    # greedy's most confident items are its lowest numbers (logprob -i)
    top = sorted(numbers)[: round(len(answered) / len(numbers) * len(numbers))]
    assert gated["greedy_at_coverage"] == pytest.approx(sum(i % 2 == 0 for i in top) / len(top))
    assert report["greedy"]["coverage"] == 1.0 and report["greedy"]["greedy_at_coverage"] is None
    assert any(row["logprob"] is not None for row in got.rows)
    # a journal written before logprobs were recorded: its lines read, with None
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    for line in lines[1:]:  # after the header
        del line["reply"]["logprob"]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    replay = Scored()
    old = _evaluate(replay, journal)
    assert replay.calls == 0  # every reply came from the journal
    assert all(row["logprob"] is None for row in old.rows)
    again = {r.name: r for r in old.reports}["gated"]
    assert again.coverage == pytest.approx(gated["coverage"])
    assert again.greedy_at_coverage is None
