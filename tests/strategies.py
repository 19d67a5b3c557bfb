"""Hypothesis strategies shared by the whole test suite (one section per area)."""

from __future__ import annotations

import anyio
from hypothesis import strategies as st
from microagent.collab._debias import voter_order

# --- engine bridge: handles, prompts, chat ---------------------------------------

#: words of chat contents: no leading/trailing whitespace (templates may trim)
chat_words = st.sampled_from(
    ["alpha", "beta", "gamma", "the", "plan", "is", "fine", "?", ",", "42"]
)


@st.composite
def chat_texts(draw: st.DrawFn, min_words: int = 1, max_words: int = 8) -> str:
    """A short chat content: words joined by single spaces (punctuation glued on)."""
    words = draw(st.lists(chat_words, min_size=min_words, max_size=max_words))
    text = ""
    for w in words:
        text += w if (not text or w in "?,") else " " + w
    return text


def token_lists(
    lo: int = 10, hi: int = 13, min_size: int = 0, max_size: int = 9
) -> st.SearchStrategy[list[int]]:
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

#: what a concurrent task does before its next send or get: (checkpoints, virtual seconds)
#: yield a few times, sleep a little or long; mostly nothing, so sends collide
task_pauses = st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.0, 0.0, 0.001, 0.01, 0.1, 0.5]))


async def take_pause(pause: tuple[int, float]) -> None:
    """Do what a drawn ``task_pauses`` value says: yield that many times, then sleep."""
    checkpoints, seconds = pause
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()
    if seconds:
        await anyio.sleep(seconds)


def _actor_op(op: str, **fields: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries({"op": st.just(op), **fields})


#: spawning one actor (at the root, in an open scope, or as a child of an actor)
actor_spawns = _actor_op(
    "spawn",
    place=st.sampled_from(["root", "scope", "child"]),
    index=st.integers(0, 50),
    restart=st.sampled_from(["permanent", "transient", "temporary"]),
    capacity=st.integers(1, 4),
    policy=st.sampled_from(["block", "block", "fail", "dead_letter"]),
    strategy=st.sampled_from(["one_for_one", "one_for_all"]),
)

_actor_op_kinds: dict[str, st.SearchStrategy[dict[str, object]]] = {
    "spawn": actor_spawns,
    "tell": _actor_op("tell", target=st.integers(0, 50), sender=st.integers(0, 2), work=actor_work),
    "ask": _actor_op(
        "ask",
        target=st.integers(0, 50),
        timeout=st.sampled_from([0.05, 0.3, 1.0, 5.0]),
        work=actor_work,
    ),
    "crash": _actor_op("crash", target=st.integers(0, 50), times=st.integers(1, 4)),
    "stop": _actor_op("stop", target=st.integers(0, 50), drain=st.booleans()),
    "generate": _actor_op("generate", target=st.integers(0, 50), tokens=st.integers(1, 20)),
    "open_scope": _actor_op("open_scope"),
    "cancel_scope": _actor_op("cancel_scope", index=st.integers(0, 10)),
    "close_scope": _actor_op("close_scope", index=st.integers(0, 10)),
    "advance": _actor_op("advance", seconds=st.sampled_from([0.01, 0.1, 0.5, 1.0, 3.0])),
    # concurrent sender tasks, each telling its messages in order (started, not awaited)
    "burst": _actor_op(
        "burst",
        target=st.integers(0, 50),
        senders=st.lists(
            st.lists(st.tuples(task_pauses, actor_work), min_size=1, max_size=5),
            min_size=2,
            max_size=4,
        ),
    ),
}
#: how often each kind of operation is drawn (tells and asks dominate)
_actor_op_weights = {"spawn": 3, "tell": 8, "ask": 4, "crash": 3, "stop": 1, "generate": 2}
_actor_op_weights |= {"open_scope": 1, "cancel_scope": 1, "close_scope": 1, "advance": 3}
_actor_op_weights |= {"burst": 3}

#: one operation of an actor program; actors/scopes are picked by index modulo what exists
actor_ops = st.sampled_from(
    [kind for kind, weight in _actor_op_weights.items() for _ in range(weight)]
).flatmap(_actor_op_kinds.__getitem__)

#: a whole program, generated up front and then run inside one event loop:
#: a few spawns (and maybe a scope) first, so that the operations have targets
actor_programs = st.builds(
    lambda scopes, spawns, ops: scopes + spawns + ops,
    st.lists(_actor_op("open_scope"), max_size=2),
    st.lists(actor_spawns, min_size=1, max_size=5),
    st.lists(actor_ops, min_size=10, max_size=40),
)

#: several concurrent senders into one mailbox (or one actor), and its consumer
#: ``senders``: per sender, the pause before each of its messages (one message each)
#: ``consumer``: the pause after each message taken (cycled; slower, so senders back up)
#: ``crash``: (sender, seq) of messages whose handler raises (actors only; modulo what exists)
#: ``close``: ``None``, or (virtual time, drain) at which the mailbox is closed / actor stopped
concurrent_sends = st.fixed_dictionaries(
    {
        "capacity": st.integers(1, 4),
        "policy": st.sampled_from(["block", "block", "fail", "dead_letter"]),
        "senders": st.lists(st.lists(task_pauses, min_size=1, max_size=8), min_size=2, max_size=5),
        "consumer": st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.01, 0.1, 0.5])),
            min_size=1,
            max_size=6,
        ),
        "crash": st.sets(st.tuples(st.integers(0, 4), st.integers(0, 7)), max_size=3),
        "close": st.one_of(
            st.none(),
            st.none(),
            st.tuples(st.sampled_from([0.0, 0.005, 0.05, 0.3, 1.0]), st.booleans()),
        ),
    }
)

