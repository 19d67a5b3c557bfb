"""``microagent.evaluation``: items, the split, the statistics, the choice, resume, outputs.

Everything but the last test runs without an engine: requests go to fake runners
injected through ``evaluate(runner=...)``, the documented seam. The last test runs
one candidate on a tiny file through the shared real engine, in process.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from microagent.evaluation import (
    BUILTIN,
    GREEDY_CANDIDATE,
    BadConfig,
    BadItem,
    BridgeRunner,
    EvalItem,
    EvalReport,
    EvalRequest,
    JournalError,
    MissingReply,
    PairedTable,
    Reply,
    Score,
    candidate_from_dict,
    choose,
    evaluate,
    is_correct,
    load_candidate,
    load_candidates,
    load_items,
    mcnemar_p,
    parse_items,
    request_for,
    split_items,
    wilson,
    write_outputs,
)


def _items(n: int, families: tuple[str, ...] = ("a", "b")) -> list[EvalItem]:
    lines = [
        json.dumps(
            {"question": f"What is {i} + 1?", "answers": [str(i + 1)], "family": families[i % 2]}
        )
        for i in range(n)
    ]
    return parse_items("\n".join(lines))


# -- items ---------------------------------------------------------------------------------


def test_items_parse_with_optional_fields_and_blank_lines() -> None:
    text = (
        '{"question": "Is 7 prime?", "answers": ["yes"], "choices": ["yes", "no"], '
        '"family": "prime"}\n\n{"question": "Capital of France?", "answers": ["Paris"]}\n'
    )
    first, second = parse_items(text)
    assert first == EvalItem(1, "Is 7 prime?", ("yes",), ("yes", "no"), "prime")
    assert second.line == 3 and second.choices == () and second.family == ""


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ("{not json", "", "not JSON"),
        ('["a list"]', "", "JSON object"),
        ('{"answers": ["1"]}', "question", "missing"),
        ('{"question": "q"}', "answers", "missing"),
        ('{"question": "", "answers": ["1"]}', "question", "empty"),
        ('{"question": 3, "answers": ["1"]}', "question", "string"),
        ('{"question": "q", "answers": "1"}', "answers", "list"),
        ('{"question": "q", "answers": []}', "answers", "at least one"),
        ('{"question": "q", "answers": [1]}', "answers[0]", "string"),
        ('{"question": "q", "answers": ["x"], "choices": ["x"]}', "choices", "two"),
        ('{"question": "q", "answers": ["z"], "choices": ["x", "y"]}', "answers", "choices"),
        ('{"question": "q", "answers": ["x"], "choices": ["x", "x"]}', "choices", "twice"),
        ('{"question": "q", "answers": ["x"], "family": 2}', "family", "string"),
        ('{"question": "q", "answers": ["x"], "answer": "x"}', "answer", "not an item field"),
        ('{"question": "q", "answers": ["x"], "part": "test"}', "part", "one of"),
        ('{"question": "q", "answers": ["x"], "part": ["report"]}', "part", "list"),
        ('{"question": "q", "answers": ["x"], "max_tokens": 0}', "max_tokens", "1 to 4096"),
        ('{"question": "q", "answers": ["x"], "max_tokens": 4097}', "max_tokens", "4097"),
        ('{"question": "q", "answers": ["x"], "max_tokens": true}', "max_tokens", "integer"),
        ('{"question": "q", "answers": ["x"], "max_tokens": "8"}', "max_tokens", "str"),
    ],
)
def test_a_bad_line_names_its_number_and_field(line: str, field: str, words: str) -> None:
    good = '{"question": "q", "answers": ["1"]}'
    with pytest.raises(BadItem) as info:
        parse_items(f"{good}\n{good}\n{line}\n{good}")
    assert info.value.line == 3
    assert info.value.field == field
    assert words in info.value.reason
    assert str(info.value).startswith("line 3")


def test_an_empty_or_oversized_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadItem, match="no items"):
        parse_items("\n  \n")
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:
        f.truncate(2**30)  # sparse: no time spent writing it
    with pytest.raises(BadItem, match="limit"):
        load_items(big)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"question": "q", "answers": ["1"]}\n\xff\xfe\n')
    with pytest.raises(BadItem) as info:
        load_items(binary)
    assert info.value.line == 2


# -- the split -----------------------------------------------------------------------------


def test_the_split_is_deterministic_disjoint_and_stratified() -> None:
    items = _items(40)
    split = split_items(items, seed=7, select_fraction=0.25)
    assert split == split_items(items, seed=7, select_fraction=0.25)
    sel = {i.key for i in split.selection}
    rep = {i.key for i in split.report}
    assert not sel & rep
    assert sel | rep == {i.key for i in items}
    assert Counter(i.family for i in split.selection) == {"a": 5, "b": 5}  # 25 % of 20 each
    assert split_items(items, seed=8, select_fraction=0.25) != split


def test_the_split_does_not_depend_on_the_file_order() -> None:
    items = _items(30)
    text = "\n".join(
        json.dumps({"question": i.question, "answers": list(i.answers), "family": i.family})
        for i in reversed(items)
    )
    reordered = parse_items(text)
    by_question = {i.question for i in split_items(items, 3).selection}
    assert {i.question for i in split_items(reordered, 3).selection} == by_question


def test_a_small_family_keeps_an_item_on_each_side() -> None:
    items = _items(4, ("x", "y"))  # two items per family
    split = split_items(items, seed=1, select_fraction=0.9)
    assert Counter(i.family for i in split.report) == {"x": 1, "y": 1}
    with pytest.raises(ValueError):
        split_items(items, select_fraction=1.0)


def _pinned(n: int, part: str, start: int = 1000) -> list[str]:
    return [
        json.dumps(
            {
                "question": f"What is {start + i} + 1?",
                "answers": [str(start + i + 1)],
                "family": ("a", "b", "c")[i % 3],
                "part": part,
            }
        )
        for i in range(n)
    ]


def _lines(items: list[EvalItem]) -> list[str]:
    return [
        json.dumps({"question": i.question, "answers": list(i.answers), "family": i.family})
        for i in items
    ]


def test_pinned_items_stay_in_their_part_whatever_the_seed() -> None:
    items = parse_items(
        "\n".join(_lines(_items(20)) + _pinned(6, "report") + _pinned(4, "selection", 2000))
    )
    assert {i.part for i in items} == {None, "report", "selection"}
    report_pinned = {i.key for i in items if i.part == "report"}
    selection_pinned = {i.key for i in items if i.part == "selection"}
    unpinned_parts = set()
    for seed in range(30):
        for fraction in (0.1, 0.5, 0.9):
            split = split_items(items, seed, fraction)
            selection = {i.key for i in split.selection}
            report = {i.key for i in split.report}
            assert report_pinned <= report and not report_pinned & selection
            assert selection_pinned <= selection and not selection_pinned & report
            unpinned_parts.add(frozenset(selection - selection_pinned))
    assert len(unpinned_parts) > 10  # the seed still moves the others


def test_adding_pinned_items_moves_none_of_the_others() -> None:
    plain = _items(30)
    pinned = parse_items(
        "\n".join(_lines(plain) + _pinned(9, "report") + _pinned(5, "selection", 3000))
    )
    for seed in (1, 40, 99):
        before = split_items(plain, seed)
        after = split_items(pinned, seed)
        assert tuple(i for i in after.selection if i.part is None) == before.selection
        assert tuple(i for i in after.report if i.part is None) == before.report


def test_a_report_pinned_item_is_never_chosen_on() -> None:
    items = parse_items("\n".join(_lines(_items(20)) + _pinned(6, "report")))
    pinned = {i.question for i in items if i.part == "report"}

    def answer(request: EvalRequest) -> str:  # the candidate is right only on pinned items
        if request.collaboration["mode"] == "vote":
            return _right(request) if request.question in pinned else "0"
        return "0"

    got = _run(items, AnswerBy(answer))
    assert got.selection["vote3"].correct == 0 and not got.choice.beat_greedy
    assert {i.line for i in items if i.part == "report"} <= set(got.report_items)
    rows = [r for r in got.rows if r["line"] in {i.line for i in items if i.part}]
    assert rows and all(r["part"] == "report" for r in rows)


# -- statistics ----------------------------------------------------------------------------


def test_wilson_matches_known_intervals() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson(66, 120)  # issue 40's 0.550 on 120 items
    assert lo == pytest.approx(0.4606, abs=1e-3) and hi == pytest.approx(0.6362, abs=1e-3)
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 10)[0] == 0.0
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-3)
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)


@pytest.mark.parametrize(
    ("a_only", "b_only", "p"),
    [
        (0, 7, 0.015625),  # issue 40: 7 lost and 0 won, p = 0.016
        (7, 0, 0.015625),
        (1, 9, 22 / 1024),
        (2, 8, 112 / 1024),
        (3, 3, 1.0),
        (0, 0, 1.0),
        (0, 1, 1.0),
    ],
)
def test_exact_mcnemar_matches_known_values(a_only: int, b_only: int, p: float) -> None:
    assert mcnemar_p(a_only, b_only) == pytest.approx(p)


@pytest.mark.parametrize("n", range(1, 16))
def test_exact_mcnemar_equals_the_binomial_test_by_likelihood(n: int) -> None:
    """The doubled tail equals the two-sided binomial test that sums every split no more
    likely than the one seen (an independent reference computation at p = 1/2)."""
    probs = [math.comb(n, j) / 2**n for j in range(n + 1)]
    for k in range(n + 1):
        reference = sum(q for q in probs if q <= probs[k] * (1 + 1e-12))
        assert mcnemar_p(k, n - k) == pytest.approx(min(1.0, reference))


def test_the_paired_table_counts_each_kind_of_item() -> None:
    table = PairedTable.of([True, True, False, False, True], [True, False, True, False, False])
    assert table == PairedTable(both=1, only_greedy=1, only_candidate=2, neither=1)
    assert table.p == mcnemar_p(2, 1)


# -- grading -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answers", "choices", "right"),
    [
        ("Paris", ["Paris"], [], True),
        ("The capital of France is Paris.", ["Paris"], [], True),
        ("paris!", ["Paris"], [], True),
        ("Lyon", ["Paris"], [], False),
        ("3 + 1 = 4", ["4"], [], True),
        ("It is 4.0", ["4"], [], True),
        ("1,200 grams", ["1200"], [], True),
        ("4 or 5? 5", ["4"], [], False),
        ("-3", ["3"], [], False),
        ("yes", ["yes"], ["yes", "no"], True),
        ("no", ["yes"], ["yes", "no"], False),
        ("yes and no", ["yes"], ["yes", "no"], False),  # names another choice too
        ("New York", ["new york", "NYC"], [], True),
    ],
)
def test_grading_reads_answers_as_the_bench_does(
    reply: str, answers: list[str], choices: list[str], right: bool
) -> None:
    assert is_correct(reply, answers, choices) is right


# -- configurations ------------------------------------------------------------------------


def test_a_configuration_file_loads_like_the_published_ones(tmp_path: Path) -> None:
    published = Path(__file__).resolve().parents[1] / "bench" / "results" / "quality_best.json"
    compute = load_candidate(str(published))
    assert compute.name == "quality_best" and compute.serve_args == ("--calculator",)
    assert compute.fingerprint() == BUILTIN["compute"].fingerprint()
    bad = tmp_path / "bad.json"
    bad.write_text('{"agents": [], "collaboration": {"mode": "nope"}}')
    with pytest.raises(BadConfig, match="mode"):
        load_candidate(str(bad))
    with pytest.raises(BadConfig, match="not a field"):
        candidate_from_dict({"collaboration": {"mode": "vote"}, "extra": 1}, "x", "x")
    with pytest.raises(BadConfig, match="neither a file nor a built-in"):
        load_candidate("no-such-thing")
    with pytest.raises(BadConfig, match="used twice"):
        load_candidates(["vote3", "vote3"])
    assert [c.name for c in load_candidates([])] == ["compute", "vote3"]


def test_a_request_carries_the_item_choices_and_budget() -> None:
    closed, free = parse_items(
        '{"question": "Is 7 prime?", "answers": ["yes"], "choices": ["yes", "no"]}\n'
        '{"question": "2 + 2?", "answers": ["4"]}'
    )
    r = request_for(GREEDY_CANDIDATE, closed, 16)
    assert r.collaboration["answer"] == {"choices": ["yes", "no"]}
    assert r.temperature == 0.0 and r.max_tokens == 16
    v = request_for(BUILTIN["vote3"], free, 12)
    assert v.collaboration["answer_tokens"] == 12 and v.temperature == 0.7
    assert request_for(GREEDY_CANDIDATE, free, 16).collaboration == {"mode": "auto"}


def test_an_item_budget_applies_where_the_configuration_sets_none() -> None:
    short, wide = parse_items(
        '{"question": "2 + 2?", "answers": ["4"]}\n'
        '{"question": "3 * 4 + 5?", "answers": ["17"], "max_tokens": 200}'
    )
    assert wide.max_tokens == 200 and short.max_tokens is None
    assert wide.content_hash == attrs.evolve(wide, max_tokens=None).content_hash
    assert request_for(GREEDY_CANDIDATE, short, 16).max_tokens == 16
    assert request_for(GREEDY_CANDIDATE, wide, 16).max_tokens == 200
    vote = request_for(BUILTIN["vote3"], wide, 16)
    assert vote.max_tokens == 200 and vote.collaboration["answer_tokens"] == 200
    own = candidate_from_dict(
        {"agents": [{"name": "a"}], "collaboration": {"mode": "auto"}, "max_tokens": 9}, "x", "x"
    )
    assert request_for(own, wide, 16).max_tokens == 9  # the configuration's own wins


def test_a_changed_item_budget_reruns_that_item_only(tmp_path: Path) -> None:
    items = _items(6)
    _run(items, AnswerBy(_right), tmp_path)
    budgets: list[int] = []

    def answer(request: EvalRequest) -> str:
        budgets.append(request.max_tokens)
        return _right(request)

    wider = [attrs.evolve(i, max_tokens=64) if i.line == 3 else i for i in items]
    again = AnswerBy(answer)
    _run(wider, again, tmp_path)
    assert again.calls == 2 and budgets == [64, 64]  # greedy and vote3 on line 3
    replay = AnswerBy(answer)
    _run(wider, replay, tmp_path)
    assert replay.calls == 0  # now recorded under its budget


# -- the choice ----------------------------------------------------------------------------


def test_choose_takes_the_best_and_breaks_ties_by_tokens() -> None:
    got = choose(
        {
            "greedy": Score(10, 5, 2.0),
            "big": Score(10, 8, 9.0),
            "small": Score(10, 8, 4.0),
            "worse": Score(10, 3, 1.0),
        }
    )
    assert got.name == "small" and got.beat_greedy
    tie = choose({"greedy": Score(10, 8, 2.0), "other": Score(10, 8, 1.0)})
    assert tie.name == "greedy" and not tie.beat_greedy
    assert "no candidate beat greedy" in tie.reason


class Killed(Exception):
    """The fake runner's process was killed."""


