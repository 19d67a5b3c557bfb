"""Paired early stop and adaptive sampling on the real engine (issue 12, section 4).

Per item (a closed-choice question of ``bench/_collab_tasks.task_set()`` on its
own ~2 000-token context) one vote of 9 reason-then-answer voters runs with
``early_stop=False`` on one in-process vLLM engine, recorded: every delta's
token count (a bridge that logs its streams) and every ``vote`` and
``agent_finished`` event, in the one order the collaboration saw them. From
that record ``_early_stop_report.decide`` finds, offline and with the
library's own ``Tally``/``StopRule``, where each stop rule (exact, adaptive;
all at once, in waves) would have stopped, the completion tokens generated up
to then and the answer it would have given — on the same samples as the full
vote. Then, on the same items, the ``--live`` rules run for real with
``early_stop=True`` (new samples: vLLM's CPU backend refuses seeds), to show
that the live saving follows the offline estimate.

Writes ``bench/results/early_stop[_quick].json`` and ``..._tables.md``;
``--update`` rewrites its family page and headline row (``bench/report.py``). Refuses to
start when the 1-minute load average is above 0.5 (``--force`` to override;
then the table says so).

Usage: ``.venv/bin/python bench/early_stop.py [--quick] [--items N] [--update]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _early_stop_report as R  # noqa: E402
from _collab_tasks import Task, task_set, workload_context  # noqa: E402
from _sections import (  # noqa: E402
    FamilyReport,
    Headline,
    data_line,
    date_cell,
    machine,
    machine_cell,
    page,
    publish,
    quiet_load,
)

RESULTS = HERE / "results"
VOTE: dict[str, Any] = {
    "voters": 9,
    "style": "reason",
    "max_tokens": 48,
    "answer_tokens": 8,
    "temperature": 0.7,
}
CONTEXT_WORDS = 1200  # ``context_document``'s default: ~2 000 tokens
#: rules also run live (``early_stop=True``); ``--quick`` runs the first two
DEFAULT_LIVE = ("exact-all", "exact-w1", "window-w3")


# -- recording -------------------------------------------------------------------------


class _LoggedGeneration:
    """A ``Generation`` whose deltas are logged (request id, token count) as they are read."""

    def __init__(self, gen: Any, log: list[dict[str, Any]]) -> None:
        self._gen = gen
        self._log = log

    async def __aenter__(self) -> _LoggedGeneration:
        await self._gen.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._gen.__aexit__(exc_type, exc, tb)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        async for delta in self._gen:
            self._log.append(
                {"kind": "tokens", "request": delta.request_id, "n": len(delta.token_ids)}
            )
            yield delta

    def __getattr__(self, name: str) -> Any:  # request_id, result, output_ids…
        return getattr(self._gen, name)


class TokenLog:
    """Bridge mixin (``class B(TokenLog, VLLMBridge)``): logs every stream's deltas in ``log``.

    Instrumentation only: the collaboration's events carry delta text, not token
    counts. ``on_event`` appends the ``vote`` and ``agent_finished`` events to the
    same list, so the log is one order of everything the collaboration saw.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[dict[str, Any]] = []

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        return _LoggedGeneration(super().stream(*args, **kwargs), self.log)  # type: ignore[misc]

    def on_event(self, event: Any) -> None:
        """The collaboration's event sink: votes and finished requests go into the log."""
        if event.type == "vote":
            self.log.append(
                {
                    "kind": "vote",
                    "agent": event.agent,
                    "answer": event.data["answer"],
                    "t": event.time,
                }
            )
        elif event.type == "agent_finished":
            self.log.append(
                {"kind": "finished", "agent": event.agent, "request": event.data["request_id"]}
            )