# --- collaboration -------------------------------------------------------------------

VOTE_CHOICES = ("yes", "no", "maybe")


@st.composite
def vote_sequences(
    draw: st.DrawFn, *, free_text: bool = False
) -> tuple[tuple[str, ...] | None, list[str]]:
    """(choices or None, the voters' normalised answers in arrival order; "" = abstain)."""
    n = draw(st.integers(1, 11))
    if free_text:
        pool = draw(
            st.lists(st.text("abc", min_size=1, max_size=2), min_size=1, max_size=4, unique=True)
        )
        answers = draw(st.lists(st.sampled_from([*pool, ""]), min_size=n, max_size=n))
        return None, answers
    choices = VOTE_CHOICES[: draw(st.integers(2, 3))]
    answers = draw(st.lists(st.sampled_from([*choices, ""]), min_size=n, max_size=n))
    return choices, answers


#: an adaptive stop rule's (kind, confidence)
stop_rules = st.tuples(
    st.sampled_from(["off", "beta", "window"]), st.sampled_from([0.6, 0.9, 0.95])
)


@st.composite
def choice_views(draw: st.DrawFn) -> tuple[tuple[str, ...], int, bool]:
    """(canonical choices, a voter index, labels?) for a debiased voter's view."""
    k = draw(st.integers(1, 8))
    choices = tuple(f"choice {chr(ord('a') + i)}" for i in range(k))
    return choices, draw(st.integers(0, 40)), draw(st.booleans())


@st.composite
def soft_ballots(draw: st.DrawFn) -> tuple[int, list[tuple[tuple[int, ...], tuple[float, ...]]]]:
    """(k choices, per voter its ``voter_order`` and a distribution over shown positions)."""
    k = draw(st.integers(2, 4))
    n = draw(st.integers(1, 9))
    out = []
    for i in range(n):
        weights = draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k))
        total = sum(weights)
        out.append((voter_order(k, i), tuple(w / total for w in weights)))
    return k, out


# --- collaboration: graphs -------------------------------------------------------------

GRAPH_CONDITIONS = ({"contains": "yes"}, {"not_contains": "yes"})