@attrs.define
class AnswerBy:
    """A fake runner: ``answer(request)`` is the reply; it counts calls and can die after
    ``die_after`` of them, as a killed process would."""

    answer: Callable[[EvalRequest], str]
    label: str = "fake"
    calls: int = 0
    die_after: int | None = None

    async def run(self, request: EvalRequest) -> Reply:
        if self.die_after is not None and self.calls >= self.die_after:
            raise Killed
        self.calls += 1
        tokens = 1 if request.collaboration.get("mode") != "vote" else 3
        return Reply(self.answer(request), 10, tokens, 0.01)


def _right(request: EvalRequest) -> str:
    return str(int(request.question.split()[2]) + 1)


def _run(
    items: list[EvalItem], runner: AnswerBy, tmp: Path | None = None, **kw: object
) -> EvalReport:
    import anyio

    async def go() -> EvalReport:
        return await evaluate(
            items,
            [BUILTIN["vote3"]],
            runner,
            seed=5,
            journal=None if tmp is None else tmp / "journal.jsonl",
            progress=None,
            **kw,  # type: ignore[arg-type]
        )

    return anyio.run(go)


def test_a_candidate_perfect_only_on_report_items_is_not_chosen() -> None:
    items = _items(40)
    report = {i.question for i in split_items(items, 5).report}

    def answer(request: EvalRequest) -> str:
        if request.collaboration["mode"] == "vote":  # the candidate
            return _right(request) if request.question in report else "0"
        return _right(request) if len(request.question) % 2 else "0"  # greedy: some right

    got = _run(items, AnswerBy(answer))
    assert got.choice.name == "greedy" and not got.choice.beat_greedy
    by_name = {r.name: r for r in got.reports}
    assert by_name["vote3"].accuracy == 1.0  # perfect where it was not allowed to count
    assert got.selection["vote3"].accuracy == 0.0
    assert "Nothing beat greedy" in got.table()


