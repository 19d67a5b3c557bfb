"""``evaluate``: greedy and every candidate on every item; choose on one part, report on the other.

The pipeline, one step each: split the items (``_split``), run every
configuration on every item through a runner with bounded concurrency, each reply
journaled as it arrives (``_journal``, so a rerun resumes), choose on the
selection part (``_selection``), report on the report part (``_report``).
A replay (``replay=True``) skips the run: every reply comes from the journal, so
the report is recomputed exactly as the recorded run computed it, with no engine
and no server.
``write_outputs`` writes the JSON report and, when a candidate was chosen, its
preset file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

import anyio
import attrs

from ._candidates import (
    DEFAULT_MAX_TOKENS,
    GREEDY,
    GREEDY_CANDIDATE,
    Candidate,
    JSONObject,
    default_budget,
    request_for,
)
from ._errors import JournalError, MissingReply
from ._grading import is_correct
from ._items import EvalItem
from ._journal import Journal, JournalKey, read_journal
from ._preset import preset_of, write_preset
from ._progress import Progress
from ._report import ConfigReport, config_report, render_table, score
from ._runner import Reply, Runner
from ._selection import Choice, Score, choose
from ._split import DEFAULT_SEED, DEFAULT_SELECT_FRACTION, split_items

#: collaborations in flight at once by default (the engine batches their requests)
DEFAULT_CONCURRENCY: Final = 4
#: most collaborations in flight at once
MAX_CONCURRENCY: Final = 256


@attrs.frozen
class EvalReport:
    """The outcome of an evaluation.

    Attributes:
        runner: where the requests ran (the runner's label).
        seed: the split's seed.
        select_fraction: the share of each family in the selection part.
        max_tokens: the completion budget of configurations that set none.
        candidates: the configurations evaluated, greedy first.
        selection_items: the selection part's item lines.
        report_items: the report part's item lines.
        selection: per configuration, its score on the selection part.
        choice: the configuration chosen there, and why.
        reports: per configuration, its numbers on the report part (greedy first).
        rows: per item and configuration: its part, answer and whether it was right.
        max_token_ratio: the selection's token budget as a multiple of greedy's (None:
            any cost).
    """

    runner: str
    seed: int
    select_fraction: float
    max_tokens: int
    candidates: tuple[Candidate, ...]
    selection_items: tuple[int, ...]
    report_items: tuple[int, ...]
    selection: dict[str, Score]
    choice: Choice
    reports: tuple[ConfigReport, ...]
    rows: tuple[JSONObject, ...]
    max_token_ratio: float | None = None

    @property
    def chosen(self) -> Candidate:
        """The chosen configuration (greedy when nothing beat it)."""
        return next(c for c in self.candidates if c.name == self.choice.name)

    def table(self) -> str:
        """The run as a readable table, with its verdict."""
        heading = (
            f"microagent eval: {len(self.selection_items) + len(self.report_items)} items "
            f"({len(self.selection_items)} selection, {len(self.report_items)} report; seed "
            f"{self.seed}), {_count(len(self.candidates) - 1, 'candidate')} against greedy, on "
            f"{self.runner}"
        )
        return render_table(self.selection, self.reports, self.choice, heading)

    def to_dict(self) -> JSONObject:
        """The report as JSON (the ``report.json`` that ``write_outputs`` writes)."""
        return {
            "runner": self.runner,
            "seed": self.seed,
            "select_fraction": self.select_fraction,
            "max_tokens": self.max_tokens,
            "max_token_ratio": self.max_token_ratio,
            "candidates": [
                {
                    "name": c.name,
                    "source": c.source,
                    "closed": c.closed.to_dict(),
                    "free": c.free.to_dict(),
                    "serve_args": list(c.serve_args),
                }
                for c in self.candidates
            ],
            "selection_items": list(self.selection_items),
            "report_items": list(self.report_items),
            "selection": {
                name: {**attrs.asdict(s), "accuracy": s.accuracy}
                for name, s in self.selection.items()
            },
            "choice": attrs.asdict(self.choice),
            "report": [attrs.asdict(r) for r in self.reports],
            "rows": list(self.rows),
        }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _first(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first leaf error of a task group's failure."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _key(label: str, candidate: Candidate, max_tokens: int, item: EvalItem) -> JournalKey:
    """A reply's journal key: the runner, the configuration with the budget it ran under
    when it sets none (the item's or the run's), and the item."""
    return (label, f"{candidate.fingerprint()}:{default_budget(item, max_tokens)}", item.key)


def _replayed_label(
    journal: Path, recorded: dict[JournalKey, Reply], needed: Callable[[str], list[JournalKey]]
) -> str:
    """The runner label a replay reads under: the journal's only one, or else the only
    one with a reply for every key ``needed(label)`` gives.

    Raises:
        JournalError: no reply recorded, or several runners that each cover the run.
    """
    labels = sorted({label for label, _, _ in recorded})
    if not labels:
        raise JournalError(f"{journal}: no reply recorded; nothing to replay")
    if len(labels) == 1:
        return labels[0]
    covering = [label for label in labels if all(k in recorded for k in needed(label))]
    if len(covering) == 1:
        return covering[0]
    raise JournalError(
        f"{journal}: replies of several runners ({', '.join(covering or labels)}); "
        "replay through the runner of the run to reproduce"
    )


async def _run_all(
    runner: Runner,
    todo: Sequence[tuple[Candidate, EvalItem]],
    replies: dict[JournalKey, Reply],
    max_tokens: int,
    journal: Path | None,
    concurrency: int,
    bar: Progress,
) -> None:
    """Run ``todo`` on ``runner``, ``concurrency`` at a time, each reply into ``replies``
    and the journal as it arrives."""
    bar.start()
    writer = Journal(journal) if journal is not None else None
    if writer is not None:
        writer.open()
    queue = iter(todo)  # workers take the next request in item order, one at a time

    async def worker() -> None:
        for candidate, item in queue:
            reply = await runner.run(request_for(candidate, item, max_tokens))
            key = _key(runner.label, candidate, max_tokens, item)
            replies[key] = reply
            if writer is not None:
                writer.append(key, candidate.name, reply)
            bar.advance()

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(min(concurrency, len(todo))):
                tg.start_soon(worker)
    except ExceptionGroup as group:  # the first worker's error, as the runner raised it
        raise _first(group) from group
    finally:
        if writer is not None:
            writer.close()


async def evaluate(
    items: Sequence[EvalItem],
    candidates: Sequence[Candidate],
    runner: Runner | None = None,
    *,
    seed: int = DEFAULT_SEED,
    select_fraction: float = DEFAULT_SELECT_FRACTION,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    journal: Path | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: TextIO | None = sys.stderr,
    replay: bool = False,
    max_token_ratio: float | None = None,
) -> EvalReport:
    """Run greedy and ``candidates`` on ``items``; choose on the selection part, report on
    the other.

    Args:
        items: the questions (``load_items``).
        candidates: the configurations to try against greedy (``load_candidates``).
        runner: where requests run: ``BridgeRunner`` (in process), ``HTTPRunner``, or
            any object with a ``label`` and an async ``run(request) -> Reply`` (tests
            inject a fake one here). None only for a replay.
        seed: the split's seed.
        select_fraction: each family's share in the selection part.
        max_tokens: the completion budget of configurations that set none.
        journal: a JSONL file each reply is appended to as it arrives; replies already
            there (same item, configuration and runner) are not run again.
        concurrency: collaborations in flight at once.
        progress: where the progress line goes (None: nowhere).
        replay: run nothing: recompute the report from ``journal``'s replies, under
            ``runner``'s label when one is given (it is never called), else the
            recorded one. The journal is only read.
        max_token_ratio: a candidate is eligible only within this multiple of greedy's
            completion tokens on the selection part (None: any cost).

    Raises:
        ValueError: a bad ``select_fraction`` or ``concurrency``; no runner for a run,
            no journal for a replay.
        MissingReply: a replay whose journal lacks a reply (naming the item's line and
            the configuration); nothing was run.
        EvalError: a journal that cannot be read back; the runner's own errors (a lost
            engine, an unreachable server) pass through, and the journal keeps what
            finished.
    """
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
    if max_token_ratio is not None and not max_token_ratio > 0:
        raise ValueError(f"max_token_ratio must be positive, got {max_token_ratio}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if replay and journal is None:
        raise ValueError("a replay needs the journal of the run it replays")
    if runner is None and not replay:
        raise ValueError("a run needs a runner (only a replay runs without one)")
    split = split_items(items, seed, select_fraction)
    configs = (GREEDY_CANDIDATE, *(c for c in candidates if c.name != GREEDY))
    replies: dict[JournalKey, Reply] = {}
    if journal is not None:
        replies.update(read_journal(journal, required=replay))
    work = [(c, i) for i in items for c in configs]
    if runner is not None:
        label = runner.label
    else:
        assert journal is not None  # a replay, checked above
        label = _replayed_label(
            journal, replies, lambda name: [_key(name, c, max_tokens, i) for c, i in work]
        )
    todo = [(c, i) for c, i in work if _key(label, c, max_tokens, i) not in replies]
    if replay and todo:
        candidate, item = todo[0]
        raise MissingReply(item.line, candidate.name, label)
    if runner is not None and not replay:
        bar = Progress(len(work), "requests", progress)
        bar.done = len(work) - len(todo)
        await _run_all(runner, todo, replies, max_tokens, journal, concurrency, bar)

    def of(candidate: Candidate, part: Sequence[EvalItem]) -> list[Reply]:
        return [replies[_key(label, candidate, max_tokens, i)] for i in part]

    selection = {c.name: score(split.selection, of(c, split.selection)) for c in configs}
    choice = choose(selection, max_token_ratio)  # the selection part's scores only
    greedy = of(GREEDY_CANDIDATE, split.report)
    reports = tuple(
        config_report(c.name, split.report, of(c, split.report), greedy) for c in configs
    )
    in_selection = {i.key for i in split.selection}
    rows = tuple(
        {
            "line": i.line,
            "family": i.family,
            "part": "selection" if i.key in in_selection else "report",
            "config": c.name,
            **attrs.asdict(r),
            "correct": is_correct(r.answer, i.answers, i.choices),
        }
        for c, i in work
        for r in [replies[_key(label, c, max_tokens, i)]]
    )
    return EvalReport(
        runner=label,
        seed=seed,
        select_fraction=select_fraction,
        max_tokens=max_tokens,
        candidates=configs,
        selection_items=tuple(i.line for i in split.selection),
        report_items=tuple(i.line for i in split.report),
        selection=selection,
        choice=choice,
        reports=reports,
        rows=rows,
        max_token_ratio=max_token_ratio,
    )


#: the files ``write_outputs`` writes in its folder
REPORT_FILE: Final = "report.json"
PRESET_FILE: Final = "preset.json"
TABLE_FILE: Final = "report.txt"


def write_outputs(report: EvalReport, out: Path) -> list[Path]:
    """Write ``report.json``, ``report.txt`` and, when a candidate beat greedy on the
    selection part, ``preset.json`` (the chosen configuration, ``_preset``) under ``out``.

    A ``preset.json`` left there by an earlier run is removed when greedy was chosen, so
    the folder never offers a preset its own report did not choose.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = report.to_dict()
    preset = out / PRESET_FILE
    if report.choice.beat_greedy:
        data["preset"] = {
            "file": str(preset),
            **preset_of(report.chosen),
            "serve_args": list(report.chosen.serve_args),
        }
    written = [out / REPORT_FILE, out / TABLE_FILE]
    (out / REPORT_FILE).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    (out / TABLE_FILE).write_text(report.table(), encoding="utf-8")
    if report.choice.beat_greedy:
        written.append(write_preset(report.chosen, preset))
    elif preset.exists():
        preset.unlink()
    return written
