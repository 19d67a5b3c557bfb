"""The pure parts of bench/accuracy.py: question sets, McNemar, replays, the generated section.

No engine: the benchmark itself is run by hand (see BENCHMARKS.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import _accuracy_report as R
import _accuracy_tasks as T
import accuracy as A
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.collab._tally import majority


def test_easy_set_is_fixed_balanced_and_verifiable() -> None:
    items = T.easy_set()
    assert len(items) == 60 and items == T.easy_set() and items != T.easy_set(seed=15)
    assert {i.family for i in items} == {"larger", "capital", "sum"}
    assert len({i.id for i in items}) == 60
    for item in items:
        assert item.answer in item.choices and len(set(item.choices)) == len(item.choices)
        numbers = [int(n) for n in re.findall(r"\d+", item.question)]
        if item.family == "larger":
            assert int(item.answer) == max(numbers) and len(item.choices) == 2
        elif item.family == "sum":
            assert int(item.answer) == sum(numbers) and len(item.choices) == 2
        else:
            assert item.choices == ("yes", "no")
    capitals = [i for i in items if i.family == "capital"]
    assert sum(i.answer == "yes" for i in capitals) == len(capitals) // 2  # half true
    # the correct sum is not always listed first (an order-biased model gets no free points)
    sums = [i for i in items if i.family == "sum"]
    assert 0 < sum(i.choices[0] == i.answer for i in sums) < len(sums)


def test_mc_set_is_the_collab_benchmarks_items_without_their_choices_line() -> None:
    items = T.mc_set(240)
    assert len(items) == 240 and len({i.id for i in items}) == 240
    assert all("Choices" not in i.question and i.answer in i.choices for i in items)


def test_mcnemar_counts_discordant_pairs_and_gives_exact_p() -> None:
    a = [True] * 10 + [False] * 5
    b = [False] * 10 + [False] * 5
    test = T.mcnemar(a, b)
    assert test["a_only"] == 10 and test["b_only"] == 0
    assert abs(test["p"] - 2 / 2**10) < 1e-12
    assert T.mcnemar(a, a) == {"a_only": 0, "b_only": 0, "p": 1.0}
    assert T.mcnemar([True, False], [False, True])["p"] == 1.0


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40))
def test_mcnemar_is_symmetric_and_a_probability(pairs: list[tuple[bool, bool]]) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    ab, ba = T.mcnemar(a, b), T.mcnemar(b, a)
    assert ab["p"] == ba["p"] and 0 < ab["p"] <= 1
    assert (ab["a_only"], ab["b_only"]) == (ba["b_only"], ba["a_only"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["yes", "no"]), min_size=9, max_size=9),
    st.sampled_from(list(A.REPLAYS.values())),
)
def test_replays_answer_the_plurality_of_the_votes_they_use(
    ordered: list[str], options: dict[str, Any]
) -> None:
    answer, used = T.replay(ordered, ("yes", "no"), **options)
    assert 1 <= used <= options["voters"]
    assert answer == majority(ordered[:used], ("yes", "no"))
    if not options.get("rule") and options.get("exact", True):
        # the exact stop never changes the full vote's answer
        assert answer == majority(ordered[: options["voters"]], ("yes", "no"))


def _data() -> dict[str, Any]:
    items = T.easy_set(6)
    rows = []
    for method in ("greedy", "single", "vote9"):
        for k, item in enumerate(items):
            right = (k % 2 == 0) if method != "vote9" else True
            wrong = next(c for c in item.choices if c != item.answer)
            answer = item.answer if right else wrong
            rows.append(
                {
                    "method": method,
                    "item": item.id,
                    "family": item.family,
                    "rep": 0,
                    "answer": answer,
                    "correct": right,
                    "ordered": [answer] * (9 if method == "vote9" else 1),
                    "samples": 9 if method == "vote9" else 1,
                    "prompt_tokens": 50,
                    "completion_tokens": 3,
                }
            )
    return {
        "settings": {
            "model": "m",
            "answer_tokens": 8,
            "temperature": 0.7,
            "debate_tokens": 48,
            "easy": 6,
            "mc": 0,
            "seed": 14,
            "mc_seed": 1234,
            "reps": 1,
            "methods": {"greedy": {}, "single": {}, "vote9": {}},
            "replays": A.REPLAYS,
        },
        "items": [i.__dict__ for i in items],
        "rows": rows,
        "machine": {"cpus": 2, "loadavg_per_method": {"greedy": [1.0, 2.5]}, "seconds": 9},
    }


def test_tables_are_derived_from_the_rows(tmp_path: Path) -> None:
    data = _data()
    summary = R.summarize(data, data["rows"])["easy"]
    assert summary["greedy"]["accuracy"] == 0.5 and summary["vote9"]["accuracy"] == 1.0
    assert summary["vote9"]["vs_greedy"] == {"a_only": 3, "b_only": 0, "p": 0.25}
    text = R.tables(data)
    assert "| vote9 | 1.000 |" in text and "+3/−0, p=0.25" in text
    assert "load average 1.00–2.50" in text
    # unanimous 9-voter samples: the window rule stops after 3, the exact vote-5 after 3
    assert "| window w3 (replay) | 1.000 | 3.00 | 1.000 |" in text
    bench = tmp_path / "BENCHMARKS.md"
    bench.write_text("# Benchmarks\n\nhand-written\n")
    R.update_benchmarks(bench, text, "bench/results/accuracy.json")
    R.update_benchmarks(bench, text, "bench/results/accuracy.json")  # idempotent
    out = bench.read_text()
    assert out.count(R.BEGIN) == 1 and out.count(R.END) == 1 and "hand-written" in out
    assert text in out


def test_soft_and_judge_diagnostics_come_from_the_rows() -> None:
    assert {"soft5-labels", "soft5-labels-cal", "best5-self", "auto"} <= set(A.METHODS)
    data = _data()
    items = T.easy_set(6)
    for item in items:
        wrong = next(c for c in item.choices if c != item.answer)
        data["rows"].append(
            {
                "method": "soft5-labels-cal",
                "item": item.id,
                "family": item.family,
                "rep": 0,
                "answer": item.answer,
                "correct": True,
                "ordered": [item.answer] * 5,
                "samples": 5,
                "debiased": True,
                "soft": {
                    "mean_mass": 1.0,
                    "fallbacks": 1,
                    "position_prior": [0.8, 0.2],
                    "distribution": {item.answer: 0.6, wrong: 0.4},
                },
            }
        )
        data["rows"].append(
            {
                "method": "best5-self",
                "item": item.id,
                "family": item.family,
                "rep": 0,
                "answer": item.answer,
                "correct": True,
                "ordered": [item.answer, wrong],
                "samples": 2,
                "candidates": [
                    {"answer": item.answer, "score": 0.7},
                    {"answer": wrong, "score": 0.5},
                ],
                "strategy": "best_of_self",
            }
        )
    data["settings"]["methods"].update({"soft5-labels-cal": {}, "best5-self": {}})
    text = R.tables(data)
    assert "| soft5-labels-cal | 1.000 | 1.00 | 0.800 | 0.600 |" in text
    assert "| best5-self | 0.700 | 0.500 | 6 | 1.000 |" in text
    assert "`auto` picked: best_of_self ×6." in text