def compact(log: Sequence[Mapping[str, Any]], outcome: Any) -> dict[str, Any]:
    """One recorded vote: per voter (index order) its answer and tokens; per arriving vote
    (arrival order) its voter, answer, time and every voter's tokens so far."""
    voters = [a for a in outcome.agents if a.role == "voter"]
    index = {a.name: i for i, a in enumerate(voters)}
    owner = {
        e["request"]: index[e["agent"]]
        for e in log
        if e["kind"] == "finished" and e["agent"] in index
    }
    cum = [0] * len(voters)
    arrivals = []
    for e in log:
        if e["kind"] == "tokens" and e["request"] in owner:
            cum[owner[e["request"]]] += e["n"]
        elif e["kind"] == "vote" and e["agent"] in index:
            arrivals.append(
                {
                    "voter": index[e["agent"]],
                    "answer": e["answer"],
                    "t": round(e["t"], 4),
                    "tokens": list(cum),
                }
            )
    tokens = [a.completion_tokens for a in voters]
    return {
        "answer": outcome.answer,
        "answers": [a.answer or "" for a in voters],
        "tokens": tokens,
        "arrivals": arrivals,
        "log_matches": cum == tokens and len(arrivals) == len(voters),
        "wall_s": round(outcome.wall_time, 4),
    }


# -- runs ------------------------------------------------------------------------------


async def record_vote(bridge: Any, task: Task, context: str) -> dict[str, Any]:
    """The full vote-9 on ``task``, recorded (``early_stop=False``)."""
    import microagent as M

    bridge.log.clear()
    out = await M.vote(
        bridge,
        context,
        choices=list(task.choices),
        early_stop=False,
        on_event=bridge.on_event,
        **VOTE,
    )
    rec = compact(bridge.log, out)
    bridge.log.clear()
    return {
        "id": task.id,
        "kind": task.kind,
        "gold": task.answer,
        "choices": list(task.choices),
        **rec,
    }


async def live_vote(bridge: Any, task: Task, context: str, rule: R.Rule) -> dict[str, Any]:
    """One real early-stopped vote under ``rule`` (new samples)."""
    import microagent as M

    out = await M.vote(bridge, context, choices=list(task.choices), **VOTE, **rule.options())
    bridge.log.clear()
    return {
        "id": task.id,
        "rule": rule.key,
        "answer": out.answer,
        "completion_tokens": out.usage.completion_tokens,
        "samples": int(out.details.get("samples", 0)),
        "early_stopped": out.early_stopped,
        "stopped_by": out.details.get("stopped_by"),
        "wall_s": round(out.wall_time, 4),
    }


