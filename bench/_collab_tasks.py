"""Pure parts of the collaboration benchmark: tasks, contexts, answers, statistics.

Nothing here touches an engine, so it is unit-tested fast
(``tests/test_bench_collab.py``) and imported by the peers' virtual
environment too (standard library only).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BLOCK = 128  # vLLM's KV block size on CPU

_CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Russia": "Moscow",
    "England": "London",
    "Greece": "Athens",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Ireland": "Dublin",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Poland": "Warsaw",
    "China": "Beijing",
    "Canada": "Ottawa",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Cuba": "Havana",
}
_OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "up": "down",
    "day": "night",
    "fast": "slow",
    "happy": "sad",
    "open": "closed",
    "light": "dark",
    "early": "late",
    "full": "empty",
    "old": "new",
    "wet": "dry",
    "hard": "soft",
    "loud": "quiet",
    "rich": "poor",
}
_SOUNDS = {
    "dog": "bark",
    "cat": "meow",
    "cow": "moo",
    "duck": "quack",
    "sheep": "baa",
    "lion": "roar",
    "snake": "hiss",
    "bee": "buzz",
    "owl": "hoot",
    "horse": "neigh",
}
_COLORS = {
    "grass": "green",
    "the sky on a clear day": "blue",
    "snow": "white",
    "coal": "black",
    "a ripe banana": "yellow",
    "a ripe tomato": "red",
    "an orange": "orange",
    "a lemon": "yellow",
    "milk": "white",
    "a strawberry": "red",
}


@dataclass(frozen=True)
class Task:
    """One multiple-choice question with a verifiable answer."""

    id: int
    kind: str
    question: str
    choices: tuple[str, ...]
    answer: str

    def prompt(self) -> str:
        """The question as the user turn: the question, then the choices."""
        return f"{self.question}\nChoices: {', '.join(self.choices)}."


def _mc(rng: random.Random, correct: str, pool: Sequence[str], k: int) -> tuple[str, ...]:
    others = [p for p in dict.fromkeys(pool) if p != correct]
    picked = [correct, *rng.sample(others, k - 1)]
    rng.shuffle(picked)
    return tuple(picked)


def _arith(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        q, ans = f"What is {a} + {b}?", a + b
    else:
        a, b = max(a, b), min(a, b)
        q, ans = f"What is {a} - {b}?", a - b
    wrong = [ans + d for d in (-2, -1, 1, 2) if ans + d >= 0]
    return q, str(ans), _mc(rng, str(ans), [str(w) for w in wrong], 3)


def _compare(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    a, b = rng.sample(range(2, 100), 2)
    if rng.random() < 0.5:
        return f"Which number is larger, {a} or {b}?", str(max(a, b)), (str(a), str(b))
    return f"Which number is smaller, {a} or {b}?", str(min(a, b)), (str(a), str(b))


def _fact(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    kind = rng.randrange(4)
    if kind == 0:
        country = rng.choice(sorted(_CAPITALS))
        ans = _CAPITALS[country]
        return f"What is the capital of {country}?", ans, _mc(rng, ans, list(_CAPITALS.values()), 4)
    if kind == 1:
        word = rng.choice(sorted(_OPPOSITES))
        ans = _OPPOSITES[word]
        return (
            f"What is the opposite of '{word}'?",
            ans,
            _mc(rng, ans, list(_OPPOSITES.values()), 4),
        )
    if kind == 2:
        animal = rng.choice(sorted(_SOUNDS))
        ans = _SOUNDS[animal]
        return f"What sound does a {animal} make?", ans, _mc(rng, ans, list(_SOUNDS.values()), 4)
    thing = rng.choice(sorted(_COLORS))
    ans = _COLORS[thing]
    return f"What color is {thing}?", ans, _mc(rng, ans, list(_COLORS.values()), 4)


def task_set(n: int = 240, seed: int = 1234) -> list[Task]:
    """``n`` questions (arithmetic, comparisons, template facts), the same for a given seed."""
    rng = random.Random(seed)
    makers = (("arithmetic", _arith), ("comparison", _compare), ("fact", _fact))
    out = []
    for i in range(n):
        kind, make = makers[i % len(makers)]
        question, answer, choices = make(rng)
        out.append(Task(i, kind, question, choices, answer))
    return out


def context_document(seed: int, target_words: int = 1200) -> str:
    """A ~2 000-token synthetic report, different for every seed from its first line.

    The first line carries the seed so that contexts of different repetitions
    share no KV block (every repetition starts cold on every engine).
    """
    rng = random.Random(seed)
    cities = sorted(_CAPITALS.values())
    goods = ["apples", "copper", "wool", "tea", "salt", "rice", "glass", "paper", "steel", "cotton"]
    lines = [f"Logistics report {seed:08d} (reference RX-{rng.randrange(10**6):06d})."]
    words = 0
    day = 1
    while words < target_words:
        city, good = rng.choice(cities), rng.choice(goods)
        qty, other = rng.randint(10, 990), rng.choice(cities)
        line = (
            f"Day {day}: the depot in {city} received {qty} crates of {good}; "
            f"{rng.randint(1, qty)} crates were sent on to {other} the same week."
        )
        lines.append(line)
        words += len(line.split())
        day += 1
    return "\n".join(lines)


def workload_context(seed: int, task: Task, target_words: int = 1200) -> str:
    """The shared task context of a workload run: the report, then the question."""
    return f"{context_document(seed, target_words)}\n\nQuestion: {task.prompt()}"


_WORD = re.compile(r"[^\w+-]+")


def _canon(text: str) -> str:
    return _WORD.sub(" ", text.replace("<|im_end|>", "").lower()).strip()


def extract_choice(text: str, choices: Sequence[str]) -> str:
    """The choice a model answer names ("" when none): an 'Answer:' line first, else the text.

    The first choice named as a whole word wins (case and punctuation
    insensitive), mirroring how microagent normalises constrained answers.
    """
    match = re.search(r"answer\s*(?:is)?\s*[:=]?\s*(.+)", text, re.IGNORECASE)
    candidates = [match.group(1), text] if match else [text]
    for candidate in candidates:
        canon = _canon(candidate)
        if canon in {_canon(c) for c in choices}:
            return next(c for c in choices if _canon(c) == canon)
        words = canon.split()
        hits = [(words.index(_canon(c)), c) for c in choices if _canon(c) in words]
        if hits:
            return min(hits)[1]
    return ""


def is_correct(text: str, task: Task) -> bool:
    """Whether a model answer names the task's correct choice."""
    return extract_choice(text, task.choices) == task.answer


