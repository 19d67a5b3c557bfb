"""Regular expressions that clients write: compiled with a length cap, matched with a timeout.

A client's pattern can backtrack catastrophically (``^(a|aa)+$`` on a long run of
``a``), and one such match on the event loop freezes every request. So a client
pattern is compiled by :func:`compile_pattern` with the ``regex`` package (whose
matches take a ``timeout``), refused above ``MAX_PATTERN_CHARS``, and matched by
:func:`search_text` in a worker thread (``concurrent=True`` releases the GIL)
that gives up after ``MATCH_TIMEOUT_S``. A match that times out is an
``InvalidCollaboration`` naming the pattern's field: the pattern is the client's
mistake, and a condition that silently turned false would hide it.
"""

from __future__ import annotations

import functools
from typing import Final, TypeAlias

import anyio.to_thread
import regex

from ._errors import InvalidCollaboration

#: the longest pattern a client may give (characters)
MAX_PATTERN_CHARS: Final = 256
#: the longest one match of a client pattern may take on one text (seconds)
MATCH_TIMEOUT_S: Final = 0.1

#: a compiled client pattern (the ``regex`` module's: its matches can time out)
Pattern: TypeAlias = "regex.Pattern[str]"


def compile_pattern(source: object, field: str) -> Pattern:
    """``source`` compiled, or an ``InvalidCollaboration`` naming ``field`` (too long, bad)."""
    if not isinstance(source, str):
        raise InvalidCollaboration(field, "must be a string (a regular expression)")
    if len(source) > MAX_PATTERN_CHARS:
        raise InvalidCollaboration(
            field, f"the pattern is {len(source)} characters; the limit is {MAX_PATTERN_CHARS}"
        )
    try:
        return regex.compile(source)
    except regex.error as exc:
        raise InvalidCollaboration(field, f"invalid regular expression {source!r}: {exc}") from None


async def search_text(pattern: Pattern, text: str, field: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``, found off the event loop.

    Raises:
        InvalidCollaboration: naming ``field``, when the match ran past ``MATCH_TIMEOUT_S``.
    """
    search = functools.partial(pattern.search, text, concurrent=True, timeout=MATCH_TIMEOUT_S)
    try:
        return await anyio.to_thread.run_sync(search) is not None
    except TimeoutError:
        raise InvalidCollaboration(
            field,
            f"the pattern took over {MATCH_TIMEOUT_S * 1000:.0f} ms on a {len(text)}-character "
            "text (catastrophic backtracking): simplify it",
        ) from None
