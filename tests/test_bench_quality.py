"""The pure parts of bench/quality.py: task families, request fields, the target, the report.

No engine: the benchmark itself is run by hand (see BENCHMARKS.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import _quality_report as R
import _quality_report_families as F
import _quality_tasks as T
import pytest
import quality as Q
from _collab_tasks import _CAPITALS
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


@pytest.mark.parametrize("family", list(T.PROBED))
def test_each_family_is_seeded_balanced_and_verifiable(family: str) -> None:
    items = T.family_items(family, 200)
    assert items == T.family_items(family, 200) and items != T.family_items(family, 200, seed=15)
    assert T.family_items(family, 50) == items[:50]  # quick runs are a prefix of full ones
    assert len({i.id for i in items}) == 200 and {i.family for i in items} == {family}
    for item in items:
        assert item.answer in item.choices and len(set(item.choices)) == len(item.choices) == 2
    first = sum(i.answer == i.choices[0] for i in items)
    assert first == 100  # an answer-blind "first listed" bias scores exactly chance
    if family == "capital":
        assert all(i.choices == ("yes", "no") for i in items)
        assert sum(i.answer == "yes" for i in items) == 100
    if family in ("sum", "larger"):
        numbers = [[int(n) for n in re.findall(r"\d+", i.question)] for i in items]
        expected = [sum(n) if family == "sum" else max(n) for n in numbers]
        assert [int(i.answer) for i in items] == expected


def test_the_reported_families_are_probed_ones_and_the_set_is_family_by_family() -> None:
    assert set(T.FAMILIES) <= set(T.PROBED) and len(T.FAMILIES) >= 4
    items = T.quality_set(3)
    assert [i.family for i in items] == [f for f in T.FAMILIES for _ in range(3)]


# no deadline: the first example validates through collab, whose first call loads its
# schema machinery (measured 2.2 s once, 0.4 ms after); what is checked is the request
@settings(deadline=None)
@given(st.sampled_from(sorted(Q.METHODS)), st.sampled_from(list(T.PROBED)), st.integers(0, 50))
def test_every_method_is_request_fields_with_the_items_choices(
    method: str, family: str, i: int
) -> None:
    item = T.family_items(family, i + 1)[i]
    body = Q.request_of(method, item)
    assert set(body) == {"agents", "collaboration", "temperature", "max_tokens"}
    assert body["collaboration"]["answer"]["choices"] == list(item.choices)
    assert body["collaboration"]["mode"] in ("vote", "best_of", "auto", "compute")
    assert "answer" not in Q.METHODS[method].get("collaboration", {})  # added per item only


def test_the_published_configuration_is_exactly_the_request_fields() -> None:
    best = json.loads((BENCH / "results" / "quality_best.json").read_text())
    assert set(best) <= {"agents", "collaboration", "max_tokens", "serve_args"}
    assert {"agents", "collaboration"} <= set(best)
    assert "answer" not in best["collaboration"]  # the client adds answer.choices
    assert Q.serve_args(best) == best.get("serve_args", [])  # serve's own parser takes them
    fields = {k: v for k, v in best.items() if k != "serve_args"}
    assert Q.fields_of("best", "product") == fields == Q.published("closed")  # measured as sent
    page = (ROOT / "docs" / "quality.md").read_text()
    block = re.search(r"```json\n(.*?)```", page, re.S)
    assert block is not None and json.loads(block.group(1)) == best  # the page shows the file


def test_the_published_free_configuration_is_the_measured_method_and_shown() -> None:
    best = json.loads(Q.BEST_FREE.read_text())
    assert (
        set(best) <= {"agents", "collaboration", "serve_args"}
        and "answer" not in best["collaboration"]
    )
    assert Q.fields_of("best", "shopping") == {k: v for k, v in best.items() if k != "serve_args"}
    page = (ROOT / "docs" / "quality.md").read_text()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", page, re.S)]
    assert best in blocks


def test_a_bad_serve_args_entry_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="--no-such-option"):
        Q.serve_args({"serve_args": ["--no-such-option"]})
    with pytest.raises(SystemExit, match="list of strings"):
        Q.serve_args({"serve_args": "--calculator"})


def _rows(method: str, family: str, correct: list[bool], tokens: float) -> list[dict[str, Any]]:
    return [
        {
            "method": method,
            "item": f"{family}-{i}",
            "family": family,
            "rep": 0,
            "answer": "a" if ok else "b",
            "correct": ok,
            "ordered": ["a" if ok else "b"],
            "samples": 1,
            "prompt_tokens": 10,
            "cached_tokens": 0,
            "completion_tokens": tokens,
        }
        for i, ok in enumerate(correct)
    ]


def _data() -> dict[str, Any]:
    n = 40
    rows: list[dict[str, Any]] = []
    items = []
    for family in ("f1", "f2", "f3"):
        items += [
            {"id": f"{family}-{i}", "family": family, "question": "q", "choices": ["a", "b"],
             "answer": "a"}
            for i in range(n)
        ]  # fmt: skip
        base = [i % 2 == 0 for i in range(n)]  # 0.5
        rows += _rows("greedy", family, base, 2)
        rows += _rows("single", family, base, 2)
        rows += _rows("good", family, [True] * n, 4)  # wins 20/0 on every family
        rows += _rows("costly", family, [True] * n, 7)  # wins, but over 3× the tokens
    rows += [{"method": "refuser", "item": "f1-0", "family": "f1", "refused": "shares a token"}]
    return {
        "settings": {
            "model": "m",
            "items_per_family": n,
            "seed": 1,
            "max_tokens": 8,
            "temperature": 0.7,
            "families": ["f1", "f2", "f3"],
            "methods": {m: {} for m in ("greedy", "single", "good", "costly", "refuser")},
        },
        "items": items,
        "rows": rows,
        "machine": {"cpus": 2, "loadavg_at_start": 0.1, "seconds": 5},
    }


def test_the_target_needs_significant_wins_within_the_token_budget() -> None:
    data = _data()
    summary = R.summarize(data, R.answered(data["rows"]))
    for base in R.BASELINES:
        got = R.target(summary, base)
        assert got["good"] == {"families": ["f1", "f2", "f3"], "over_budget": [], "met": True}
        assert got["costly"]["families"] == [] and not got["costly"]["met"]
        assert got["costly"]["over_budget"] == ["f1", "f2", "f3"]
        assert not got["greedy" if base == "single" else "single"]["met"]
        assert not R.target(summary, base, R.above_chance(data, summary))["good"]["met"]
        assert R.target(summary, base, {"f1", "f3"})["good"]["met"]


def test_the_report_is_derived_from_the_rows_and_regenerates_byte_for_byte(
    tmp_path: Path,
) -> None:
    data = _data()
    md = R.tables(data)
    assert md == R.tables(json.loads(json.dumps(data)))
    assert "| good | 1.000 |" in md and "f1*, f2*, f3* — *met*" in md  # all at chance
    assert "| refuser | refused (1 items: shares a token) |" in md
    assert "| f1 | 0.500 |" in md  # the chance table
    png = tmp_path / "q.png"
    R.plot(data, png)
    assert png.read_bytes().startswith(b"\x89PNG")


# -- free-answer families ----------------------------------------------------------------


@pytest.mark.parametrize("family", list(T.FREE))
def test_each_free_family_is_seeded_balanced_and_gradable(family: str) -> None:
    items = T.family_items(family, 200)
    assert items == T.family_items(family, 200) and items != T.family_items(family, 200, seed=15)
    assert T.family_items(family, 50) == items[:50]  # quick runs are a prefix of full ones
    assert len({i.id for i in items}) == 200 and {i.family for i in items} == {family}
    assert all(i.choices == () for i in items) and T.kind(family) in ("free", "json")
    assert all(T.grade(i, i.answer)["correct"] for i in items)  # the key grades right
    if family == "capital_free":
        countries = [re.search(r"capital of (\w+)\?", i.question).group(1) for i in items]  # type: ignore[union-attr]
        assert set(countries) == set(_CAPITALS)
        assert all(countries.count(c) == 200 // len(_CAPITALS) for c in _CAPITALS)
        assert all(i.answer == _CAPITALS[c] for i, c in zip(items, countries, strict=True))
    if family == "sum_free":
        numbers = [[int(n) for n in re.findall(r"\d+", i.question)] for i in items]
        assert all(len(n) == 2 and all(1 <= x <= 20 for x in n) for n in numbers)
        assert [int(i.answer) for i in items] == [sum(n) for n in numbers]
        carries = [a % 10 + b % 10 >= 10 for a, b in numbers]
        assert carries == [i % 2 == 1 for i in range(200)]  # half need a carry
    if family == "extract":
        answers = [json.loads(i.answer) for i in items]
        assert all(T.grade(i, i.answer)["valid"] for i in items)
        for item, a in zip(items, answers, strict=True):
            assert a["name"] in item.question and a["city"] in item.question
            assert str(a["age"]) in item.question
        names = [a["name"] for a in answers]
        assert (
            len(set(names)) >= 5
            and max(map(names.count, names)) - min(map(names.count, names)) <= 1
        )  # dealt as decks
        templates = {re.sub(r"\d+", "N", i.question.split('"')[1]) for i in items[:4]}
        assert len(templates) == 4  # the sentence templates in turn


def test_free_answers_are_graded_on_the_name_or_number_they_give() -> None:
    item = T.family_items("capital_free", 1)[0]
    city = item.answer
    other = "London" if city != "London" else "Paris"
    for reply in (
        city,
        f"{city}.",
        f" {city.upper()}!",
        f"{city} is the capital.",
        f"Answer: {city}",
        f"The capital is {city}.",
    ):
        assert T.grade(item, reply) == {"correct": True}, reply
    for reply in ("", f"{city}ia", other, f"{city} or {other}"):
        assert T.grade(item, reply) == {"correct": False}, reply
    total = T.family_items("sum_free", 1)[0]
    assert T.grade(total, total.answer + ".")["correct"]
    assert T.grade(total, f"1 + 2 = {total.answer}")["correct"]  # the last number
    assert not T.grade(total, f"{total.answer} + 1 = 99")["correct"]
    assert not T.grade(total, str(int(total.answer) + 1))["correct"]
    assert not T.grade(total, total.answer + "0")["correct"]


def test_extraction_is_graded_for_validity_and_each_field() -> None:
    item = T.family_items("extract", 1)[0]
    truth = json.loads(item.answer)
    fenced = f"Here it is:\n```json\n{json.dumps(truth)}\n```"
    assert T.grade(item, fenced) == {"correct": True, "valid": True, "fields": 1.0}
    lower = json.dumps({**truth, "name": truth["name"].lower()})
    assert T.grade(item, lower)["correct"]  # case-insensitive names and cities
    extra = json.dumps({**truth, "job": "pilot"})  # the schema allows no other keys
    assert T.grade(item, extra) == {"correct": True, "valid": False, "fields": 1.0}
    as_text = json.dumps({**truth, "age": str(truth["age"])})  # an age must be a number
    got = T.grade(item, as_text)
    assert got["valid"] is False and not got["correct"] and got["fields"] == pytest.approx(2 / 3)
    wrong_city = json.dumps({**truth, "city": "Atlantis"})
    assert T.grade(item, wrong_city) == pytest.approx(
        {"correct": False, "valid": True, "fields": 2 / 3}
    )
    for broken in ("", "no json here", '{"name": ', "[1, 2]"):
        assert T.grade(item, broken) == {"correct": False, "valid": False, "fields": 0.0}


def test_each_family_kind_runs_the_methods_that_fit_it() -> None:
    assert Q.methods_for("capital", None) == list(Q.FULL_METHODS)
    assert Q.methods_for("capital", None, quick=True) == list(Q.QUICK_METHODS)
    free, extract = Q.methods_for("sum_free", None), Q.methods_for("extract", None)
    assert free == list(Q.FREE_METHODS) and extract == list(Q.JSON_METHODS)
    assert {
        "greedy",
        "single",
        "vote3",
        "vote5",
        "vote5-adaptive",
        "best5-self",
        "best2-likelihood",
        "best3-likelihood",
        "best5-likelihood",
        "best3-likelihood-greedy",
        "best3-likelihood-greedy-adaptive",
        "auto5",
        "best",
        "compute",
        "compute3",
        "auto5-calc",
    } == set(free) - Q.NUMBER_METHODS
    assert {
        "vote3-number",
        "vote5-number",
        "vote5-number-adaptive",
        "best3-likelihood-number",
    } == Q.NUMBER_METHODS
    # the vote on the reply's number runs where answers are numbers, and only there
    assert set(free) >= Q.NUMBER_METHODS and "sum_free" in T.NUMERIC
    assert not Q.NUMBER_METHODS & set(Q.methods_for("capital_free", None))
    assert Q.methods_for("capital_free", ["vote3-number", "vote3"]) == ["vote3"]
    assert {"best5-validator", "reflect-validator"} <= set(extract)
    assert not any(m.startswith("vote") for m in extract)  # a vote's answer is not JSON
    assert Q.methods_for("extract", ["vote5", "single", "best"]) == ["single"]
    assert Q.methods_for("capital", ["vote5-adaptive", "best"]) == ["best"]
    assert Q.parse_families("") == T.FAMILIES
    assert Q.parse_families("free") == tuple(T.FREE)
    assert Q.parse_families("capital_free,country_free,sum_free,extract") == tuple(T.FREE)
    assert Q.parse_families("all,sum") == tuple(T.PROBED)
    with pytest.raises(KeyError):
        Q.parse_families("capital,nope")
    # report families: their kind, their methods (the report run's, greedy first)
    assert Q.parse_families("report") == ("product", "convert", "shopping", "passage")
    assert Q.methods_for("passage", None) == [m for m in Q.REPORT_METHODS if m in Q.METHODS]
    assert Q.methods_for("shopping", None)[0] == "greedy"
    assert "soft2-content" not in Q.methods_for("shopping", None)  # closed only


_FREE_CASES = [(f, m) for f in T.FREE for m in Q.methods_for(f, None)]


@pytest.mark.parametrize(("family", "method"), _FREE_CASES)
def test_free_request_bodies_are_valid_collaborations(family: str, method: str) -> None:
    from microagent.collab import prepare_collaboration

    item = T.family_items(family, 1)[0]
    body = Q.request_of(method, item)
    assert set(body) == {"agents", "collaboration", "temperature", "max_tokens"}
    assert body["max_tokens"] == T.MAX_TOKENS[family]
    reads_number = method in Q.NUMBER_METHODS
    assert body["collaboration"].get("answer") == ({"extract": "number"} if reads_number else None)
    options = dict(body["collaboration"])
    mode = options.pop("mode")
    prepare_collaboration(
        mode,
        body["agents"],
        {**options, "temperature": body["temperature"], "max_tokens": body["max_tokens"]},
    )  # raises InvalidCollaboration on a bad body
    if mode == "vote" or reads_number:
        assert options["answer_tokens"] == T.MAX_TOKENS[family]  # a direct voter's budget
    validated = method in ("best5-validator", "reflect-validator") or (
        family == "extract" and method in ("auto5", "best3-likelihood-validator")
    )
    assert ("validator" in options) == validated
    if validated:
        assert options["validator"] == {"type": "json_schema", "schema": T.EXTRACT_SCHEMA}


def test_free_methods_run_end_to_end_on_the_scripted_engine() -> None:
    """Every free method through ``run_one`` (``collaborate()`` and the grade), on an engine
    that replies with the item's answer to every free turn (judges: their own yes/no)."""
    import anyio
    from microagent.engine_bridge import EngineRequest
    from microagent.testing import ScriptedEngine

    items = {f: T.family_items(f, 1)[0] for f in T.FREE}
    replies = {f: f"{i.answer}." if f != "extract" else i.answer for f, i in items.items()}
    family = ""

    def script(prompt: object, request: EngineRequest) -> str | None:
        return None if request.sampling.choices else replies[family]

    async def main() -> list[dict[str, Any]]:
        nonlocal family
        rows = []
        async with ScriptedEngine(script=script) as engine:
            for family, item in items.items():
                for method in Q.methods_for(family, None):
                    rows.append(await Q.run_one(engine, method, item))
        return rows

    rows = anyio.run(main)
    assert len(rows) == len(_FREE_CASES)
    for row in rows:
        assert "refused" not in row and row["correct"], row
        if row["family"] == "extract":
            assert row["valid"] and row["fields"] == 1.0
    strategies = {(r["family"], r["method"]): r.get("strategy") for r in rows}
    assert strategies[("extract", "auto5")] == "best_of_validator"
    assert strategies[("sum_free", "auto5")] == "best_of_likelihood"
    assert strategies[("sum_free", "single")] == "single"