def test_a_candidate_better_on_selection_is_chosen_and_reported_against_greedy() -> None:
    items = _items(40)

    def answer(request: EvalRequest) -> str:
        n = int(request.question.split()[2])
        if request.collaboration["mode"] == "vote":
            return _right(request)
        return _right(request) if n % 4 else "0"  # greedy misses a quarter

    got = _run(items, AnswerBy(answer))
    assert got.choice.name == "vote3" and got.choice.beat_greedy
    vote = next(r for r in got.reports if r.name == "vote3")
    assert vote.paired is not None and vote.paired.only_greedy == 0
    assert vote.paired.only_candidate == sum(1 for i in got.report_items if (i - 1) % 4 == 0)
    assert vote.tokens_vs_greedy == pytest.approx(3.0)
    assert set(vote.families) == {"a", "b"}
    assert "Chosen: vote3" in got.table()


# -- resume --------------------------------------------------------------------------------


def test_an_interrupted_run_resumes_without_redoing_items(tmp_path: Path) -> None:
    items = _items(10)
    dying = AnswerBy(_right, die_after=7)
    with pytest.raises(Killed):  # the runner's own error, not wrapped in a task group's
        _run(items, dying, tmp_path, concurrency=1)
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 7  # the header, then one line per finished reply
    again = AnswerBy(_right)
    resumed = _run(items, again, tmp_path, concurrency=1)
    assert again.calls == 2 * len(items) - 7
    fresh = _run(items, AnswerBy(_right))
    assert resumed.reports == fresh.reports and resumed.choice == fresh.choice
    rerun = AnswerBy(_right)
    _run(items, rerun, tmp_path)
    assert rerun.calls == 0  # everything recorded: nothing runs


