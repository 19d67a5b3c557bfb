"""Whether a reply answers an item: the accepted answers, read as the bench reads them.

Small models answer in sentences ("The capital of Italy is Rome."), so a reply is
right when it is an accepted answer (normalised: case, punctuation and an
"Answer:" line ignored, as a vote compares answers), or

- where every accepted answer is a number: when the reply's last number equals
  one of them ("3 + 1 = 4" answers 4);
- otherwise: when it names an accepted answer as whole words and no other choice
  of the item (a reply naming two choices is wrong).

``names_in`` is the benchmark's whole-word reading too (``bench/_quality_tasks``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from ..collab import normalize_answer

#: a number as a reply writes it (the pattern of ``answer.extract: number``)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def names_in(reply: str, phrase: str) -> bool:
    """Whether the normalised ``reply`` holds the normalised ``phrase`` as whole words."""
    want = normalize_answer(phrase).split()
    got = normalize_answer(reply).split()
    return bool(want) and any(
        got[i : i + len(want)] == want for i in range(len(got) - len(want) + 1)
    )


def as_number(text: str) -> Decimal | None:
    """``text`` as a number when it is one (signs, thousands commas and decimals read)."""
    cleaned = text.strip().replace(",", "")
    if not cleaned or _NUMBER.fullmatch(text.strip()) is None:
        return None
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def last_number(reply: str) -> Decimal | None:
    """The last number written in ``reply``, or None."""
    found = _NUMBER.findall(reply)
    return as_number(found[-1]) if found else None


def is_correct(reply: str, answers: Sequence[str], choices: Sequence[str] = ()) -> bool:
    """Whether ``reply`` is right for an item with these accepted ``answers`` and ``choices``."""
    accepted = {normalize_answer(a) for a in answers}
    if normalize_answer(reply) in accepted - {""}:
        return True
    numbers = [as_number(a) for a in answers]
    if all(n is not None for n in numbers):
        got = last_number(reply)
        return got is not None and got in numbers
    others = [c for c in choices if normalize_answer(c) not in accepted]
    return any(names_in(reply, a) for a in answers) and not any(names_in(reply, o) for o in others)
