"""Collaboration traces: valid trace-event JSON, and a timeline with one lane per agent."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
import trio.testing
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.image import imread
from microagent.collab import AgentSpec, CollaborationEvent, Outcome, collaborate, event
from microagent.collab.trace import PHASES, TraceRecorder, plot_timeline, write_trace
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine

CONTEXT = "Is the sky blue on a clear day? " * 20

# The trace-event "JSON Object Format" (Chrome/Perfetto), for the phases we emit.
TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "metadata": {"type": "object"},
    },
    "$defs": {
        "event": {
            "type": "object",
            "required": ["ph", "ts", "pid", "tid", "name"],
            "properties": {
                "ph": {"enum": ["X", "i", "M"]},
                "name": {"type": "string", "minLength": 1},
                "cat": {"type": "string"},
                "ts": {"type": "number", "minimum": 0},
                "dur": {"type": "number", "minimum": 0},
                "pid": {"type": "integer"},
                "tid": {"type": "integer"},
                "s": {"enum": ["g", "p", "t"]},
                "args": {"type": "object"},
            },
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["dur"]}},
                {"if": {"properties": {"ph": {"const": "i"}}}, "then": {"required": ["s"]}},
                {
                    "if": {"properties": {"ph": {"const": "M"}}},
                    "then": {
                        "properties": {
                            "name": {
                                "enum": [
                                    "process_name",
                                    "thread_name",
                                    "thread_sort_index",
                                    "process_sort_index",
                                ]
                            }
                        },
                        "required": ["args"],
                    },
                },
            ],
        }
    },
}


def run_virtual(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``fn`` in trio with an autojumping mock clock: the engine's sleeps cost no wall time."""
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def early_stopping_vote() -> tuple[TraceRecorder, Outcome]:
    """Three quick voters, two slow ones: three "yes" decide, the slow two are pruned mid-decode."""

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        if request.sampling.choices:
            return "yes"
        return "step " * 150 if "at length" in request.prompt.text else None

    agents = [
        AgentSpec("voter", count=3),
        AgentSpec(
            "slow-voter", count=2, instructions="Think it through at length.", max_tokens=200
        ),
    ]

    async def main() -> tuple[TraceRecorder, Outcome]:
        async with ScriptedEngine(
            script=script, decode_time_per_token=0.01, prefill_time_per_token=0.001
        ) as engine:
            recorder = TraceRecorder()
            outcome = await collaborate(
                engine,
                "vote",
                CONTEXT,
                agents,
                answer={"choices": ["yes", "no"]},
                style="reason",
                max_tokens=64,
                on_event=recorder,
            )
            assert engine.live_requests() == frozenset()
        recorder.set_outcome(outcome)
        return recorder, outcome

    result: tuple[TraceRecorder, Outcome] = run_virtual(main)
    return result


def debate() -> tuple[TraceRecorder, Outcome]:
    async def main() -> tuple[TraceRecorder, Outcome]:
        async with ScriptedEngine(
            decode_time_per_token=0.01, prefill_time_per_token=0.001
        ) as engine:
            recorder = TraceRecorder(mode="debate")
            outcome = await collaborate(
                engine,
                "debate",
                CONTEXT,
                [AgentSpec("debater", count=3)],
                rounds=2,
                max_tokens=32,
                on_event=recorder,
            )
        return recorder, outcome

    result: tuple[TraceRecorder, Outcome] = run_virtual(main)
    return result


