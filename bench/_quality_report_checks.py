"""Issue 40's report families: where a tool or a check should help a small model.

Frozen before any selection run and before any change to ``compute`` for issue 40:
these generators, their seed (``CHECKS_SEED``) and the hash of their items
(``CHECKS_HASH``) were committed alone, and ``tests/test_bench_report_families.py``
checks both the hash and that commit order. Like the first report families
(``_quality_report_families``), they are only reported; configurations are
chosen on other draws of the same generators (``selection_items``, another seed)
and on the selection families.

Where a tool or a check should help:

- ``steps``: a two-step word problem with stated quantities (``a*b+c``,
  ``a-b*c``, ``a*(b+c)``, ``a*b-c``), free answer, "Reply with the number only.";
  right when the reply's last number is the answer;
- ``factor``: a unit conversion that states its factor ("A crate holds 24 bottles.
  How many bottles are in 7 crates?"), three choices: the right value, the value
  with another unit's factor, and the right value ± the factor;
- ``dates``: date and time arithmetic (the weekday ``k`` days after a weekday; the
  hour ``k`` hours after an hour on a 24-hour clock), four choices;
- ``count``: counting the items of a short list, or one letter in a word, free
  answer, "Reply with the number only."; graded on the last number.

Where nothing should help (the control):

- ``plural``: "What is the plural of <word>: <a> or <b>?" (irregular plurals
  against the regular "+s" form), two choices, the right one first on even items.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable

from _accuracy_tasks import Item

#: these families' seed: fixed when they were frozen, never tuned
CHECKS_SEED = 20261205
#: the seed of selection draws from the same generators (never reported)
SELECTION_SEED = 40
#: items per family in a full run
CHECKS_ITEMS = 120
#: sha256 of ``checks_items(CHECKS_ITEMS)`` (``items_hash``), committed with the generators
CHECKS_HASH = "6f235c862d46819eeac4254d6edd80aef5295629b28d838ed37cb75a62f6240e"

_PEOPLE = ("Lena", "Tom", "Aiko", "Pedro", "Fatima", "Lars", "Chen", "Olga", "Omar", "Emma")
_UNITS = (
    ("bottles", "crate", "crates", (6, 12, 18, 24)),
    ("eggs", "tray", "trays", (15, 20, 30)),
    ("pages", "chapter", "chapters", (8, 14, 22)),
    ("seats", "row", "rows", (9, 16, 25)),
    ("cards", "pack", "packs", (13, 26, 52)),
    ("tiles", "box", "boxes", (11, 17, 40)),
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NOUNS = (
    "apple", "chair", "river", "cloud", "pencil", "tiger", "lamp", "bread", "stone",
    "violin", "garden", "candle", "window", "rocket", "button", "carpet",
)  # fmt: skip
_WORDS = (
    "banana", "committee", "balloon", "mississippi", "letter", "coffee", "pepper",
    "assessment", "strawberry", "bookkeeper", "parallel", "tomorrow", "address",
    "success", "hippopotamus", "cinnamon",
)  # fmt: skip
_PLURALS = (
    ("mouse", "mice", "mouses"), ("child", "children", "childs"), ("foot", "feet", "foots"),
    ("tooth", "teeth", "tooths"), ("man", "men", "mans"), ("woman", "women", "womans"),
    ("goose", "geese", "gooses"), ("person", "people", "persons"), ("leaf", "leaves", "leafs"),
    ("knife", "knives", "knifes"), ("wolf", "wolves", "wolfs"), ("ox", "oxen", "oxes"),
    ("cactus", "cacti", "cactuses"), ("half", "halves", "halfs"), ("life", "lives", "lifes"),
    ("shelf", "shelves", "shelfs"),
)  # fmt: skip


def _steps(rng: random.Random, i: int) -> Item:
    name = rng.choice(_PEOPLE)
    form = i % 4
    if form == 0:
        a, b, c = rng.randint(3, 9), rng.randint(4, 12), rng.randint(2, 9)
        question = (
            f"{name} buys {a} packs of stickers with {b} stickers in each pack, and then "
            f"{c} loose stickers. How many stickers does {name} have?"
        )
        answer = a * b + c
    elif form == 1:
        b, c = rng.randint(2, 6), rng.randint(3, 9)
        a = b * c + rng.randint(5, 40)
        question = (
            f"{name} has {a} dollars and buys {b} tickets at {c} dollars each. "
            f"How many dollars does {name} have left?"
        )
        answer = a - b * c
    elif form == 2:
        a, b, c = rng.randint(3, 9), rng.randint(2, 7), rng.randint(2, 7)
        question = (
            f"{a} children each bring {b} apples and {c} pears. How many pieces of fruit "
            "do they bring in all?"
        )
        answer = a * (b + c)
    else:
        a, b = rng.randint(4, 12), rng.randint(5, 15)
        c = rng.randint(2, a * b // 2)
        question = (
            f"A train has {a} cars with {b} seats in each car. {c} seats are empty. "
            "How many seats are taken?"
        )
        answer = a * b - c
    return Item(f"steps-{i}", "steps", f"{question} Reply with the number only.", (), str(answer))


def _factor(rng: random.Random, i: int) -> Item:
    small, one, many, factors = _UNITS[i % len(_UNITS)]
    factor = rng.choice(factors)
    n = rng.randint(3, 15)
    right = n * factor
    other = rng.choice([f for _, _, _, fs in _UNITS for f in fs if f != factor])
    wrong = [n * other, right + factor]
    choices = [str(w) for w in wrong]
    choices.insert(i % 3, str(right))
    question = f"A {one} holds {factor} {small}. How many {small} are in {n} {many}?"
    return Item(f"factor-{i}", "factor", question, tuple(choices), str(right))


def _dates(rng: random.Random, i: int) -> Item:
    if i % 2 == 0:
        start, k = rng.randrange(7), rng.randint(2, 20)
        right = _DAYS[(start + k) % 7]
        wrong = rng.sample([d for d in _DAYS if d != right], 3)
        question = f"Today is {_DAYS[start]}. What day of the week will it be in {k} days?"
    else:
        start, k = rng.randint(5, 20), rng.randint(3, 15)
        end = (start + k) % 24
        right = f"{end}:00"
        near = {(end + d) % 24 for d in (-1, 1, 2, -2, 12)} - {end}
        wrong = [f"{h}:00" for h in rng.sample(sorted(near), 3)]
        question = (
            f"A shift starts at {start}:00 on a 24-hour clock and lasts {k} hours. "
            "At what time does it end?"
        )
    choices = list(wrong)
    choices.insert(i % 4, right)
    return Item(f"dates-{i}", "dates", question, tuple(choices), right)


def _count(rng: random.Random, i: int) -> Item:
    if i % 2 == 0:
        n = rng.randint(3, 9)
        listed = rng.sample(_NOUNS, n)
        question = f"How many words are in this list: {', '.join(listed)}?"
        answer = n
    else:
        word = rng.choice(_WORDS)
        letter = rng.choice(sorted(set(word)))
        question = f'How many times does the letter "{letter}" appear in the word "{word}"?'
        answer = word.count(letter)
    return Item(f"count-{i}", "count", f"{question} Reply with the number only.", (), str(answer))


def _plural(rng: random.Random, i: int) -> Item:
    word, right, wrong = rng.choice(_PLURALS)
    choices = (right, wrong) if i % 2 == 0 else (wrong, right)
    question = f"What is the plural of {word}: {choices[0]} or {choices[1]}?"
    return Item(f"plural-{i}", "plural", question, choices, right)


#: family -> (kind, item maker); ``closed`` ones have choices, ``free`` ones not
CHECKS_FAMILIES: dict[str, tuple[str, Callable[[random.Random, int], Item]]] = {
    "steps": ("free", _steps),
    "factor": ("closed", _factor),
    "dates": ("closed", _dates),
    "count": ("free", _count),
    "plural": ("closed", _plural),
}
#: families where a tool or a check should help (the other one, the control: nothing does)
CHECKED_FAMILIES = frozenset({"steps", "factor", "dates", "count"})
#: free families whose answer is a number (graded on the reply's last number)
NUMERIC_CHECKS = frozenset({"steps", "count"})
#: completion budget of the free families
CHECKS_MAX_TOKENS = {"steps": 12, "count": 8}


def family_items(family: str, n: int, seed: int = CHECKS_SEED) -> list[Item]:
    """The first ``n`` items of ``family`` drawn with ``seed`` (a prefix of any longer set)."""
    _, make = CHECKS_FAMILIES[family]
    rng = random.Random(f"{seed}-{family}")
    return [make(rng, i) for i in range(n)]


def checks_items(n: int = CHECKS_ITEMS, families: tuple[str, ...] | None = None) -> list[Item]:
    """``n`` report items of each family (all by default), family after family."""
    names = tuple(CHECKS_FAMILIES) if families is None else families
    return [item for family in names for item in family_items(family, n)]


def selection_items(n: int, families: tuple[str, ...] | None = None) -> list[Item]:
    """``n`` items of each family drawn with the selection seed: where choices are made.

    Items equal to a report item (the same question) are dropped, so a choice never
    sees a reported question (the control's few questions may leave it short or empty:
    nothing is chosen on it).
    """
    names = tuple(CHECKS_FAMILIES) if families is None else families
    reported = {item.question for item in checks_items(families=names)}
    out: list[Item] = []
    for family in names:
        drawn = family_items(family, 4 * n, seed=SELECTION_SEED)
        out += [item for item in drawn if item.question not in reported][:n]
    return out


def items_hash(items: list[Item]) -> str:
    """sha256 of the items as JSON lines: what ``CHECKS_HASH`` freezes."""
    lines = (json.dumps(item.__dict__, sort_keys=True) for item in items)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
