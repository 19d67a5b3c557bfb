"""Collaboration traces: the recorder, and its Chrome/Perfetto trace-event JSON.

A ``TraceRecorder`` is an ``on_event`` callback: it keeps every
``CollaborationEvent`` of a collaboration (and forwards it, when given another
callback). From those events it rebuilds what each actor did, turn by turn —
waiting on its mailbox, queued + prefilling in the engine, decoding, pruned or
aborted — and exports it as trace-event JSON (one track per actor; open it in
https://ui.perfetto.dev or chrome://tracing) or draws it as a PNG timeline.

The PNG is drawn from the trace JSON itself, so a saved trace can be plotted
later (``plot_timeline(json.load(f))``) and both views always agree
(the figure is in ``_timeline``: matplotlib is imported only there).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from .._outcome import CollaborationEvent, Outcome

#: Phase names of a turn, in order, as they appear in the trace ("X" events, cat "phase").
PHASES = ("mailbox wait", "queued+prefill", "decode")
#: Events drawn on the shared "collaboration" track even when they name an agent.
GLOBAL_EVENTS = frozenset({"vote", "round", "final", "escalate"})

_PID = 1
_COLLAB_TID = 0
_US = 1_000_000.0


@attrs.define(eq=False)
class TraceRecorder:
    """An ``on_event`` callback that records a collaboration for tracing.

    Use it as ``collaborate(..., on_event=TraceRecorder())``; give ``forward`` to
    keep another callback (sync or async) receiving every event as well.

    Attributes:
        forward: another event callback called after recording (its awaitable, if
            any, is returned so ``collaborate`` awaits it).
        mode: the collaboration mode, shown in the trace metadata and the PNG title
            (set it, or call ``set_outcome``).
        events: the events recorded so far, in order.
    """

    forward: Callable[[CollaborationEvent], Awaitable[None] | None] | None = None
    mode: str | None = attrs.field(default=None, kw_only=True)
    events: list[CollaborationEvent] = attrs.field(factory=list, kw_only=True)
    outcome: Outcome | None = attrs.field(default=None, kw_only=True)

    def __call__(self, event: CollaborationEvent) -> Awaitable[None] | None:
        self.events.append(event)
        if self.forward is None:
            return None
        return self.forward(event)

    def set_outcome(self, outcome: Outcome) -> None:
        """Attach the collaboration's outcome: its mode, wall time and every agent's role."""
        self.outcome = outcome
        self.mode = outcome.mode

    def clear(self) -> None:
        """Forget the recorded events (to record another collaboration)."""
        self.events.clear()
        self.outcome = None

    def to_chrome_trace(self) -> dict[str, Any]:
        """The recording as a trace-event JSON object (Chrome/Perfetto "JSON Object Format")."""
        return _build_trace(self.events, self.mode, self.outcome)

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_chrome_trace()`` to ``path`` as JSON."""
        write_trace(self, path)


def write_trace(recorder: TraceRecorder | Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a recorder's trace (or a ready trace dict) to ``path`` as JSON."""
    trace = recorder.to_chrome_trace() if isinstance(recorder, TraceRecorder) else dict(recorder)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)


# --- building the trace ----------------------------------------------------------------


@attrs.define
class _Turn:
    """One turn of one agent, rebuilt from its agent_started / agent_finished pair."""

    agent: str
    label: str
    round: int | None
    sent_at: float
    started: float
    submitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    tokens: dict[str, Any] = attrs.field(factory=dict)


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _jsonable(value: Any) -> Any:
    """``value`` reduced to JSON types (mappings, lists, str, numbers, bool, None)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def _us(seconds: float) -> float:
    return round(seconds * _US, 3)


@attrs.define
class _Folded:
    """A collaboration's events folded into what the trace shows."""

    roles: dict[str, str]
    first_seen: dict[str, int]
    turns: list[_Turn]
    instants: list[dict[str, Any]]
    pruned: set[str]
    end: float


def _build_trace(
    events: Sequence[CollaborationEvent], mode: str | None, outcome: Outcome | None
) -> dict[str, Any]:
    """The trace-event JSON: the events folded (``_fold``), then written (``_write``)."""
    return _write(_fold(events, outcome), events, mode, outcome)


