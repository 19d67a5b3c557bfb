"""The retained-handle index answers exactly what a scan over every handle answers.

The scan it replaces is the reference: for any sequence of retains, releases and
re-retains (handles sharing prefixes, salts and adapters, as sessions do), the
longest extended handle and the covered prefix agree with it, and a forced hash
collision is verified on the tokens instead of trusted.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings
from microagent.engine_bridge import AdapterRef, KVHandle, _retained_index
from microagent.engine_bridge._retained_index import RetainedIndex

BLOCK = 4
ADAPTERS = (None, AdapterRef("a", "/a"))


def handle(tokens: tuple[int, ...], adapter: AdapterRef | None = None) -> KVHandle:
    return KVHandle(model="m", token_ids=tokens, adapter=adapter)


def scan_extended(
    entries: dict[str, tuple[str | None, KVHandle]], prompt: KVHandle, salt: str | None
) -> int:
    """The scan's answer, as a length: the longest whole-block handle ``prompt`` extends."""
    longest = 0
    for s, h in entries.values():
        n = len(h) // BLOCK * BLOCK
        if (
            n > longest
            and len(prompt) > n
            and s == salt
            and h.adapter == prompt.adapter
            and h.common_prefix_length(prompt) >= n
        ):
            longest = n
    return longest


def scan_covered(
    entries: dict[str, tuple[str | None, KVHandle]], prompt: KVHandle, salt: str | None
) -> int:
    limit = (len(prompt) - 1) // BLOCK * BLOCK
    best = max(
        (
            h.common_prefix_length(prompt)
            for s, h in entries.values()
            if h.adapter == prompt.adapter and s == salt
        ),
        default=0,
    )
    return min(best // BLOCK * BLOCK, limit)


# A shared "system prompt" and a few branches: prefixes collide the way sessions' do.
tokens = st.builds(
    lambda base, tail: (0, 1, 2, 3, 4, 5, 6, 7)[:base] + tuple(tail),
    st.integers(0, 8),
    st.lists(st.integers(0, 3), max_size=14),
)
ops = st.lists(
    st.tuples(
        st.sampled_from(("put", "pop", "ask")),
        st.sampled_from(("k0", "k1", "k2", "k3")),
        tokens,
        st.sampled_from((None, "tenant")),
        st.sampled_from(ADAPTERS),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_index_agrees_with_a_scan(script: list) -> None:  # type: ignore[type-arg]
    index = RetainedIndex(BLOCK)
    ref: dict[str, tuple[str | None, KVHandle]] = {}
    for op, key, toks, salt, adapter in script:
        h = handle(toks, adapter)
        if op == "put":
            index.put(key, salt, h)
            ref[key] = (salt, h)
        elif op == "pop":
            index.pop(key)
            ref.pop(key, None)
        elif toks:
            got = index.extended_key(h, salt)
            want = scan_extended(ref, h, salt)
            if got is None:
                assert want == 0
            else:
                s, found = ref[got]
                n = len(found) // BLOCK * BLOCK
                assert n == want and s == salt and found.adapter == adapter
                assert found.common_prefix_length(h) >= n
            assert index.covered(h, salt) == scan_covered(ref, h, salt)
        assert sorted(index) == sorted(ref) and len(index) == len(ref)
    index.clear()
    assert not index and not index._prefixes and not index._ends


def test_a_hash_collision_is_checked_on_the_tokens(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every block hashing alike must not make unrelated prompts look cached."""
    monkeypatch.setattr(_retained_index, "hash", lambda _: 7, raising=False)
    index = RetainedIndex(BLOCK)
    index.put("s", None, handle((1, 1, 1, 1, 2, 2, 2, 2, 9)))
    stranger = handle((5, 5, 5, 5, 6, 6, 6, 6, 6, 6))
    assert index.extended_key(stranger, None) is None
    assert index.covered(stranger, None) == 0
    twin = handle((1, 1, 1, 1, 2, 2, 2, 2, 3, 3))
    assert index.extended_key(twin, None) == "s"
    assert index.covered(twin, None) == 8


def test_a_released_key_leaves_no_slot_behind() -> None:
    index = RetainedIndex(BLOCK)
    for i in range(50):
        index.put(f"k{i}", None, handle(tuple(range(i, i + 12))))
    for i in range(50):
        index.pop(f"k{i}")
    assert not index._prefixes and not index._ends and len(index) == 0
