"""The terminal's live view of a collaboration, and the summary printed after it.

On a terminal, ``LiveView`` draws one lane per agent (status, token counts,
the tail of its streaming text), the votes and the round, redrawn in place
with rich. Anywhere else (a pipe, a log, a test) it prints one plain line per
event but token deltas, so the output stays readable and greppable.
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

import attrs

_SKIP_IN_LINES = frozenset(
    {
        "type",
        "agent",
        "time",
        "text",
        "usage",
        "sent_at",
        "submitted",
        "first_token",
        "finished",
        "request_id",
        "expected_cached_tokens",
        "cache_miss",
    }
)
_KNOWN = frozenset({"agent_started", "delta", "agent_finished", "vote", "pruned", "round", "final"})
_REDRAW_SECONDS = 0.08


@attrs.define
class _Lane:
    """What the view knows of one agent."""

    status: str = "waiting"
    role: str = ""
    label: str = ""
    text: str = ""
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    answer: str | None = None
    note: str = ""
    pruned: bool = False


class LiveView:
    """Shows a collaboration as it happens: one lane per agent, votes, rounds, pruning.

    Call it with every ``CollaborationEvent`` (it is an ``on_event`` callback), then
    ``finish()``. On a terminal the lanes are redrawn in place; otherwise each event
    (but token deltas) is printed as one line, so logs stay readable.

    Args:
        out: where to draw.
        tty: draw live lanes (default: whether ``out`` is a terminal).
        width: the line width when ``out`` is not a terminal.
    """

    def __init__(self, out: TextIO, *, tty: bool | None = None, width: int = 100) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.width = width
        self.agents: dict[str, dict[str, Any]] = {}
        self.votes: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
        self.round: int | None = None
        self.answer: str | None = None
        self._lanes: dict[str, _Lane] = {}
        self._started = time.monotonic()
        self._live: Any = None
        self._last_draw = 0.0

    # -- events ----------------------------------------------------------------------------

    def __call__(self, event: Any) -> None:
        data = event.to_dict()
        self.events.append(data)
        name = event.agent
        kind = event.type
        if name is not None:
            self._update_lane(name, kind, data)
        if kind == "vote":
            votes = data.get("votes")
            if isinstance(votes, dict):
                self.votes = {str(k): int(v) for k, v in votes.items()}
            elif data.get("answer") is not None:
                self.votes[str(data["answer"])] = self.votes.get(str(data["answer"]), 0) + 1
        elif kind == "round" and isinstance(data.get("round"), int):
            self.round = data["round"]
        elif kind == "final" and data.get("answer") is not None:
            self.answer = str(data["answer"])
        if self.tty:
            now = time.monotonic()
            if kind != "delta" or now - self._last_draw > _REDRAW_SECONDS:
                self._last_draw = now
                self._draw()
        elif kind != "delta":
            self._line(kind, name, data)

    def _update_lane(self, name: str, kind: str, data: dict[str, Any]) -> None:
        lane = self._lanes.setdefault(name, _Lane())
        agent = self.agents.setdefault(name, {"status": "waiting", "text": ""})
        if kind == "agent_started":
            if not lane.pruned:
                lane.status = "running"
            lane.role = str(data.get("role") or lane.role)
            lane.label = str(data.get("label") or "")
            if lane.text and not lane.text.endswith("\n"):
                lane.text += " │ "
        elif kind == "delta":
            text = str(data.get("text", ""))
            lane.text += text
            agent["text"] += text
        elif kind == "agent_finished":
            reason = str(data.get("finish_reason", "stop"))
            lane.turns += 1
            lane.prompt_tokens += int(data.get("prompt_tokens") or 0)
            lane.cached_tokens += int(data.get("cached_tokens") or 0)
            lane.completion_tokens += int(data.get("completion_tokens") or 0)
            if reason == "pruned":
                lane.pruned = True
            if not lane.pruned:
                lane.status = "error" if reason == "error" else "done"
            if data.get("error"):
                lane.note = str(data["error"])
        elif kind == "pruned":
            lane.pruned = True
            lane.status = "pruned"
            lane.note = str(data.get("reason") or "")
        elif kind == "vote" and data.get("answer") is not None:
            lane.answer = str(data["answer"])
            if lane.pruned:  # its answer came in before the prune took effect: it counts
                lane.pruned = False
                lane.status = "done"
                lane.note = ""
        elif kind not in _KNOWN:  # tool calls, graph nodes, a custom mode's own events
            details = {k: v for k, v in data.items() if k not in _SKIP_IN_LINES}
            lane.note = f"{kind} {_one_line(json.dumps(details, default=str), 60)}"
        agent["status"] = _status_text(lane)

    # -- plain lines -------------------------------------------------------------------------

    def _line(self, kind: str, name: str | None, data: dict[str, Any]) -> None:
        who = f"[{name}] " if name else ""
        if kind == "agent_finished":
            text = self.agents.get(name or "", {}).get("text", "")
            tokens = ""
            if "prompt_tokens" in data:
                tokens = (
                    f" [{data.get('label', 'turn')}: {data['prompt_tokens']} prompt tokens, "
                    f"{data.get('cached_tokens', 0)} cached, "
                    f"{data.get('completion_tokens', 0)} generated]"
                )
            detail = f"{data.get('finish_reason', 'stop')}{tokens}: {_one_line(text, 60)}"
        elif kind == "vote":
            detail = f"{data.get('answer')!r} -> {json.dumps(data.get('votes', self.votes))}"
        elif kind == "final":
            detail = _one_line(str(data.get("answer", "")), 80)
        else:
            detail = " ".join(
                f"{k}={round(v, 2) if isinstance(v, float) else v}"
                for k, v in data.items()
                if k not in _SKIP_IN_LINES and v is not None
            )
        print(f"{who}{kind} {detail}".rstrip(), file=self.out, flush=True)

    # -- the live lanes (a terminal) ------------------------------------------------------------

    def _draw(self) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.out, force_terminal=True)
            self._live = Live(
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
                vertical_overflow="visible",
            )
            self._live.start()
        self._live.update(self.render(self._live.console.width), refresh=True)

    def render(self, width: int = 100) -> Any:
        """The lanes, the votes and the round as one rich renderable."""
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        elapsed = time.monotonic() - self._started
        head = Text()
        head.append(" microagent ", style="bold black on cyan")
        head.append(f"  {len(self._lanes)} agents", style="bold")
        if self.round is not None:
            head.append(f"  ·  round {self.round}")
        head.append(f"  ·  {elapsed:.1f} s", style="dim")
        table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False, show_edge=False)
        table.add_column("agent", no_wrap=True, style="bold")
        table.add_column("status", no_wrap=True)
        table.add_column("tokens", justify="right", no_wrap=True, header_style="dim")
        table.add_column("output", no_wrap=True, overflow="ellipsis", ratio=1)
        room = max(20, width - 52)
        for name, lane in self._lanes.items():
            style = "dim strike" if lane.pruned else ""
            tail = lane.note if lane.status == "error" and lane.note else lane.text
            table.add_row(
                Text(name, style="dim" if lane.pruned else "bold"),
                _status_cell(lane),
                Text(
                    f"{lane.prompt_tokens}p {lane.cached_tokens}c {lane.completion_tokens}g"
                    if lane.turns
                    else "",
                    style="dim",
                ),
                Text(_one_line(tail, room), style=style),
            )
        parts: list[Any] = [head, table]
        if self.votes:
            total = max(1, sum(self.votes.values()))
            votes = Text(" votes  ", style="bold")
            for choice, count in sorted(self.votes.items(), key=lambda kv: -kv[1]):
                bar = "█" * max(1, round(12 * count / total)) if count else "▏"
                votes.append(f"{choice} ", style="bold")
                votes.append(bar, style="cyan")
                votes.append(f" {count}   ")
            parts.append(votes)
        if self.answer is not None:
            parts.append(Text(f" answer  {_one_line(self.answer, max(20, width - 10))}"))
        return Group(*parts)

    def finish(self) -> None:
        """Draw the last state and leave it on screen."""
        if self.tty:
            self._draw()
            live, self._live = self._live, None
            if live is not None:
                live.stop()


def _status_text(lane: _Lane) -> str:
    if lane.pruned:
        return "pruned"
    if lane.status == "done" and lane.answer is not None:
        return f"done ({lane.answer})"
    return lane.status


def _status_cell(lane: _Lane) -> Any:
    from rich.text import Text

    if lane.pruned:
        return Text("✂ pruned", style="bold magenta")
    if lane.status == "running":
        return Text(f"● {lane.label or 'running'}", style="yellow")
    if lane.status == "error":
        return Text("✗ error", style="bold red")
    if lane.status == "done":
        return Text(f"✓ {lane.answer}" if lane.answer else "✓ done", style="green")
    return Text("· waiting", style="dim")


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "…" + flat[-(limit - 1) :]


def summary_table(outcome: Any, seconds: float, *, engine_seconds: float | None = None) -> str:
    """The answer, a small token table (computed, cached, generated, saved) and the times.

    Args:
        outcome: the collaboration's ``Outcome``.
        seconds: how long the collaboration itself took.
        engine_seconds: how long preparing and starting the engine took, when it was
            started for this run (reported on its own line, never added in).
    """
    u = outcome.usage
    computed = u.prompt_tokens - u.cached_tokens
    pruned = sum(1 for a in outcome.agents if a.finish_reason == "pruned")
    rows = [
        ("prompt tokens computed", computed),
        ("prompt tokens cached", u.cached_tokens),
        ("completion tokens", u.completion_tokens),
        ("completion tokens saved", u.saved_completion_tokens),
        ("agents pruned", pruned),
    ]
    lines = [f"answer: {outcome.answer}"]
    if outcome.votes:
        lines.append("votes:  " + ", ".join(f"{k}={v}" for k, v in outcome.votes.items()))
    lines.append(
        f"mode: {outcome.mode}  rounds: {outcome.rounds}  early stop: {outcome.early_stopped}"
    )
    lines += [f"  {label:<26}{value:>8}" for label, value in rows]
    lines.append(f"  {'collaboration time':<26}{seconds:>7.2f}s")
    if engine_seconds is not None:
        lines.append(f"  {'engine start':<26}{engine_seconds:>7.2f}s")
    return "\n".join(lines)