def _fold(events: Sequence[CollaborationEvent], outcome: Outcome | None) -> _Folded:
    """Each agent's turns (start/finish pairs), the instant marks and who was pruned."""
    roles: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    turns: list[_Turn] = []
    open_turns: dict[str, _Turn] = {}
    instants: list[dict[str, Any]] = []
    pruned: set[str] = set()
    end = max((e.time for e in events), default=0.0)

    def see(agent: str, role: str | None = None) -> None:
        first_seen.setdefault(agent, len(first_seen))
        if role is not None:
            roles.setdefault(agent, role)

    if outcome is not None:
        for record in outcome.agents:
            see(record.name, record.role)
    for ev in events:
        agent = ev.agent
        data = ev.data
        if agent is not None:
            see(agent, data.get("role") if ev.type == "agent_started" else None)
        if ev.type == "agent_started" and agent is not None:
            sent = data.get("sent_at")
            open_turns[agent] = _Turn(
                agent=agent,
                label=str(data.get("label", "turn")),
                round=data.get("round"),
                sent_at=float(sent) if sent is not None else ev.time,
                started=ev.time,
            )
        elif ev.type == "agent_finished" and agent is not None:
            turn = open_turns.pop(agent, None)
            if turn is None:  # failed before it started (an error) or a stray finish
                turn = _Turn(
                    agent=agent,
                    label=str(data.get("label", "turn")),
                    round=data.get("round"),
                    sent_at=ev.time,
                    started=ev.time,
                )
            turn.submitted = data.get("submitted")
            turn.first_token = data.get("first_token")
            finished = data.get("finished")
            turn.finished = float(finished) if finished is not None else ev.time
            turn.finish_reason = str(data.get("finish_reason", "stop"))
            turn.tokens = {
                k: data[k]
                for k in (
                    "prompt_tokens",
                    "cached_tokens",
                    "completion_tokens",
                    "cache_miss",
                    "request_id",
                    "error",
                )
                if k in data
            }
            turns.append(turn)
            if turn.finish_reason in ("aborted", "error"):
                instants.append(
                    _instant(turn.finish_reason, agent, turn.finished, {"label": turn.label})
                )
        elif ev.type == "delta":
            continue
        else:
            if ev.type == "pruned" and agent is not None:
                pruned.add(agent)
            args = {k: _jsonable(v) for k, v in data.items()}
            if ev.type in GLOBAL_EVENTS or agent is None:
                if agent is not None:
                    args["agent"] = agent
                instants.append(_instant(ev.type, None, ev.time, args))
            else:
                instants.append(_instant(ev.type, agent, ev.time, args))
    for turn in open_turns.values():  # still running when the recording stopped
        turn.finished, turn.finish_reason = end, "aborted"
        turns.append(turn)
        instants.append(_instant("aborted", turn.agent, end, {"label": turn.label}))
    for turn in turns:
        if turn.finish_reason == "pruned":
            pruned.add(turn.agent)
    return _Folded(roles, first_seen, turns, instants, pruned, end)