def threads(trace: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {
        e["tid"]: e["args"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def lane_labels(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def pruned_markers(fig: Figure) -> list[Any]:
    return [line for line in fig.axes[0].get_lines() if line.get_gid() == "pruned-marker"]


def test_vote_trace_is_valid_trace_event_json(tmp_path: Path) -> None:
    recorder, outcome = early_stopping_vote()
    pruned = {a.name for a in outcome.agents if a.finish_reason == "pruned"}
    assert outcome.early_stopped and pruned == {"slow-voter-1", "slow-voter-2"}

    path = tmp_path / "trace.json"
    recorder.write_trace(path)
    trace = json.loads(path.read_text())
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["mode"] == "vote" and trace["metadata"]["answer"] == "yes"

    # one named track per actor (and the collaboration's own track 0)
    tracks = threads(trace)
    assert tracks.pop(0)["name"] == "collaboration"
    assert sorted(t["agent"] for t in tracks.values()) == sorted(a.name for a in outcome.agents)
    assert all(t["name"] == f"{t['agent']} [voter]" for t in tracks.values())
    tid = {t["agent"]: k for k, t in tracks.items()}
    assert {t["agent"] for t in tracks.values() if t["pruned"]} == pruned

    events = trace["traceEvents"]
    turns = [e for e in events if e["ph"] == "X" and e["cat"] == "turn"]
    phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"]
    assert {e["name"] for e in phases} <= set(PHASES) and "decode" in {e["name"] for e in phases}
    for agent in outcome.agents:  # the token counts in the trace add up to the agent's record
        mine = [e for e in turns if e["tid"] == tid[agent.name]]
        assert len(mine) == agent.requests
        assert sum(e["args"]["completion_tokens"] for e in mine) == agent.completion_tokens
        assert sum(e["args"]["prompt_tokens"] for e in mine) == agent.prompt_tokens
        assert sum(e["args"]["cached_tokens"] for e in mine) == agent.cached_tokens
        for turn in mine:  # every phase lies inside its turn
            inside = [
                p
                for p in phases
                if p["tid"] == turn["tid"] and turn["ts"] <= p["ts"] < turn["ts"] + turn["dur"]
            ]
            assert all(p["ts"] + p["dur"] <= turn["ts"] + turn["dur"] + 1 for p in inside)
    pruned_turns = {e["tid"] for e in turns if e["name"] == "pruned"}
    assert pruned_turns and pruned_turns <= {tid[a] for a in pruned}
    marks = {e["tid"] for e in events if e["ph"] == "i" and e["name"] == "pruned"}
    assert marks == {tid[a] for a in pruned}
    globals_ = [e for e in events if e["ph"] == "i" and e["tid"] == 0]
    assert [e["name"] for e in globals_].count("vote") == 3
    assert globals_[-1]["name"] == "final"


def test_vote_timeline_has_one_lane_per_agent_and_marks_pruned(tmp_path: Path) -> None:
    recorder, outcome = early_stopping_vote()
    pruned = sorted(a.name for a in outcome.agents if a.finish_reason == "pruned")
    png = tmp_path / "timeline.png"
    fig = plot_timeline(recorder, png)

    expected = [
        f"{a.name} (pruned)" if a.name in pruned else a.name for a in outcome.agents
    ]  # spawn order
    assert expected == [
        "voter-1",
        "voter-2",
        "voter-3",
        "slow-voter-1 (pruned)",
        "slow-voter-2 (pruned)",
    ]
    assert lane_labels(fig) == expected
    ax = fig.axes[0]
    assert [t.get_color() for t in ax.get_yticklabels()].count("#d62728") == len(pruned)
    bars = [c for c in ax.collections if isinstance(c, PolyCollection)]
    trace = recorder.to_chrome_trace()
    lanes_phases = {
        (e["tid"], e["name"])
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["cat"] == "phase"
    }
    failed_lanes = {
        e["tid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "pruned"
    }
    assert len(bars) == len(lanes_phases) + len(failed_lanes)
    hatched = [c for c in bars if c.get_hatch()]
    assert len(hatched) == len(failed_lanes) >= 1
    (marker,) = pruned_markers(fig)
    rows = sorted(int(y) for y in marker.get_ydata())  # type: ignore[union-attr]
    assert rows == [expected.index(f"{a} (pruned)") for a in pruned]
    assert "vote" in ax.get_title(loc="left") and "answer: yes" in ax.get_title(loc="left")
    legend = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert {*PHASES, "pruned", "final answer", "vote"} <= legend

    image = imread(png)
    assert image.shape[0] > 200 and image.shape[1] > 800


def test_debate_trace_and_timeline_from_a_saved_file(tmp_path: Path) -> None:
    recorder, outcome = debate()
    path = tmp_path / "debate.json"
    write_trace(recorder, path)
    trace = json.loads(path.read_text())
    jsonschema.validate(trace, TRACE_SCHEMA)
    tracks = threads(trace)
    assert sorted(t["agent"] for k, t in tracks.items() if k) == [
        "debater-1",
        "debater-2",
        "debater-3",
    ]
    turns = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "turn"]
    assert sorted(e["args"]["round"] for e in turns) == sorted(
        [r for r in range(1, outcome.rounds + 1)] * 3
    )
    assert [
        e["args"]["round"] for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "round"
    ] == list(range(1, outcome.rounds + 1))

    fig = plot_timeline(trace, tmp_path / "debate.png")  # drawn from the loaded JSON
    assert lane_labels(fig) == ["debater-1", "debater-2", "debater-3"]
    assert lane_labels(plot_timeline(recorder)) == lane_labels(fig)
    assert not pruned_markers(fig)
    assert not [
        c for c in fig.axes[0].collections if isinstance(c, PolyCollection) and c.get_hatch()
    ]
    vlines = [
        line
        for line in fig.axes[0].get_lines()
        if line.get_gid() not in ("vote-marker", "pruned-marker")
    ]
    assert len(vlines) == outcome.rounds + 1  # each round's end and the final answer
    assert fig.axes[0].get_title(loc="left").startswith("debate: 3 agents")
    assert (tmp_path / "debate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.anyio
async def test_recorder_forwards_to_sync_and_async_callbacks() -> None:
    seen: list[CollaborationEvent] = []
    awaited: list[str] = []

    async def async_cb(ev: CollaborationEvent) -> None:
        awaited.append(ev.type)

    async with ScriptedEngine(script=lambda p, r: "yes" if r.sampling.choices else None) as engine:
        sync_rec = TraceRecorder(forward=seen.append)
        async_rec = TraceRecorder(async_cb)
        await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=3)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            on_event=sync_rec,
        )
        await collaborate(
            engine,
            "vote",
            CONTEXT,
            [AgentSpec("voter", count=3)],
            answer={"choices": ["yes", "no"]},
            style="direct",
            on_event=async_rec,
        )
    assert seen == sync_rec.events and seen[-1].type == "final"
    assert awaited == [e.type for e in async_rec.events] and awaited[-1] == "final"
    sync_rec.clear()
    assert (
        sync_rec.events == []
        and sync_rec.to_chrome_trace()["traceEvents"][1]["args"]["name"] == "collaboration"
    )


def test_unfinished_failed_and_never_started_turns() -> None:
    recorder = TraceRecorder(mode="custom")
    for ev in [
        event("agent_started", "a", time=0.1, role="worker", label="draft", round=1, sent_at=0.05),
        event("agent_started", "b", time=0.1, role="worker", label="draft", round=1, sent_at=0.1),
        event("agent_finished", "b", time=0.2, finish_reason="error", error="boom"),
        event("pruned", "c", time=0.25, reason="early_stop"),
        event("validation", "a", time=0.3, ok=False, message="bad", extra=object()),
    ]:
        assert recorder(ev) is None
    trace = recorder.to_chrome_trace()
    jsonschema.validate(trace, TRACE_SCHEMA)
    json.dumps(trace)  # every arg is JSON (an object() became its str)
    tracks = {t["agent"]: k for k, t in threads(trace).items() if k}
    assert list(tracks) == ["a", "b", "c"]
    by_name = {(e["tid"], e["name"]) for e in trace["traceEvents"] if e["ph"] in ("X", "i")}
    assert (tracks["a"], "aborted") in by_name  # still running when the recording stopped
    assert (tracks["a"], "mailbox wait") in by_name and (tracks["a"], "validation") in by_name
    assert (tracks["b"], "error") in by_name
    assert (tracks["c"], "pruned") in by_name
    fig = plot_timeline(trace)
    assert lane_labels(fig) == ["a (pruned)", "b (pruned)", "c (pruned)"]
    (marker,) = pruned_markers(fig)
    assert sorted(marker.get_ydata()) == [0, 2]  # type: ignore[arg-type]


def test_empty_recording_is_a_valid_trace_and_an_empty_figure() -> None:
    recorder = TraceRecorder()
    trace = recorder.to_chrome_trace()
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["metadata"]["total_time_s"] == 0
    fig = plot_timeline(recorder)
    assert lane_labels(fig) == []
