"""Report families of ``bench/quality.py``: frozen before any configuration was chosen.

The selection families (``_quality_tasks``) are where configurations and
``auto``'s rules are chosen; these are only reported. Their generators, seed
(``REPORT_SEED``) and the hash of their items (``REPORT_HASH``) were committed
before any selection run, and ``quality.py`` refuses to report them when the
items it generates hash to anything else. Two kinds, so that a gain where a
tool applies and a loss where none does are both visible:

Where a calculator applies:

- ``product``: "What is a times b?" (a 11–49, b 3–9), four choices: the product
  and three near misses (± b, + 10), the right one at position ``i % 4``;
- ``convert``: "How many <small units> are in <n> <big units>?" (metres and
  centimetres, kilograms and grams, hours and minutes, days and hours, weeks and
  days, dozens and eggs), three choices: the right value, the value with another
  unit's factor, and the right value ± the factor;
- ``shopping``: a one-sentence word problem (buying items at a price plus one more,
  giving some away, boxes of things), free answer, "Reply with the number only.";
  right when the reply's last number is the answer.

Where no tool applies (no arithmetic in the question):

- ``passage``: two sentences about two people (a job and a city each), then a
  question about one of them; two choices, both from the passage, the right one
  first on even items.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable

from _accuracy_tasks import Item

#: the report families' seed: fixed when they were frozen, never tuned
REPORT_SEED = 20261203
#: items per report family in a full run
REPORT_ITEMS = 120
#: sha256 of ``report_items(REPORT_ITEMS)`` (``items_hash``), committed with the generators
REPORT_HASH = "0cf454d4b39ec6583e2f828267b55e4b77f8b62dc608662611b8b2b467cc3d30"

_CONVERSIONS = (
    ("centimetres", "metres", 100),
    ("grams", "kilograms", 1000),
    ("minutes", "hours", 60),
    ("hours", "days", 24),
    ("days", "weeks", 7),
    ("eggs", "dozen eggs", 12),
)
_PEOPLE = ("Lena", "Tom", "Aiko", "Pedro", "Fatima", "Lars", "Chen", "Olga", "Omar", "Emma")
_JOBS = ("doctor", "pilot", "teacher", "baker", "farmer", "painter", "nurse", "driver")
_TOWNS = ("Oslo", "Cairo", "Lima", "Tokyo", "Dublin", "Madrid", "Paris", "Berlin")
_GOODS = (("notebooks", 2, 9), ("apples", 1, 4), ("tickets", 5, 15), ("books", 6, 20))


def _product(rng: random.Random, i: int) -> Item:
    a, b = rng.randint(11, 49), rng.randint(3, 9)
    right = a * b
    wrong = [right + b, right - b, right + 10]
    choices = [str(w) for w in wrong]
    choices.insert(i % 4, str(right))
    return Item(f"product-{i}", "product", f"What is {a} times {b}?", tuple(choices), str(right))


def _convert(rng: random.Random, i: int) -> Item:
    small, big, factor = _CONVERSIONS[i % len(_CONVERSIONS)]
    n = rng.randint(2, 9)
    right = n * factor
    other = rng.choice([f for _, _, f in _CONVERSIONS if f != factor])
    wrong = [n * other, right + factor]
    choices = [str(w) for w in wrong]
    choices.insert(i % 3, str(right))
    question = f"How many {small} are in {n} {big}?"
    return Item(f"convert-{i}", "convert", question, tuple(choices), str(right))


def _shopping(rng: random.Random, i: int) -> Item:
    name = rng.choice(_PEOPLE)
    form = i % 3
    if form == 0:
        goods, low, high = rng.choice(_GOODS)
        count, price, extra = rng.randint(2, 6), rng.randint(low, high), rng.randint(1, 9)
        question = (
            f"{name} buys {count} {goods} at {price} dollars each and a pen for {extra} "
            f"dollars. How many dollars does {name} spend?"
        )
        answer = count * price + extra
    elif form == 1:
        start = rng.randint(30, 90)
        given = rng.randint(5, start - 5)
        question = f"{name} had {start} marbles and gave away {given}. How many are left?"
        answer = start - given
    else:
        boxes, each = rng.randint(3, 9), rng.randint(4, 12)
        question = f"There are {boxes} boxes with {each} pencils in each. How many pencils in all?"
        answer = boxes * each
    return Item(
        f"shopping-{i}",
        "shopping",
        f"{question} Reply with the number only.",
        (),
        str(answer),
    )


def _passage(rng: random.Random, i: int) -> Item:
    first, second = rng.sample(_PEOPLE, 2)
    jobs = rng.sample(_JOBS, 2)
    towns = rng.sample(_TOWNS, 2)
    text = (
        f"{first} is a {jobs[0]} and lives in {towns[0]}. "
        f"{second} is a {jobs[1]} and lives in {towns[1]}."
    )
    asked = rng.randrange(2)
    who = (first, second)[asked]
    if rng.randrange(2):
        question, right, wrong = f"Where does {who} live?", towns[asked], towns[1 - asked]
    else:
        question, right, wrong = f"What is {who}'s job?", jobs[asked], jobs[1 - asked]
    choices = (right, wrong) if i % 2 == 0 else (wrong, right)
    return Item(f"passage-{i}", "passage", f"{text} {question}", choices, right)


#: report family -> (kind, item maker); ``closed`` ones have choices, ``free`` ones not
REPORT_FAMILIES: dict[str, tuple[str, Callable[[random.Random, int], Item]]] = {
    "product": ("closed", _product),
    "convert": ("closed", _convert),
    "shopping": ("free", _shopping),
    "passage": ("closed", _passage),
}
#: report families where a calculator applies (the others: none does)
TOOL_FAMILIES = frozenset({"product", "convert", "shopping"})
#: free report families whose answer is a number (graded on the reply's last number)
NUMERIC_REPORT = frozenset({"shopping"})
#: completion budget of free report families
REPORT_MAX_TOKENS = {"shopping": 12}


def report_family_items(family: str, n: int) -> list[Item]:
    """The first ``n`` items of report family ``family`` (a prefix of any longer set)."""
    _, make = REPORT_FAMILIES[family]
    rng = random.Random(f"{REPORT_SEED}-{family}")
    return [make(rng, i) for i in range(n)]


def report_items(n: int = REPORT_ITEMS, families: tuple[str, ...] | None = None) -> list[Item]:
    """``n`` items of each report family (all by default), family after family."""
    names = tuple(REPORT_FAMILIES) if families is None else families
    return [item for family in names for item in report_family_items(family, n)]


def items_hash(items: list[Item]) -> str:
    """sha256 of the items as JSON lines: what ``REPORT_HASH`` freezes."""
    lines = (json.dumps(item.__dict__, sort_keys=True) for item in items)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
