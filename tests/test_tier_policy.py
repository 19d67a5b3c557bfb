"""The host tier's eviction policy: cold blocks first, then the session that returns last.

Driven by hand (no engine): vLLM's ``CachePolicy`` contract is ``evict(n, protected)``
returning exactly ``n`` evictable, unprotected entries or ``None`` with nothing changed.
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.engine_bridge.vllm import _tier_policy
from microagent.engine_bridge.vllm._tier_policy import SessionPolicy
from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus


def key(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(8, "big") + bytes(4))


def filled(n: int) -> SessionPolicy:
    """A policy over ``n`` ready, idle chunks, inserted in order (key 0 least recent)."""
    policy = SessionPolicy(cache_capacity=n)
    for i in range(n):
        chunk = ChunkStatus(i)
        chunk.ref_cnt = 0
        policy.insert(key(i), chunk)
    return policy


def evicted(policy: SessionPolicy, n: int, protected: set[OffloadKey] | None = None) -> list[int]:
    out = policy.evict(n, protected or set())
    assert out is not None
    return [int.from_bytes(k[:8], "big") for k, _ in out]


def test_cold_blocks_go_before_a_waiting_sessions_even_when_older() -> None:
    policy = filled(6)
    policy.hold("agent/1", [key(0), key(1)], now=0.0, next_use=30.0, expires=None)
    # LRU alone would take 0 and 1 (the oldest): the session's
    assert evicted(policy, 2) == [2, 3]
    assert policy.cold_evictions == 2 and policy.held_evictions == 0


def freeze_policy_clock(monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    """The policy module's clock only: a frozen ``time.monotonic`` would freeze every
    event loop of the process (the shared real engine's too)."""
    monkeypatch.setattr(_tier_policy, "time", types.SimpleNamespace(monotonic=lambda: now))


def test_held_blocks_go_last_the_furthest_next_use_first(monkeypatch: pytest.MonkeyPatch) -> None:
    freeze_policy_clock(monkeypatch, 100.0)
    policy = filled(5)
    policy.hold("soon", [key(0)], now=100.0, next_use=5.0, expires=None)
    policy.hold("late", [key(1)], now=100.0, next_use=50.0, expires=None)
    policy.hold("no-hint", [key(2)], now=100.0, next_use=None, expires=None)
    # two cold blocks, then the sessions: no hint (never expected back), late, soon
    assert evicted(policy, 5) == [3, 4, 2, 1, 0]
    assert policy.held_evictions == 3


def test_a_late_session_is_expected_to_be_as_late_again(monkeypatch: pytest.MonkeyPatch) -> None:
    freeze_policy_clock(monkeypatch, 100.0)
    policy = filled(2)
    # due 40 s ago: expected 40 s from now; the other is due in 10 s
    policy.hold("late", [key(0)], now=50.0, next_use=10.0, expires=None)
    policy.hold("due", [key(1)], now=90.0, next_use=20.0, expires=None)
    assert evicted(policy, 1) == [0]


def test_eviction_is_atomic_and_respects_protected_and_busy_chunks() -> None:
    policy = filled(4)
    policy.hold("s", [key(0)], now=0.0, next_use=1.0, expires=None)
    policy.mark_non_evictable(key(1))  # being read
    assert policy.evict(3, {key(2)}) is None  # only 0 and 3 may go
    assert {key(i) for i in range(4)} <= set(policy.chunks)  # nothing changed
    assert sorted(evicted(policy, 2, {key(2)})) == [0, 3]


def test_forget_release_prefix_and_expiry_make_blocks_cold() -> None:
    policy = filled(4)
    policy.hold("collab-1/a", [key(0)], now=0.0, next_use=1.0, expires=None)
    policy.hold("collab-1/b", [key(1)], now=0.0, next_use=1.0, expires=None)
    policy.hold("ttl", [key(2)], now=0.0, next_use=1.0, expires=10.0)
    assert policy.forget(prefix="collab-1/") == 2
    assert policy.expire(10.0) == 1
    assert policy.sessions == 0 and policy.held_keys == 0
    assert evicted(policy, 3) == [0, 1, 2]  # plain LRU again


def test_holding_again_replaces_the_owners_blocks_and_shared_blocks_stay_held() -> None:
    policy = filled(4)
    policy.hold("a", [key(0), key(1)], now=0.0, next_use=1.0, expires=None)
    policy.hold("b", [key(1)], now=0.0, next_use=1.0, expires=None)
    policy.hold("a", [key(2)], now=0.0, next_use=1.0, expires=None)  # a's next turn
    assert not policy.is_held(key(0)) and policy.is_held(key(1)) and policy.is_held(key(2))
    policy.forget(["b"])
    assert not policy.is_held(key(1))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("hold"), st.integers(0, 3), st.sets(st.integers(0, 11))),
            st.tuples(st.just("forget"), st.integers(0, 3), st.just(frozenset())),
            st.tuples(st.just("evict"), st.integers(1, 4), st.sets(st.integers(0, 11))),
            st.tuples(st.just("insert"), st.integers(0, 11), st.just(frozenset())),
        ),
        max_size=40,
    )
)
def test_against_a_reference_nothing_lost_nothing_twice_cold_first(
    ops: list[tuple[str, int, frozenset[int] | set[int]]],
) -> None:
    """Every eviction returns exactly n present, idle, unprotected blocks (or None and
    changes nothing), never a held block while an unprotected cold one is idle, never a
    block twice; the blocks present are exactly the inserted minus the evicted."""
    policy = SessionPolicy(cache_capacity=12)
    present: set[int] = set()
    held: dict[int, set[int]] = {}
    for op, arg, keys in ops:
        if op == "insert" and arg not in present:
            chunk = ChunkStatus(arg)
            chunk.ref_cnt = 0
            policy.insert(key(arg), chunk)
            policy.touch([key(arg)], ReqContext(req_id="r"))
            present.add(arg)
        elif op == "hold":
            policy.hold(f"s{arg}", [key(k) for k in keys], now=0.0, next_use=1.0, expires=None)
            held[arg] = set(keys)
        elif op == "forget":
            policy.forget([f"s{arg}"])
            held.pop(arg, None)
        elif op == "evict":
            protected = {key(k) for k in keys}
            out = policy.evict(arg, protected)
            allowed = present - set(keys)
            if len(allowed) < arg:
                assert out is None
                continue
            assert out is not None and len(out) == arg
            gone = {int.from_bytes(k[:8], "big") for k, _ in out}
            assert len(gone) == arg and gone <= allowed
            held_now = set().union(*held.values()) if held else set()
            if gone & held_now:  # a held block went only once no cold one was left
                assert not (allowed - held_now - gone)
            present -= gone
        assert set(policy.chunks) == {key(k) for k in present}