def _free_data() -> dict[str, Any]:
    n = 40
    items: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for family in ("sum_free", "extract"):
        items += [
            {"id": f"{family}-{i}", "family": family, "question": "q", "choices": [], "answer": "a"}
            for i in range(n)
        ]
        rows += _rows("greedy", family, [i < 4 for i in range(n)], 3)  # 0.1: above chance 0
        rows += _rows("single", family, [False] * n, 3)  # 0.0: not above chance
        rows += _rows("best5-self", family, [i < 30 for i in range(n)], 8)
    for r in rows:
        r["ordered"] = [] if r["method"] != "best5-self" else [r["answer"]] * 5
        if r["family"] == "extract":
            r["valid"] = r["correct"] or r["item"].endswith("-39")
            r["fields"] = 1.0 if r["correct"] else 1 / 3
    rows += [{"method": "vote5", "item": "sum_free-0", "family": "sum_free", "refused": "x"}]
    return {
        "settings": {
            "model": "m",
            "items_per_family": n,
            "seed": 1,
            "max_tokens": 8,
            "max_tokens_per_family": {"sum_free": 12, "extract": 48},
            "temperature": 0.7,
            "families": ["sum_free", "extract"],
            "methods": {m: {} for m in ("greedy", "single", "vote5", "best5-self")},
        },
        "items": items,
        "rows": rows,
        "machine": {"cpus": 2, "loadavg_at_start": 0.1, "seconds": 5},
    }