def make_bridge() -> Any:
    """The bench's one engine: ``bench/collab.py``'s settings, streams logged."""
    from _collab_engines import SETTINGS
    from microagent import VLLMBridge

    class LoggedVLLM(TokenLog, VLLMBridge):  # type: ignore[misc]
        pass

    os.environ["VLLM_CPU_KVCACHE_SPACE"] = SETTINGS["kv_cache_gib"]
    return LoggedVLLM(
        "default",
        max_num_batched_tokens=SETTINGS["max_num_batched_tokens"],
        max_num_seqs=SETTINGS["max_num_seqs"],
        max_model_len=SETTINGS["max_model_len"],
        progress=False,
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import vllm

    live = [R.RULE_BY_KEY[k] for k in args.live]
    tasks = task_set()[: args.items]
    bridge = make_bridge()
    items: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    await bridge.open()
    print(f"engine started in {time.monotonic() - t0:.0f} s", flush=True)
    try:
        for k, task in enumerate(tasks):
            context = workload_context(70_000 + task.id, task)
            # the recorded vote and the live ones in turn, each from a cold prefix cache
            order: list[R.Rule | None] = [None, *live]
            order = order[k % len(order) :] + order[: k % len(order)]
            for rule in order:
                await bridge.reset_prefix_cache()
                if rule is None:
                    rec = await record_vote(bridge, task, context)
                    items.append(rec)
                    print(
                        f"item {task.id:3d} full: {sum(rec['tokens']):4d} tokens, "
                        f"{rec['wall_s']:.1f} s, votes {rec['answers']} -> {rec['answer']!r}",
                        flush=True,
                    )
                else:
                    run = await live_vote(bridge, task, context, rule)
                    runs.append(run)
                    print(
                        f"item {task.id:3d} {rule.key}: {run['completion_tokens']:4d} tokens, "
                        f"{run['wall_s']:.1f} s, {run['samples']} samples -> {run['answer']!r}",
                        flush=True,
                    )
        model = bridge.model
    finally:
        await bridge.close()
    return {
        "settings": {
            **VOTE,
            "model": model,
            "vllm": getattr(vllm, "__version__", "?"),
            "context_words": CONTEXT_WORDS,
            "items": len(tasks),
        },
        "live_rules": [r.key for r in live],
        "items": sorted(items, key=lambda r: r["id"]),
        "live": runs,
        "command": "python bench/early_stop.py " + " ".join(sys.argv[1:]),
    }


def family_report(results: Path = RESULTS) -> FamilyReport:
    """The early-stop page and headline, from ``early_stop.json`` in ``results``."""
    data = json.loads((results / "early_stop.json").read_text())
    summary = R.summarize(data)
    target = summary["target"]
    adaptive = [r for r in summary["rules"] if not r["exact"]]
    best_adaptive = max(adaptive, key=lambda r: r["saved_pct"]) if adaptive else None
    line = (
        f"Paired on {summary['full']['items']} vote-9 items (the same samples): the exact rule "
        f"({target['best_rule']}) saves {target['saved_pct']:.1f} % of the completion tokens "
        f"with {target['agreement_pct']:.0f} % of the answers equal to the full vote"
    )
    if best_adaptive is not None:
        line += (
            f"; the adaptive rule ({best_adaptive['label']}) saves "
            f"{best_adaptive['saved_pct']:.1f} % with {best_adaptive['agree']}/"
            f"{best_adaptive['items']} answers equal (no guarantee)"
        )
    return FamilyReport(
        family="early_stop",
        title="Paired early stop",
        headline=Headline(
            figure="completion tokens saved by exact early stop, vote-9 reason-then-answer",
            value=f"{target['saved_pct']:.1f} % ({target['agreement_pct']:.0f} % answers equal)",
            baseline="the full vote on the same samples",
            target=f">= {100 * R.TARGET_SAVED:.0f} %: {'met' if target['met'] else 'not met'}",
            machine=machine_cell(data["machine"]),
            date=date_cell(data["machine"]),
        ),
        summary=line + ".",
        page=page(
            "Paired early stop (`bench/early_stop.py`)",
            __doc__,
            [("Results", R.tables(data, summary) + "\n" + data_line("early_stop.json"))],
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 items")
    parser.add_argument("--items", type=int, default=None, help="items (default 60)")
    parser.add_argument(
        "--live",
        nargs="*",
        default=None,
        choices=list(R.RULE_BY_KEY),
        help=f"rules also run for real with early_stop=True (default {' '.join(DEFAULT_LIVE)}; "
        "--quick: the first two; none given: offline only)",
    )
    parser.add_argument("--force", action="store_true", help="run even on a busy machine")
    parser.add_argument("--update", action="store_true", help="rewrite the family page and row")
    args = parser.parse_args()
    args.items = args.items or (20 if args.quick else 60)
    if args.live is None:
        args.live = list(DEFAULT_LIVE[:2] if args.quick else DEFAULT_LIVE)
    load = quiet_load(args.force, 0.5)
    if load is None:
        return 2
    started = time.time()
    data = asyncio.run(main_async(args))
    data["machine"] = machine(load, bool(args.force and load > 0.5), started)
    RESULTS.mkdir(exist_ok=True)
    stem = "early_stop_quick" if args.quick else "early_stop"
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=1))
    tables = R.tables(data)
    (RESULTS / f"{stem}_tables.md").write_text(tables)
    print(tables)
    if args.update and not args.quick:
        publish(HERE.parent, family_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
