"""Task families of ``bench/quality.py``: closed and free questions generated from a seed.

Nothing here touches an engine (``tests/test_bench_quality.py`` runs it fast).
Each family is deterministic for a seed (its own ``random.Random`` seeded by the
seed and the family's name; a longer set extends a shorter one) and balanced.
Closed families (``PROBED``) are balanced so that an answer-blind bias scores
chance: on two-choice families the right answer is the first canonical choice
on even items and the second on odd ones; on yes/no families half are "yes".

- ``capital``: "Is <city> the capital of <country>?" (yes/no, closed factual);
- ``larger``: "Which number is larger, a or b?" (numeric comparison);
- ``sum``: "What is a + b?" with the sum and one near miss (arithmetic with choices);
- ``sentiment``: a one-sentence review, positive or negative (short classification);
- ``category``: "Is a <word> an animal or a fruit?" (short classification);
- ``opposite``: "What is the opposite of <word>?" with the antonym and another word;
- ``temperature``: "Is <thing> hot or cold?" (short classification);
- ``size``: "Which is bigger, a <big thing> or a <small thing>?" (comparison, world knowledge);
- ``colour``: "Is <word> a colour or an animal?" (short classification);
- ``capital_of``, ``country_of``, ``sound``, ``colour_of``: knowledge the model shows in
  free answers, asked closed ("What is the capital of <country>?", "<city> is the
  capital of which country?", "What sound does a <animal> make?", "What colour is
  <thing>?"), the right value against another of the table starting with another letter.

Free-answer families (``FREE``: no choices, ``Item.choices == ()``, chance 0;
``grade`` scores an answer):

- ``capital_free``: "What is the capital of <country>? Reply with the city's name
  only." — every country equally often (a shuffled deck per 20 items); right when
  the reply names the city and no other capital (the model answers in sentences);
- ``country_free``: "<city> is the capital of which country? Reply with the country's
  name only." — the reverse question, every capital equally often; right when the
  reply names the country and no other (``London`` must be answered ``England``);
- ``sum_free``: "What is a + b? Reply with the number only." with a, b in 1..20 —
  half the items need a carry (units digits summing to 10 or more), on odd items;
  right when the reply's last number is the sum ("3 + 1 = 4");
- ``extract``: a sentence naming a person's name, age and city (four templates in
  turn, names and cities from decks) to be returned as JSON (``EXTRACT_SCHEMA``,
  which the request's validator carries); graded for schema validity (``valid``)
  and for the share of the three fields right (``fields``); right when all three are.

Each family has a kind (``kind``: ``closed``, ``free`` or ``json``), which decides
the methods that fit it, and free families a completion budget (``MAX_TOKENS``).

The closed families the bench reports by default (``FAMILIES``; ``PROBED`` has all) are
those where the published configuration was chosen; at 200 items a single call is above
chance on none of them, nor on the knowledge families (BENCHMARKS.md says so).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from _accuracy_tasks import Item
from _collab_tasks import _CAPITALS, _COLORS, _OPPOSITES, _SOUNDS
from _quality_report_families import (
    NUMERIC_REPORT,
    REPORT_FAMILIES,
    REPORT_MAX_TOKENS,
    report_family_items,
)
from microagent.collab._validators import extract_json, json_schema_validator
from microagent.evaluation import names_in

__all__ = [
    "EXTRACT_SCHEMA",
    "FAMILIES",
    "FREE",
    "MAX_TOKENS",
    "PROBED",
    "family_items",
    "grade",
    "kind",
    "quality_set",
]

_T = TypeVar("_T")

_GOOD = ("wonderful", "excellent", "delightful", "great", "lovely", "superb", "fantastic")
_BAD = ("terrible", "awful", "boring", "horrible", "dreadful", "disappointing", "bad")
_THINGS = ("movie", "meal", "book", "hotel", "concert", "game", "service", "trip")
_SENTENCES = (
    "The {thing} was {word}.",
    "What a {word} {thing}!",
    "I found the {thing} {word}.",
    "Honestly, the {thing} was {word}.",
)
_ANIMALS = ("dog", "cat", "horse", "cow", "lion", "tiger", "rabbit", "sheep", "mouse", "bear")
_FRUITS = ("apple", "banana", "orange", "grape", "mango", "pear", "cherry", "lemon", "peach")
_HOT = ("fire", "the sun", "lava", "an oven", "boiling water", "a flame", "a desert at noon")
_COLD = ("ice", "snow", "a freezer", "a glacier", "frost", "an iceberg", "a snowman")
_BIG = ("elephant", "whale", "horse", "bus", "house", "mountain", "giraffe", "truck")
_SMALL = ("mouse", "ant", "coin", "bee", "pencil", "button", "grape", "spoon")
_COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "brown")


def _two(rng: random.Random, i: int, right: str, wrong: str) -> tuple[str, str]:
    """The two choices, the right one first on even items and second on odd ones."""
    del rng
    return (right, wrong) if i % 2 == 0 else (wrong, right)


def _capital(rng: random.Random, i: int) -> Item:
    country = rng.choice(sorted(_CAPITALS))
    city = _CAPITALS[country]
    true = i % 2 == 0
    if not true:
        city = rng.choice(sorted(c for c in _CAPITALS.values() if c != city))
    question = f"Is {city} the capital of {country}?"
    return Item(f"capital-{i}", "capital", question, ("yes", "no"), "yes" if true else "no")


def _larger(rng: random.Random, i: int) -> Item:
    a, b = rng.sample(range(2, 100), 2)
    big, small = str(max(a, b)), str(min(a, b))
    choices = _two(rng, i, big, small)
    question = f"Which number is larger, {choices[0]} or {choices[1]}?"
    return Item(f"larger-{i}", "larger", question, choices, big)


def _sum(rng: random.Random, i: int) -> Item:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    right = a + b
    wrong = right + rng.choice((-2, -1, 1, 2))
    choices = _two(rng, i, str(right), str(wrong))
    return Item(f"sum-{i}", "sum", f"What is {a} + {b}?", choices, str(right))


def _sentiment(rng: random.Random, i: int) -> Item:
    positive = (i // 2) % 2 == 0
    word = rng.choice(_GOOD if positive else _BAD)
    text = rng.choice(_SENTENCES).format(thing=rng.choice(_THINGS), word=word)
    answer = "positive" if positive else "negative"
    other = "negative" if positive else "positive"
    question = f'Is this review positive or negative? "{text}"'
    return Item(f"sentiment-{i}", "sentiment", question, _two(rng, i, answer, other), answer)


def _category(rng: random.Random, i: int) -> Item:
    animal = (i // 2) % 2 == 0
    word = rng.choice(_ANIMALS if animal else _FRUITS)
    answer = "animal" if animal else "fruit"
    other = "fruit" if animal else "animal"
    choices = _two(rng, i, answer, other)
    question = f"Is a {word} an animal or a fruit?"
    return Item(f"category-{i}", "category", question, choices, answer)


def _opposite(rng: random.Random, i: int) -> Item:
    word = rng.choice(sorted(_OPPOSITES))
    right = _OPPOSITES[word]
    wrong = rng.choice(sorted(w for w in _OPPOSITES if w not in (word, right)))
    choices = _two(rng, i, right, wrong)
    return Item(f"opposite-{i}", "opposite", f"What is the opposite of {word}?", choices, right)


def _recall(
    family: str, table: dict[str, str], question: str
) -> Callable[[random.Random, int], Item]:
    """A knowledge family: ``question`` about a key of ``table``, its value against another.

    The wrong choice is another value of the table that starts with another letter, so
    the two choices differ in their first token (what a one-token soft vote reads).
    """

    def make(rng: random.Random, i: int) -> Item:
        key = rng.choice(sorted(table))
        right = table[key]
        wrong = rng.choice(sorted({v for v in table.values() if v[0] != right[0]}))
        return _binary(family, i, question.format(key), right, wrong, rng)

    return make


_COUNTRIES = {city: country for country, city in _CAPITALS.items()}


def _binary(family: str, i: int, question: str, right: str, wrong: str, rng: random.Random) -> Item:
    return Item(f"{family}-{i}", family, question, _two(rng, i, right, wrong), right)


def _temperature(rng: random.Random, i: int) -> Item:
    hot = (i // 2) % 2 == 0
    thing = rng.choice(_HOT if hot else _COLD)
    right, wrong = ("hot", "cold") if hot else ("cold", "hot")
    return _binary("temperature", i, f"Is {thing} hot or cold?", right, wrong, rng)


def _size(rng: random.Random, i: int) -> Item:
    big, small = rng.choice(_BIG), rng.choice(_SMALL)
    first, second = (big, small) if i % 2 == 0 else (small, big)
    return _binary("size", i, f"Which is bigger, a {first} or a {second}?", big, small, rng)


def _colour(rng: random.Random, i: int) -> Item:
    colour = (i // 2) % 2 == 0
    word = rng.choice(_COLOURS if colour else _ANIMALS)
    right, wrong = ("colour", "animal") if colour else ("animal", "colour")
    return _binary("colour", i, f"Is {word} a colour or an animal?", right, wrong, rng)


#: every family the bench can generate, by name
PROBED: dict[str, Callable[[random.Random, int], Item]] = {
    "capital": _capital,
    "larger": _larger,
    "sum": _sum,
    "sentiment": _sentiment,
    "category": _category,
    "opposite": _opposite,
    "temperature": _temperature,
    "size": _size,
    "colour": _colour,
    "capital_of": _recall("capital_of", _CAPITALS, "What is the capital of {}?"),
    "country_of": _recall("country_of", _COUNTRIES, "{} is the capital of which country?"),
    "sound": _recall("sound", _SOUNDS, "What sound does a {} make?"),
    "colour_of": _recall("colour_of", _COLORS, "What colour is {}?"),
}
#: the families reported by default (where the published configuration was chosen; a
#: single call is above chance on none of them at 200 items: see the module docstring)
FAMILIES: tuple[str, ...] = ("capital", "opposite", "sum", "category", "temperature")


_NAMES = ("Maria", "John", "Aiko", "Pedro", "Fatima", "Lars", "Chen", "Olga", "Omar", "Emma")
_CITIES = ("Lisbon", "Paris", "Tokyo", "Cairo", "Berlin", "Madrid", "Oslo", "Lima", "Dublin")
_PERSON = (
    "{name} is {age} years old and lives in {city}.",
    "{name}, aged {age}, lives in {city}.",
    "Living in {city}, {name} has just turned {age}.",
    "{name} ({age}) moved to {city} last year.",
)
_FIELDS = ("name", "age", "city")
#: what an ``extract`` answer must be (the validator of the request checks it)
EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": list(_FIELDS),
    "additionalProperties": False,
}
_EXTRACT_VALID = json_schema_validator(EXTRACT_SCHEMA)


def _dealt(rng: random.Random, pool: Sequence[_T], n: int) -> list[_T]:
    """``n`` draws from ``pool`` dealt as decks: each ``len(pool)`` draws hold every element
    once, in an order shuffled by ``rng`` (so ``n`` draws are a prefix of more)."""
    out: list[_T] = []
    while len(out) < n:
        deck = list(pool)
        rng.shuffle(deck)
        out += deck
    return out[:n]


def _recall_free(
    family: str, table: dict[str, str], question: str
) -> Callable[[str, int], list[Item]]:
    """A free knowledge family: ``question`` about every key of ``table`` equally often
    (dealt as decks), answered by its value."""

    def make(key: str, n: int) -> list[Item]:
        keys = _dealt(random.Random(key), sorted(table), n)
        return [
            Item(f"{family}-{i}", family, question.format(k), (), table[k])
            for i, k in enumerate(keys)
        ]

    return make


def _sum_free(key: str, n: int) -> list[Item]:
    rng = random.Random(key)
    out = []
    for i in range(n):
        carry = i % 2 == 1
        while True:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            if (a % 10 + b % 10 >= 10) == carry:
                break
        question = f"What is {a} + {b}? Reply with the number only."
        out.append(Item(f"sum_free-{i}", "sum_free", question, (), str(a + b)))
    return out


def _extract(key: str, n: int) -> list[Item]:
    names = _dealt(random.Random(f"{key}-name"), _NAMES, n)
    cities = _dealt(random.Random(f"{key}-city"), _CITIES, n)
    ages = random.Random(f"{key}-age")
    out = []
    for i, (name, city) in enumerate(zip(names, cities, strict=True)):
        age = ages.randint(18, 79)
        sentence = _PERSON[i % len(_PERSON)].format(name=name, age=age, city=city)
        question = (
            f'Extract the person\'s name, age and city from this sentence: "{sentence}" '
            'Reply with JSON only, in the form {"name": "...", "age": 0, "city": "..."}.'
        )
        answer = json.dumps({"name": name, "age": age, "city": city})
        out.append(Item(f"extract-{i}", "extract", question, (), answer))
    return out


#: free-answer families: name -> the first ``n`` items for a seed key
FREE: dict[str, Callable[[str, int], list[Item]]] = {
    "capital_free": _recall_free(
        "capital_free", _CAPITALS, "What is the capital of {}? Reply with the city's name only."
    ),
    "country_free": _recall_free(
        "country_free",
        _COUNTRIES,
        "{} is the capital of which country? Reply with the country's name only.",
    ),
    "sum_free": _sum_free,
    "extract": _extract,
}
#: free families whose answer is a number (a client asking them can send answer.extract)
NUMERIC = frozenset({"sum_free"})
#: completion budget per free family (a city or a number; a short JSON object)
MAX_TOKENS: dict[str, int] = {
    "capital_free": 12,
    "country_free": 12,
    "sum_free": 12,
    "extract": 48,
    **REPORT_MAX_TOKENS,
}


def kind(family: str) -> str:
    """A family's answer form: ``closed`` (one of its choices), ``free`` (a short text) or
    ``json`` (an object to ``EXTRACT_SCHEMA``): it decides which methods fit the family.
    Report families (``_quality_report_families``) say their own."""
    if family in REPORT_FAMILIES:
        return REPORT_FAMILIES[family][0]
    if family in PROBED:
        return "closed"
    if family not in FREE:
        raise KeyError(f"unknown family {family!r}; known: {[*PROBED, *FREE]}")
    return "json" if family == "extract" else "free"


def _names_only(reply: str, truth: str, others: Sequence[str]) -> bool:
    """Whether the normalised reply names ``truth`` (as whole words) and none of ``others``.

    The default model answers in sentences ("The capital of Italy is Rome."), so the
    reply is read for the name it gives, not its first words; a reply naming two
    capitals is wrong.
    """

    return names_in(reply, truth) and not any(names_in(reply, o) for o in others if o != truth)


def _last_number(reply: str, truth: str) -> bool:
    """Whether the last integer of the reply is ``truth`` ("3 + 1 = 4" answers 4)."""
    numbers = re.findall(r"\d+", reply)
    return bool(numbers) and numbers[-1] == truth


def grade(item: Item, answer: str) -> dict[str, Any]:
    """How ``answer`` scores on ``item``: ``correct``; on ``extract`` also ``valid`` (JSON
    valid against ``EXTRACT_SCHEMA``) and ``fields`` (the share of the fields right, read
    from any JSON object in the answer, valid or not)."""
    if item.choices:
        return {"correct": answer == item.answer}
    if item.family == "sum_free" or item.family in NUMERIC_REPORT:
        return {"correct": _last_number(answer, item.answer)}
    if item.family == "country_free":
        return {"correct": _names_only(answer, item.answer, sorted(_CAPITALS))}
    if kind(item.family) != "json":
        return {"correct": _names_only(answer, item.answer, sorted(set(_CAPITALS.values())))}
    truth = json.loads(item.answer)
    valid = _EXTRACT_VALID(answer) is None
    try:
        got = json.loads(extract_json(answer))
    except json.JSONDecodeError:
        got = None
    if not isinstance(got, dict):
        got = {}
    right = [_field_right(got.get(f), truth[f]) for f in _FIELDS]
    return {"correct": all(right), "valid": valid, "fields": sum(right) / len(right)}


def _field_right(got: object, want: object) -> bool:
    if isinstance(want, int):  # an age: a JSON integer, not a string or a bool
        return isinstance(got, int) and not isinstance(got, bool) and got == want
    return isinstance(got, str) and got.strip().lower() == str(want).lower()


def family_items(family: str, n: int, seed: int = 14) -> list[Item]:
    """The first ``n`` items of ``family`` for ``seed`` (a prefix of any longer set); a report
    family's come from its own frozen seed (``REPORT_SEED``), whatever ``seed`` is."""
    if family in REPORT_FAMILIES:
        return report_family_items(family, n)
    if family in FREE:
        return FREE[family](f"{seed}-{family}", n)
    rng = random.Random(f"{seed}-{family}")
    return [PROBED[family](rng, i) for i in range(n)]


def quality_set(n: int, seed: int = 14, families: tuple[str, ...] = FAMILIES) -> list[Item]:
    """``n`` items of each family, family after family."""
    return [item for family in families for item in family_items(family, n, seed)]
