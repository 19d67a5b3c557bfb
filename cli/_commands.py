"""The ``microagent`` command line: ``serve``, ``run``, ``prepare`` and ``eval``.

``serve`` runs the OpenAI-compatible server on uvloop over one vLLM engine per
``--model``; ``run`` runs one collaboration in-process and shows every agent
live; ``prepare`` converts a model ahead of time. Errors go to stderr with a
non-zero exit status, never a traceback for a user mistake.

What the server needs to build its app from these options (``served_app``,
``make_bridges``, serve's options) lives in ``microagent.server``, because
``microagent.cluster`` builds its replicas from the same options; the commands
here only parse, call it, and run it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import anyio

from ..collab import AgentSpec, CollaborationFailed, InvalidCollaboration, collaborate
from ..collab.trace import TraceRecorder, plot_timeline
from ..console import (
    EngineLog,
    EngineStartFailed,
    LiveView,
    log_level,
    open_engines,
    summary_table,
)
from ..engine_bridge import (
    EngineBridge,
    EngineBridgeError,
    VLLMBridge,
)
from ..evaluation._command import cmd_eval
from ..server import CliError, served_app
from ..server._served import CliUsageError, engine_log, make_bridges
from ._parser import build_parser
from ._prepare import cmd_prepare

EXIT_USAGE = 2
EXIT_FAILURE = 1

DEFAULT_AGENT_NAMES = {
    "vote": "voter",
    "debate": "debater",
    "reflect": "worker",
    "aggregate": "proposer",
}


# -- output --------------------------------------------------------------------------------


def _start_error(exc: EngineStartFailed, log: EngineLog) -> CliError:
    return CliError(log.explain(str(exc)))


def _async_run(fn: Callable[..., Any], *args: Any) -> Any:
    return anyio.run(
        fn, *args, backend="asyncio", backend_options={"use_uvloop": sys.platform != "win32"}
    )


# -- serve -------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        served = served_app(args)
    except CliUsageError as exc:
        print(f"microagent serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    quiet = log_level(args.verbose or None) == "quiet"
    level = args.uvicorn_log_level or ("warning" if quiet else "info")
    try:
        _async_run(_serve, args, served.app, served.bridges, level, served.drain)
    except EngineStartFailed as exc:
        raise _start_error(exc, served.log) from None
    return 0


async def _serve(
    args: argparse.Namespace, app: Any, bridges: Sequence[EngineBridge], level: str, drain: Any
) -> None:
    """Open the engines (with progress) on this loop, then serve until stopped (SIGTERM drains)."""
    import uvicorn

    from ..server._shutdown import DrainingServer

    class Server(DrainingServer):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                base = f"http://{args.host}:{args.port}"
                print(
                    f"microagent serving {', '.join(b.model for b in bridges)} on {base}/v1"
                    f"  ·  live view: {base}/ui  (Ctrl-C stops)",
                    file=sys.stderr,
                    flush=True,
                )

    async with open_engines(bridges):
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=level, timeout_graceful_shutdown=5
        )
        await Server(config, drain).serve()


# -- run ---------------------------------------------------------------------------------


def _messages(args: argparse.Namespace) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if args.context_file is not None:
        try:
            context_text = args.context_file.read_text()
        except OSError as exc:
            raise CliError(
                f"cannot read --context-file {str(args.context_file)!r}: {exc.strerror}"
            ) from None
        messages.append({"role": "system", "content": context_text})
    messages.append({"role": "user", "content": args.question})
    return messages


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"max_tokens": args.max_tokens, "early_stop": not args.no_early_stop}
    if args.choices:
        choices = [c.strip() for c in args.choices.split(",") if c.strip()]
        options["answer"] = {"choices": choices}
    if args.rounds is not None:
        options["rounds"] = args.rounds
    if args.temperature is not None:
        options["temperature"] = args.temperature
    return options


async def _run_collaboration(
    args: argparse.Namespace, bridges: Sequence[EngineBridge], out: TextIO
) -> int:
    from ..server import collaboration_response

    bridge = bridges[0]
    messages = _messages(args)
    options = _options(args)
    agents = [AgentSpec(name=DEFAULT_AGENT_NAMES.get(args.mode, "agent"), count=args.agents)]
    view = LiveView(out if not args.json else sys.stderr, tty=None if not args.json else False)
    recorder = TraceRecorder(forward=view)
    async with open_engines(bridges) as started:
        context = bridge.chat.context(messages)
        t0 = time.monotonic()
        outcome = await collaborate(
            bridge,
            args.mode,
            context,
            agents,
            engines={b.model: b for b in bridges},
            on_event=recorder,
            **options,
        )
        seconds = time.monotonic() - t0
        view.finish()
    recorder.set_outcome(outcome)
    if args.trace is not None:  # Chrome / Perfetto trace-event JSON, one track per actor
        recorder.write_trace(args.trace)
        print(f"trace written to {args.trace}", file=sys.stderr)
    if args.timeline is not None:
        plot_timeline(recorder, args.timeline)
        print(f"timeline written to {args.timeline}", file=sys.stderr)
    if args.json:
        print(json.dumps(collaboration_response(outcome, bridge.model), indent=2), file=out)
    else:
        engine = started.seconds if any(isinstance(b, VLLMBridge) for b in bridges) else None
        print(summary_table(outcome, seconds, engine_seconds=engine), file=out)
    return 0


def cmd_run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    bridges = make_bridges(args)
    log = engine_log(args, bridges)
    try:
        return int(_async_run(_run_collaboration, args, bridges, out))
    except InvalidCollaboration as exc:
        raise CliError(f"invalid collaboration: {exc}") from None
    except EngineStartFailed as exc:
        raise _start_error(exc, log) from None
    except (CollaborationFailed, EngineBridgeError) as exc:
        raise CliError(log.explain(f"collaboration failed: {exc}")) from None


# -- entry point -----------------------------------------------------------------------------


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "run": cmd_run,
    "prepare": cmd_prepare,
    "eval": cmd_eval,  # microagent.evaluation's command (docs/eval.md)
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``microagent`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"microagent {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