def test_a_torn_last_line_is_dropped_and_a_changed_runner_reruns(tmp_path: Path) -> None:
    items = _items(4)
    _run(items, AnswerBy(_right), tmp_path)
    journal = tmp_path / "journal.jsonl"
    journal.write_text(journal.read_text() + '{"runner": "fake", "conf')  # killed mid-write
    again = AnswerBy(_right)
    _run(items, again, tmp_path)
    assert again.calls == 0
    other = AnswerBy(_right, label="another-model")
    _run(items, other, tmp_path)
    assert other.calls == 2 * len(items)


# -- replay --------------------------------------------------------------------------------


@attrs.define
class Uneven:
    """A fake runner whose replies carry uneven costs (float seconds that must survive the
    journal exactly); vote3 is right everywhere, greedy on two items in three."""

    label: str = "fake"
    calls: int = 0

    async def run(self, request: EvalRequest) -> Reply:
        self.calls += 1
        n = int(request.question.split()[2])
        vote = request.collaboration.get("mode") == "vote"
        answer = _right(request) if vote or n % 3 else "0"
        return Reply(answer, 10 + n, 3 * n + 1 if vote else n + 1, 0.1 + n / 7 + self.calls / 3)


def _evaluate(items: list[EvalItem], runner: object, journal: Path, **kw: object) -> EvalReport:
    import anyio

    async def go() -> EvalReport:
        return await evaluate(
            items,
            [BUILTIN["vote3"]],
            runner,  # type: ignore[arg-type]
            seed=5,
            journal=journal,
            progress=None,
            **kw,  # type: ignore[arg-type]
        )

    return anyio.run(go)


