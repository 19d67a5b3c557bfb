"""The questions of an evaluation: a JSONL file, one item a line, checked line by line.

Each line is ``{"question": str, "answers": [str, ...], "choices": [str, ...]?,
"family": str?, "part": "selection" | "report"?, "max_tokens": int?}``.
``answers`` are the accepted answers; ``choices``, when given, make the item a
closed question (the collaboration's answer is constrained to them); ``family``
groups items for the stratified split and the per-family rows; ``part`` pins the
item to one part of the split whatever the seed (a test set you already hold out
stays held out); ``max_tokens`` is the item's completion budget for
configurations that set none (a family whose answers need a few steps gets more
than one whose answer is a word).
The file is hostile input: its size, line count and every field are bounded, and
a bad line is an error naming its line number and field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from ._errors import BadItem

#: most bytes an items file may have
MAX_FILE_BYTES: Final = 32 * 1024 * 1024
#: most items (non-blank lines) a file may hold
MAX_ITEMS: Final = 100_000
#: most characters of a question
MAX_QUESTION_CHARS: Final = 16_000
#: most accepted answers, and most choices, per item
MAX_LIST: Final = 64
#: most characters of one answer, choice or family name
MAX_TEXT_CHARS: Final = 1_000

#: the largest completion budget an item may ask for
MAX_ITEM_TOKENS: Final = 4096
#: the parts an item may be pinned to (``_split``)
PARTS: Final = ("selection", "report")

_FIELDS: Final = frozenset({"question", "answers", "choices", "family", "part", "max_tokens"})


@attrs.frozen
class EvalItem:
    """One question with its accepted answers.

    Attributes:
        line: its 1-based line in the file (names it in messages and reports).
        question: the user's text.
        answers: the accepted answers (any one is right).
        choices: the options of a closed question; empty for a free answer.
        family: its group (``""`` when the file gave none).
        part: the part it is pinned to (``"selection"`` or ``"report"``), or None: the
            seed splits it. Not part of its identity: moving an item between parts
            reuses its journaled replies.
        max_tokens: its completion budget for configurations that set none, or None: the
            run's. Not part of its identity either: the journal keys a reply by the
            budget it ran with.
    """

    line: int
    question: str
    answers: tuple[str, ...]
    choices: tuple[str, ...] = ()
    family: str = ""
    part: str | None = None
    max_tokens: int | None = None

    @property
    def key(self) -> str:
        """A stable identity: the line and a hash of the content (the journal's key).

        An edited line gets another key, so a resumed run never reuses its old result.
        """
        return f"{self.line}:{self.content_hash}"

    @property
    def content_hash(self) -> str:
        """sha256 (first 16 hex digits) of the item's fields, line number left out."""
        body = json.dumps(
            [self.question, list(self.answers), list(self.choices), self.family],
            ensure_ascii=False,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _text(line: int, field: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise BadItem(line, field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadItem(line, field, "must not be empty")
    if len(value) > limit:
        raise BadItem(line, field, f"has {len(value)} characters; the limit is {limit}")
    return value


def _texts(line: int, field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadItem(line, field, f"must be a list of strings, got {type(value).__name__}")
    if not value:
        raise BadItem(line, field, "must hold at least one string")
    if len(value) > MAX_LIST:
        raise BadItem(line, field, f"has {len(value)} entries; the limit is {MAX_LIST}")
    return tuple(_text(line, f"{field}[{i}]", v, MAX_TEXT_CHARS) for i, v in enumerate(value))


def parse_item(line: int, data: object) -> EvalItem:
    """One decoded line as an item.

    Raises:
        BadItem: naming ``line`` and the field.
    """
    if not isinstance(data, Mapping):
        raise BadItem(line, "", f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise BadItem(line, unknown[0], f"is not an item field (fields: {sorted(_FIELDS)})")
    if "question" not in data:
        raise BadItem(line, "question", "is missing")
    if "answers" not in data:
        raise BadItem(line, "answers", "is missing")
    question = _text(line, "question", data["question"], MAX_QUESTION_CHARS)
    answers = _texts(line, "answers", data["answers"])
    choices: tuple[str, ...] = ()
    if data.get("choices") is not None:
        choices = _texts(line, "choices", data["choices"])
        if len(choices) < 2:
            raise BadItem(line, "choices", "a closed question needs at least two choices")
        if len(set(choices)) != len(choices):
            raise BadItem(line, "choices", "holds the same choice twice")
        missing = [a for a in answers if a not in choices]
        if missing:
            raise BadItem(line, "answers", f"{missing[0]!r} is not one of the choices")
    family = ""
    if data.get("family") is not None:
        family = _text(line, "family", data["family"], MAX_TEXT_CHARS)
    part = data.get("part")
    if part is not None and part not in PARTS:
        shown = repr(part)[:40] if isinstance(part, str) else type(part).__name__
        raise BadItem(line, "part", f"must be one of {list(PARTS)}, got {shown}")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= MAX_ITEM_TOKENS
    ):
        got = max_tokens if isinstance(max_tokens, int) else type(max_tokens).__name__
        raise BadItem(
            line, "max_tokens", f"must be an integer from 1 to {MAX_ITEM_TOKENS}, got {got}"
        )
    return EvalItem(line, question, answers, choices, family, part, max_tokens)


def parse_items(text: str) -> list[EvalItem]:
    """Every item of a JSONL text (blank lines skipped).

    Raises:
        BadItem: the first bad line (its number and field), too many items, or none.
    """
    items: list[EvalItem] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        if len(items) >= MAX_ITEMS:
            raise BadItem(0, "", f"holds more than {MAX_ITEMS} items")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadItem(number, "", f"is not JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise BadItem(number, "", "is nested too deeply") from None
        items.append(parse_item(number, data))
    if not items:
        raise BadItem(0, "", "holds no items")
    return items


def load_items(path: Path) -> list[EvalItem]:
    """The items of a JSONL file (UTF-8, at most ``MAX_FILE_BYTES``).

    Raises:
        BadItem: the file is too large, not UTF-8, empty, or a line is bad.
        OSError: it cannot be read.
    """
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BadItem(0, "", f"has {size} bytes; the limit is {MAX_FILE_BYTES}")
    raw = path.read_bytes()[: MAX_FILE_BYTES + 1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadItem(line, "", "is not UTF-8") from None
    return parse_items(text)