def _write(
    folded: _Folded,
    events: Sequence[CollaborationEvent],
    mode: str | None,
    outcome: Outcome | None,
) -> dict[str, Any]:
    """The folded collaboration as trace events: a track per agent, its turns and phases."""
    roles, first_seen, turns, instants, pruned, end = (
        folded.roles,
        folded.first_seen,
        folded.turns,
        folded.instants,
        folded.pruned,
        folded.end,
    )
    # tracks: grouped by role (in order of first appearance), agents in natural order
    role_rank: dict[str, int] = {}
    for seen in sorted(first_seen, key=first_seen.__getitem__):
        role_rank.setdefault(roles.get(seen, seen), len(role_rank))

    spawned = (
        {record.name: i for i, record in enumerate(outcome.agents)} if outcome is not None else {}
    )

    def lane_key(name: str) -> tuple[int, int, tuple[Any, ...]]:
        # the outcome's (spawn) order when known, else grouped by role, natural order within
        return spawned.get(name, len(spawned)), role_rank[roles.get(name, name)], _natural(name)

    agents = sorted(first_seen, key=lane_key)
    tids = {name: i for i, name in enumerate(agents, start=1)}
    total = outcome.wall_time if outcome is not None and outcome.wall_time > end else end

    out: list[dict[str, Any]] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": _PID,
            "tid": _COLLAB_TID,
            "ts": 0,
            "args": {"name": f"microagent {mode or 'collaboration'}"},
        },
        {
            "ph": "M",
            "name": "thread_name",
            "pid": _PID,
            "tid": _COLLAB_TID,
            "ts": 0,
            "args": {"name": "collaboration"},
        },
        {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": _PID,
            "tid": _COLLAB_TID,
            "ts": 0,
            "args": {"sort_index": 0},
        },
    ]
    for name, tid in tids.items():
        role = roles.get(name, "agent")
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": _PID,
                "tid": tid,
                "ts": 0,
                "args": {
                    "name": f"{name} [{role}]",
                    "agent": name,
                    "role": role,
                    "pruned": name in pruned,
                },
            }
        )
        out.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": _PID,
                "tid": tid,
                "ts": 0,
                "args": {"sort_index": tid},
            }
        )
    for turn in sorted(turns, key=lambda t: t.sent_at):
        out.extend(_turn_events(turn, tids[turn.agent]))
    out.extend(instants)
    metadata = {
        "source": "microagent",
        "mode": mode,
        "total_time_s": round(total, 6),
        "agents": [
            {"name": a, "role": roles.get(a, "agent"), "tid": tids[a], "pruned": a in pruned}
            for a in agents
        ],
    }
    final = next((e for e in reversed(events) if e.type == "final"), None)
    if final is not None:
        metadata["answer"] = _jsonable(final.data.get("answer"))
        metadata["usage"] = _jsonable(final.data.get("usage"))
    out = _resolve_tids(out, tids)
    return {"traceEvents": out, "displayTimeUnit": "ms", "metadata": metadata}


def _instant(name: str, agent: str | None, time: float, args: dict[str, Any]) -> dict[str, Any]:
    # the track is resolved later (tids are known once every agent is seen)
    return {
        "ph": "i",
        "name": name,
        "cat": "global" if agent is None else "agent",
        "s": "t",
        "ts": _us(time),
        "pid": _PID,
        "tid": _COLLAB_TID,
        "agent": agent,
        "args": args,
    }


def _resolve_tids(events: list[dict[str, Any]], tids: Mapping[str, int]) -> list[dict[str, Any]]:
    for ev in events:
        if "agent" in ev and ev.get("ph") == "i":
            agent = ev.pop("agent")
            ev["tid"] = _COLLAB_TID if agent is None else tids[agent]
    return events


def _turn_events(turn: _Turn, tid: int) -> list[dict[str, Any]]:
    """The "X" events of one turn: the whole turn, then each phase it reached."""
    finished = turn.finished if turn.finished is not None else turn.started
    args: dict[str, Any] = {
        "label": turn.label,
        "round": turn.round,
        "finish_reason": turn.finish_reason,
        "prompt_tokens": turn.tokens.get("prompt_tokens", 0),
        "cached_tokens": turn.tokens.get("cached_tokens", 0),
        "completion_tokens": turn.tokens.get("completion_tokens", 0),
    }
    for key in ("cache_miss", "request_id", "error"):
        if key in turn.tokens:
            args[key] = _jsonable(turn.tokens[key])
    name = (
        turn.finish_reason if turn.finish_reason in ("pruned", "aborted", "error") else turn.label
    )
    events = [_complete(str(name), "turn", tid, turn.sent_at, finished, args)]
    phases: list[tuple[str, float, float]] = [(PHASES[0], turn.sent_at, turn.started)]
    if turn.submitted is not None:
        submitted = float(turn.submitted)
        prefill_end = float(turn.first_token) if turn.first_token is not None else finished
        phases.append((PHASES[1], submitted, prefill_end))
        if turn.first_token is not None:
            phases.append((PHASES[2], float(turn.first_token), finished))
    for phase, start, stop in phases:
        if stop > start:
            events.append(_complete(phase, "phase", tid, start, stop, args))
    return events


def _complete(
    name: str, cat: str, tid: int, start: float, stop: float, args: dict[str, Any]
) -> dict[str, Any]:
    ts = _us(start)
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": _PID,
        "tid": tid,
        "ts": ts,
        "dur": max(round(_us(stop) - ts, 3), 0.0),
        "args": dict(args),
    }