def test_a_replay_reproduces_the_recorded_report_byte_for_byte(tmp_path: Path) -> None:
    items = _items(30)
    journal = tmp_path / "journal.jsonl"
    ran = _evaluate(items, Uneven(label="in-process:recorded"), journal, concurrency=3)
    assert ran.choice.beat_greedy  # a preset is written too: compare it as well
    write_outputs(ran, tmp_path / "out")
    recorded = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()}
    kept = journal.read_bytes()
    replayed = _evaluate(items, None, journal, replay=True)
    assert replayed.to_dict() == ran.to_dict()
    assert replayed.runner == "in-process:recorded"  # the recorded label
    write_outputs(replayed, tmp_path / "out")
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir()} == recorded
    assert journal.read_bytes() == kept  # a replay only reads its journal


def test_a_replay_missing_a_reply_names_it_and_runs_nothing(tmp_path: Path) -> None:
    items = _items(10)
    journal = tmp_path / "journal.jsonl"
    _evaluate(items, Uneven(), journal, concurrency=1)
    lines = journal.read_text().splitlines(keepends=True)
    dropped = json.loads(lines[6])
    journal.write_text("".join(lines[:6] + lines[7:]))
    line = next(i.line for i in items if i.key == dropped["item"])
    counting = Uneven()
    with pytest.raises(MissingReply) as info:
        _evaluate(items, counting, journal, replay=True)
    assert (info.value.line, info.value.config) == (line, dropped["name"])
    assert f"item line {line}" in str(info.value) and repr(dropped["name"]) in str(info.value)
    assert counting.calls == 0  # a replay never calls its runner
    with pytest.raises(JournalError, match="no such journal"):
        _evaluate(items, None, tmp_path / "none.jsonl", replay=True)
    with pytest.raises(ValueError, match="journal"):
        _evaluate(items, None, None, replay=True)  # type: ignore[arg-type]


