"""Task families of ``bench/quality.py``: closed questions generated from a seed.

Nothing here touches an engine (``tests/test_bench_quality.py`` runs it fast).
Each family is deterministic for a seed (its own ``random.Random`` seeded by the
seed and the family's name) and balanced so that an answer-blind bias scores
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
- ``colour``: "Is <word> a colour or an animal?" (short classification).

The families the bench reports are those where a single call is above chance
(``bench/quality.py`` measured it; ``FAMILIES`` keeps them, ``PROBED`` all).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from _accuracy_tasks import Item
from _collab_tasks import _CAPITALS, _OPPOSITES

__all__ = ["FAMILIES", "PROBED", "family_items", "quality_set"]

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
}
#: the families reported (a single call above chance on each; see the module docstring)
FAMILIES: tuple[str, ...] = ("capital", "opposite", "sum", "category", "temperature")


def family_items(family: str, n: int, seed: int = 14) -> list[Item]:
    """The first ``n`` items of ``family`` for ``seed`` (a prefix of any longer set)."""
    rng = random.Random(f"{seed}-{family}")
    return [PROBED[family](rng, i) for i in range(n)]


def quality_set(n: int, seed: int = 14, families: tuple[str, ...] = FAMILIES) -> list[Item]:
    """``n`` items of each family, family after family."""
    return [item for family in families for item in family_items(family, n, seed)]