def majority(answers: Iterable[str], choices: Sequence[str]) -> str:
    """Majority answer with microagent's tie rule (most votes, then the first listed choice)."""
    counts: dict[str, int] = {}
    for a in answers:
        if a:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return ""
    order = {c: i for i, c in enumerate(choices)}
    return min(counts, key=lambda a: (-counts[a], order.get(a, len(order))))


def ideal_prefill(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]], block: int = BLOCK
) -> int:
    """Prompt tokens an ideal engine computes for these requests, in submission order.

    Each request is (prompt ids, output ids). A prompt is served from cache up
    to the longest prefix it shares with anything computed before it (earlier
    prompts, and earlier prompt + output sequences: decoding caches blocks too),
    in whole blocks, and never its last token (vLLM always recomputes it). So
    the shared context counts once and every role pays for its own suffix,
    rounded up to whole blocks.
    """
    seen: list[Sequence[int]] = []
    total = 0
    for prompt, output in requests:
        shared = max((common_prefix(prompt, s) for s in seen), default=0)
        shared = min(shared, len(prompt) - 1) // block * block if prompt else 0
        total += len(prompt) - shared
        seen.append(prompt)
        if output:
            seen.append([*prompt, *output[:-1]])  # the last sampled token has no KV
    return total


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def time_split(
    intervals: Sequence[tuple[float, float | None, float]], start: float, end: float
) -> dict[str, float]:
    """Partition a run's wall time by what the engine requests were doing.

    ``intervals`` are (submitted, first token or None, finished) per request.
    A moment counts as ``decode`` when any request is past its first token,
    else ``prefill`` (queued or prefilling) when any request is in flight,
    else ``orchestration`` (no request in flight: client code, HTTP, Python).
    """
    points = sorted({start, end, *(t for iv in intervals for t in iv if t is not None)})
    out = {"prefill": 0.0, "decode": 0.0, "orchestration": 0.0}
    for a, b in itertools.pairwise(points):
        if b <= start or a >= end:
            continue
        mid = (a + b) / 2
        decoding = any(ft is not None and ft <= mid < fin for _, ft, fin in intervals)
        waiting = any(sub <= mid < (ft if ft is not None else fin) for sub, ft, fin in intervals)
        key = "decode" if decoding else "prefill" if waiting else "orchestration"
        out[key] += b - a
    return out


def ceil_blocks(tokens: int, block: int = BLOCK) -> int:
    """``tokens`` rounded up to whole blocks."""
    return -(-tokens // block) * block