def test_the_report_handles_free_families_with_chance_zero(tmp_path: Path) -> None:
    data = _free_data()
    assert R.chance(data, "sum_free") == 0.0 and not R.closed(data, "extract")
    summary = R.summarize(data, R.answered(data["rows"]))
    assert R.above_chance(data, summary) == {"sum_free", "extract"}  # greedy got some right
    md = R.tables(data)
    assert md == R.tables(json.loads(json.dumps(data)))
    assert "| sum_free | 0.000 |" in md and "| extract | 0.000 |" in md  # the chance table
    assert "`sum_free` (at most 12 tokens)" in md and "`extract` (at most 48 tokens)" in md
    assert "constrained to the item's choices" not in md
    assert "**extract**: JSON valid" in md
    assert "| best5-self | 40 | 0.775 | 0.833 | 0.750 |" in md  # 31 valid, 30 all right
    assert "| greedy | 40 | 0.125 | 0.400 | 0.100 |" in md
    assert "Bias:" not in md and "Soft votes:" not in md  # about choices: closed families only
    assert "| vote5 | refused (1 items: x) |" in md
    assert "extract, sum_free — **met**" in md  # best5-self wins 30/0 on both
    assert "| vote5 |" not in md.split("**extract**")[1].split("Target")[0]  # not run there
    png = tmp_path / "quality_free.png"
    R.plot(data, png)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_http_path_runs_the_same_requests_through_microagent_serve(tmp_path: Path) -> None:
    """``--http``: a server started with the published serve_args answers every method's
    request as a row; one started without them refuses the calculator's by name."""
    import asyncio

    from _quality_http import ServedModel

    item = F.report_family_items("product", 1)[0]

    async def rows(serve_args: list[str]) -> list[dict[str, Any]]:
        served = ServedModel(serve_args, tmp_path / "serve.log", engine="scripted")
        await served.open()
        try:
            return [await Q.run_one(served, m, item) for m in ("greedy", "compute")]
        finally:
            await served.close()

    greedy, compute = asyncio.run(rows(["--calculator"]))
    for row in (greedy, compute):
        assert row["answer"] in item.choices and row["correct"] == (row["answer"] == item.answer)
        assert row["completion_tokens"] > 0
    _, refused = asyncio.run(rows([]))
    assert "collaboration.mode" in refused["refused"] and "--calculator" in refused["refused"]
