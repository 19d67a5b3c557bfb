"""``microagent eval``: the command line over ``evaluate`` and ``write_outputs``.

``add_eval_options`` adds its arguments to a parser (the ``microagent`` command's
``eval`` subcommand); ``cmd_eval`` runs it: reads the items and configurations
(errors name the line, field or file, exit status 2), runs them in process on
one ``VLLMBridge`` or over HTTP (``--base-url``), prints the table and writes
``report.json``, ``report.txt``, the journal and, when a candidate beat greedy on
the selection part, ``preset.json`` under ``--out``. Rerunning the same command
resumes from the journal; rerunning it with ``--replay`` recomputes the report from
the journal alone (no engine started, no request sent).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO

import anyio

from ..console import EngineStartFailed, open_engines, quiet_engine_logs
from ..engine_bridge import EngineBridgeError, VLLMBridge
from ._candidates import (
    BUILTIN,
    DEFAULT_CANDIDATES,
    DEFAULT_MAX_TOKENS,
    Candidate,
    load_candidates,
)
from ._errors import EvalError
from ._evaluate import DEFAULT_CONCURRENCY, EvalReport, evaluate, write_outputs
from ._http_runner import HTTPRunner
from ._items import EvalItem, load_items
from ._runner import BridgeRunner, Runner
from ._split import DEFAULT_SEED, DEFAULT_SELECT_FRACTION

#: exit statuses: a bad input, a run that could not finish
EXIT_USAGE: Final = 2
EXIT_FAILURE: Final = 1
#: the journal's name under ``--out``
JOURNAL_FILE: Final = "journal.jsonl"


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_eval_options(p: argparse.ArgumentParser) -> None:
    """``microagent eval``'s arguments."""
    p.add_argument("items", type=Path, help="a JSONL file of questions (docs/eval.md)")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="a configuration file (agents + collaboration) or a built-in candidate "
        f"({', '.join(BUILTIN)}); repeatable (default: {', '.join(DEFAULT_CANDIDATES)})",
    )
    p.add_argument(
        "--base-url",
        help="run over HTTP against this OpenAI-compatible microagent serve "
        "(default: in process, on one engine)",
    )
    p.add_argument(
        "--model",
        default="default",
        help="the model: in process, what VLLMBridge loads; over HTTP, the request's model "
        "(default: default)",
    )
    p.add_argument("--api-key", default="EMPTY", help="the bearer key over HTTP")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the split's seed")
    p.add_argument(
        "--select-fraction",
        type=_fraction,
        default=DEFAULT_SELECT_FRACTION,
        help=f"each family's share in the selection part (default {DEFAULT_SELECT_FRACTION})",
    )
    p.add_argument(
        "--out", type=Path, default=Path("eval-out"), help="output folder (default eval-out)"
    )
    p.add_argument(
        "--concurrency",
        type=_positive,
        default=DEFAULT_CONCURRENCY,
        help=f"collaborations in flight at once (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument("--limit", type=_positive, help="only the file's first N items")
    p.add_argument(
        "--max-tokens",
        type=_positive,
        default=DEFAULT_MAX_TOKENS,
        help=f"completion budget of configurations that set none (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--max-token-ratio",
        type=_positive_float,
        help="choose only among candidates within this multiple of greedy's completion "
        "tokens on the selection part (default: any cost)",
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="run nothing: recompute the report from --out's journal alone (every reply "
        "must be recorded there; no engine is started and no request is sent)",
    )


def _inputs(args: argparse.Namespace) -> tuple[list[EvalItem], list[Candidate]]:
    items = load_items(args.items)
    if args.limit is not None:
        items = items[: args.limit]
    return items, load_candidates(args.config)


async def _run(
    args: argparse.Namespace,
    items: Sequence[EvalItem],
    candidates: Sequence[Candidate],
    runner: Runner | None,
) -> EvalReport:
    async def run_on(where: Runner | None) -> EvalReport:
        return await evaluate(
            items,
            candidates,
            where,
            seed=args.seed,
            select_fraction=args.select_fraction,
            max_tokens=args.max_tokens,
            journal=args.out / JOURNAL_FILE,
            concurrency=args.concurrency,
            replay=args.replay,
            max_token_ratio=args.max_token_ratio,
        )

    if args.replay:  # the recorded replies only; --base-url names the runner to read under
        named = HTTPRunner(args.base_url, args.model) if args.base_url else None  # never run
        return await run_on(runner if runner is not None else named)
    if runner is not None:
        return await run_on(runner)
    if args.base_url:
        http = HTTPRunner(args.base_url, args.model, args.api_key)
        try:
            return await run_on(http)
        finally:
            await http.aclose()
    bridge = VLLMBridge(args.model)
    async with open_engines([bridge]):
        return await run_on(BridgeRunner(bridge))


def cmd_eval(
    args: argparse.Namespace, *, runner: Runner | None = None, out: TextIO | None = None
) -> int:
    """Run ``microagent eval`` with parsed ``args``; returns the exit status.

    Args:
        args: what ``add_eval_options``' parser parsed.
        runner: run requests here instead (tests inject a fake runner); default: in
            process on ``--model``, or over HTTP with ``--base-url``; with ``--replay``,
            none (the journal's recorded runner).
        out: where the table goes (default stdout); progress and errors go to stderr.
    """
    out = out if out is not None else sys.stdout
    try:
        items, candidates = _inputs(args)
    except (EvalError, OSError) as exc:
        print(f"microagent eval: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    need = sorted({a for c in candidates for a in c.serve_args})
    if args.base_url and need and runner is None and not args.replay:
        print(
            f"microagent eval: the candidates need the server started with {' '.join(need)}",
            file=sys.stderr,
        )
    in_process = runner is None and not args.base_url and not args.replay
    log = quiet_engine_logs() if in_process else None
    try:
        report = anyio.run(_run, args, items, candidates, runner, backend="asyncio")
    except (EvalError, EngineStartFailed, EngineBridgeError) as exc:
        message = str(exc) if log is None else log.explain(str(exc))
        if not args.replay:
            message += (
                f" (what finished is in {args.out / JOURNAL_FILE}; "
                "rerun the same command to resume)"
            )
        print(f"microagent eval: error: {message}", file=sys.stderr)
        return EXIT_FAILURE
    written = write_outputs(report, args.out)
    print(report.table(), file=out)
    print("written: " + ", ".join(str(p) for p in written), file=out)
    if report.choice.beat_greedy:
        preset = args.out / "preset.json"
        flags = " ".join(report.chosen.serve_args)
        print(
            f"serve it: microagent serve {flags + ' ' if flags else ''}"
            f"--preset {report.choice.name}={preset}",
            file=out,
        )
    return 0