@st.composite
def graph_dags(draw: st.DrawFn, max_nodes: int = 6) -> dict[str, object]:
    """A random valid DAG in the graph mode's dict form, plus ``says_yes`` (per node).

    Node ``n0`` is the only entry and ``n{last}`` the output; every node has a
    predecessor and a successor; edges are conditional ({contains: yes} /
    {not_contains: yes}) at random; nodes with several unconditional inputs are joins.
    """
    n = draw(st.integers(2, max_nodes))
    edges: list[dict[str, object]] = []
    for i in range(1, n):
        preds = draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=min(i, 3)))
        for j in sorted(preds):
            edge: dict[str, object] = {"from": f"n{j}", "to": f"n{i}"}
            if draw(st.integers(0, 3)) == 0:
                edge["when"] = draw(st.sampled_from(GRAPH_CONDITIONS))
            edges.append(edge)
    for j in range(n - 1):  # every node reaches the output
        if not any(e["from"] == f"n{j}" for e in edges):
            edges.append({"from": f"n{j}", "to": f"n{draw(st.integers(j + 1, n - 1))}"})
    nodes = []
    for i in range(n):
        plain = [e for e in edges if e["to"] == f"n{i}" and "when" not in e]
        nodes.append(
            {
                "name": f"n{i}",
                "instructions": f"You are node N{i}.",
                "count": draw(st.integers(1, 3)),
                "join": len(plain) > 1 or draw(st.booleans()),
                "max_tokens": 32,
            }
        )
    says_yes = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return {
        "nodes": nodes,
        "edges": edges,
        "entry": "n0",
        "output": f"n{n - 1}",
        "says_yes": says_yes,
    }


_ = st  # keep the import when a section is empty


# --- server: chat completion request bodies (valid-shaped and broken) --------------------

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _maybe(value: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Mostly ``value``, sometimes any JSON (a wrong type)."""
    return st.one_of(value, value, value, json_values)


def server_messages() -> st.SearchStrategy[object]:
    role = st.sampled_from(["system", "user", "assistant", "developer", "tool", "wizard"])
    message = st.fixed_dictionaries({"role": _maybe(role), "content": _maybe(st.text(max_size=40))})
    return _maybe(st.lists(message, max_size=3))


def server_agents() -> st.SearchStrategy[object]:
    spec = st.fixed_dictionaries(
        {"name": _maybe(st.sampled_from(["voter", "critic", "a", ""]))},
        optional={
            "count": _maybe(st.integers(-2, 40)),
            "instructions": _maybe(st.text(max_size=20)),
            "temperature": _maybe(st.floats(-1, 3)),
            "max_tokens": _maybe(st.integers(-1, 20)),
            "adapter": _maybe(st.none() | st.just("missing")),
            "model": _maybe(st.none() | st.sampled_from(["scripted", "other"])),
        },
    )
    return _maybe(st.lists(spec, max_size=3))


def server_collaborations() -> st.SearchStrategy[object]:
    answer = st.none() | st.fixed_dictionaries(
        {"choices": _maybe(st.lists(st.sampled_from(["yes", "no", "", "yes"]), max_size=3))}
    )
    return _maybe(
        st.fixed_dictionaries(
            {
                "mode": _maybe(
                    st.sampled_from(["vote", "debate", "reflect", "aggregate", "cascade", "nope"])
                )
            },
            optional={
                "early_stop": _maybe(st.booleans()),
                "rounds": _maybe(st.integers(-1, 20)),
                "answer": _maybe(answer),
                "bogus": json_values,
            },
        )
    )


def chat_request_bodies() -> st.SearchStrategy[object]:
    """``/v1/chat/completions`` bodies: mostly well-shaped, wrong types and bad values mixed in."""
    body = st.fixed_dictionaries(
        {"messages": server_messages()},
        optional={
            "model": _maybe(st.sampled_from(["scripted", "default", "nope"])),
            "max_tokens": _maybe(st.integers(-1, 12)),
            "temperature": _maybe(st.floats(-1, 3, allow_nan=False)),
            "top_p": _maybe(st.floats(-0.5, 1.5, allow_nan=False)),
            "n": _maybe(st.integers(-1, 5)),
            "seed": _maybe(st.integers(-(2**64), 2**64)),
            "stop": _maybe(st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5)),
            "stream": _maybe(st.booleans()),
            "stream_options": _maybe(
                st.fixed_dictionaries({"include_usage": _maybe(st.booleans())})
            ),
            "agents": server_agents(),
            "collaboration": server_collaborations(),
        },
    )
    return st.one_of(body, body, body, json_values)