def test_a_replay_reads_under_the_runner_that_covers_the_run(tmp_path: Path) -> None:
    items = _items(6)
    journal = tmp_path / "journal.jsonl"
    first = _evaluate(items, Uneven(label="one"), journal)
    _evaluate(items[:3], Uneven(label="two"), journal)  # covers half the items
    assert _evaluate(items, None, journal, replay=True).to_dict() == first.to_dict()
    second = _evaluate(items, Uneven(label="two"), journal)
    with pytest.raises(JournalError, match="one, two"):  # both cover it: which one?
        _evaluate(items, None, journal, replay=True)
    by_label = _evaluate(items, Uneven(label="two"), journal, replay=True)
    assert by_label.to_dict() == second.to_dict()


# -- outputs -------------------------------------------------------------------------------


def test_outputs_write_a_preset_only_when_a_candidate_was_chosen(tmp_path: Path) -> None:
    items = _items(20)
    chosen = _run(
        items, AnswerBy(lambda r: _right(r) if r.collaboration["mode"] == "vote" else "0")
    )
    written = write_outputs(chosen, tmp_path)
    preset = json.loads((tmp_path / "preset.json").read_text())
    assert preset == {
        "name": "vote3",
        "agents": [{"name": "voter", "count": 3}],
        "collaboration": {"mode": "vote", "style": "direct", "early_stop": False},
    }
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["choice"]["name"] == "vote3" and report["preset"]["name"] == "vote3"
    assert len(report["rows"]) == 2 * len(items)
    assert tmp_path / "preset.json" in written
    greedy = _run(items, AnswerBy(_right))
    write_outputs(greedy, tmp_path)
    assert not (tmp_path / "preset.json").exists()  # the folder offers no stale preset
    assert "Nothing beat greedy" in (tmp_path / "report.txt").read_text()


def test_the_progress_line_goes_where_it_is_told() -> None:
    import anyio

    stream = io.StringIO()

    async def go() -> None:
        await evaluate(_items(4), [], AnswerBy(_right), progress=stream)

    anyio.run(go)
    assert "4/4 requests" in stream.getvalue()


# -- the real engine -----------------------------------------------------------------------


@pytest.mark.engine
def test_eval_on_the_real_engine_in_process(real_engine: object, tmp_path: Path) -> None:
    """Five questions, greedy and one two-voter candidate, through ``collaborate()``."""
    items = parse_items(
        "\n".join(
            [
                '{"question": "Is 7 a prime number?", "answers": ["yes"], '
                '"choices": ["yes", "no"], "family": "closed"}',
                '{"question": "Is the sun cold?", "answers": ["no"], '
                '"choices": ["yes", "no"], "family": "closed"}',
                '{"question": "Is ice cold?", "answers": ["yes"], '
                '"choices": ["yes", "no"], "family": "closed"}',
                '{"question": "What is 2 + 3? Reply with the number only.", '
                '"answers": ["5"], "family": "free"}',
                '{"question": "What is the capital of France? Reply with the city only.", '
                '"answers": ["Paris"], "family": "free"}',
            ]
        )
    )
    candidate = candidate_from_dict(
        {
            "agents": [{"name": "voter", "count": 2}],
            "collaboration": {"mode": "vote", "style": "direct"},
            "max_tokens": 8,
        },
        "test",
        "vote2",
    )
    engine = real_engine.bridge  # type: ignore[attr-defined]

    async def go() -> EvalReport:
        return await evaluate(
            items,
            [candidate],
            BridgeRunner(engine),
            max_tokens=8,
            journal=tmp_path / "journal.jsonl",
            progress=None,
        )

    report = real_engine.call(go)  # type: ignore[attr-defined]
    assert len(report.rows) == 10
    assert all(r["refused"] is None and r["failed"] is None for r in report.rows)
    greedy = next(r for r in report.reports if r.name == "greedy")
    assert greedy.completion_tokens > 0 and greedy.n == len(report.report_items)
    assert report.choice.name in ("greedy", "vote2")
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 11
