"""Hypothesis strategies shared by the whole test suite (one section per area)."""

from __future__ import annotations

from hypothesis import strategies as st

# --- engine bridge: handles, prompts, chat ---------------------------------------

#: words of chat contents: no leading/trailing whitespace (templates may trim)
chat_words = st.sampled_from(["alpha", "beta", "gamma", "the", "plan", "is", "fine", "?", ",", "42"])


@st.composite
def chat_texts(draw: st.DrawFn, min_words: int = 1, max_words: int = 8) -> str:
    """A short chat content: words joined by single spaces (punctuation glued on)."""
    words = draw(st.lists(chat_words, min_size=min_words, max_size=max_words))
    text = ""
    for w in words:
        text += w if (not text or w in "?,") else " " + w
    return text


def token_lists(lo: int = 10, hi: int = 13, min_size: int = 0, max_size: int = 9) -> st.SearchStrategy[list[int]]:
    """Token ids from a tiny range, so that prompts share prefixes (and blocks) often."""
    return st.lists(st.integers(lo, hi), min_size=min_size, max_size=max_size)


#: one request of a cache program: built on an earlier handle (index modulo what exists)
cache_ops = st.fixed_dictionaries(
    {
        "base": st.integers(0, 10_000),
        "suffix": token_lists(),
        "adapter": st.sampled_from([None, "a", "b"]),
        "out": token_lists(),
        "max_tokens": st.integers(1, 12),
        "abort_after": st.none() | st.integers(1, 6),
    }
)

#: a cache program: engine geometry, root contexts and the requests to run in order
cache_programs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 3, 4]),
        "num_blocks": st.integers(12, 24),
        "roots": st.lists(token_lists(min_size=1, max_size=14), min_size=1, max_size=3),
        "ops": st.lists(cache_ops, min_size=1, max_size=14),
    }
)

# --- mailbox / actors --------------------------------------------------------------

#: virtual seconds a handler works (mostly instant, sometimes long enough to back up a mailbox)
actor_work = st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.5, 2.0])


def _actor_op(op: str, **fields: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries({"op": st.just(op), **fields})


#: one operation of an actor program; actors/scopes are picked by index modulo what exists
actor_ops = st.one_of(
    _actor_op(
        "spawn",
        place=st.sampled_from(["root", "scope", "child"]),
        index=st.integers(0, 50),
        restart=st.sampled_from(["permanent", "transient", "temporary"]),
        capacity=st.integers(1, 4),
        policy=st.sampled_from(["block", "block", "fail", "dead_letter"]),
        strategy=st.sampled_from(["one_for_one", "one_for_all"]),
    ),
    _actor_op("tell", target=st.integers(0, 50), sender=st.integers(0, 2), work=actor_work),
    _actor_op("tell", target=st.integers(0, 50), sender=st.integers(0, 2), work=actor_work),
    _actor_op(
        "ask",
        target=st.integers(0, 50),
        timeout=st.sampled_from([0.05, 0.3, 1.0, 5.0]),
        work=actor_work,
    ),
    _actor_op("crash", target=st.integers(0, 50)),
    _actor_op("stop", target=st.integers(0, 50), drain=st.booleans()),
    _actor_op("generate", target=st.integers(0, 50), tokens=st.integers(1, 20)),
    _actor_op("open_scope"),
    _actor_op("cancel_scope", index=st.integers(0, 10)),
    _actor_op("close_scope", index=st.integers(0, 10)),
    _actor_op("advance", seconds=st.sampled_from([0.01, 0.1, 0.5, 1.0, 3.0])),
)

#: a whole program, generated up front and then run inside one event loop
actor_programs = st.lists(actor_ops, min_size=1, max_size=30)

# --- collaboration -------------------------------------------------------------------

VOTE_CHOICES = ("yes", "no", "maybe")


@st.composite
def vote_sequences(draw: st.DrawFn, *, free_text: bool = False) -> tuple[tuple[str, ...] | None, list[str]]:
    """(choices or None, the voters' normalised answers in arrival order; "" = abstain)."""
    n = draw(st.integers(1, 11))
    if free_text:
        pool = draw(st.lists(st.text("abc", min_size=1, max_size=2), min_size=1, max_size=4, unique=True))
        answers = draw(st.lists(st.sampled_from([*pool, ""]), min_size=n, max_size=n))
        return None, answers
    choices = VOTE_CHOICES[: draw(st.integers(2, 3))]
    answers = draw(st.lists(st.sampled_from([*choices, ""]), min_size=n, max_size=n))
    return choices, answers

_ = st  # keep the import when a section is empty
