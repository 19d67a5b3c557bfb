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
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import attrs

from ..collab import (
    AgentSpec,
    CollaborationFailed,
    InvalidCollaboration,
    TraceRecorder,
    collaborate,
    plot_timeline,
)
from ..collab.trace import otlp_tracing
from ..console import (
    EngineLog,
    EngineStartFailed,
    LiveView,
    log_level,
    open_engines,
    quiet_engine_logs,
    showing,
    summary_table,
)
from ..engine_bridge import (
    EngineBridge,
    EngineBridgeError,
    ModelPreparationError,
    ScriptedEngine,
    VLLMBridge,
    resolve_model,
)
from ._cli_args import KV_TIER_ENGINE_ARGS, build_parser, engine_value, serve_keys
from ._remote import make_remotes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ._shutdown import Drain

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


class CliUsageError(CliError):
    """A bad option value found before anything starts: exit status 2 (``EXIT_USAGE``)."""


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
    engine_args = {k: engine_value(v) for k, v in args.engine_arg}
    if args.engine == "scripted":
        unknown = sorted(set(engine_args) - set(SCRIPTED_OPTIONS))
        if unknown:
            raise CliError(
                f"--engine scripted takes --engine-arg {', '.join(SCRIPTED_OPTIONS)}; "
                f"not {', '.join(unknown)}"
            )
        if args.kv_host_bytes or args.kv_disk_bytes:
            raise CliError("--kv-host-bytes and --kv-disk-bytes need --engine vllm")
        engine_args.setdefault("history_limit", SCRIPTED_HISTORY)
        return [
            ScriptedEngine(model=m if m != "default" else "scripted", **engine_args) for m in models
        ]
    _check_kv_tiers(args, engine_args)
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
                host_tier_bytes=args.kv_host_bytes,
                disk_tier_bytes=args.kv_disk_bytes,
            )
        )
    names = [b.model for b in bridges]
    if len(set(names)) != len(names):
        raise CliError(f"two --model values serve the same name: {names}")
    return bridges


def _check_kv_tiers(args: argparse.Namespace, engine_args: dict[str, Any]) -> None:
    """One KV tier, said one way: our budgets or vLLM's own offloading, never both."""
    if args.kv_disk_bytes and not args.kv_host_bytes:
        raise CliError("--kv-disk-bytes needs --kv-host-bytes: the file tier sits under RAM")
    doubled = [k for k in KV_TIER_ENGINE_ARGS if k in engine_args]
    if args.kv_host_bytes and doubled:
        raise CliError(
            f"--kv-host-bytes and --engine-arg {'/'.join(doubled)} each configure a KV tier "
            "below the engine's cache: give one of them"
        )


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


@attrs.frozen
class ServedApp:
    """What ``microagent serve``'s options build: the app, its engines (not yet open) and
    its drain. ``microagent.cluster`` builds one per Ray Serve replica from the same options.

    Attributes:
        app: the ASGI app (``create_app``; it opens ``bridges`` itself only when asked).
        bridges: the served engines, local then remote.
        drain: the graceful-shutdown state.
        log: the engine libraries' log state (explains an engine that failed to start).
    """

    app: FastAPI
    bridges: tuple[EngineBridge, ...]
    drain: Drain
    log: EngineLog


def served_app(args: argparse.Namespace, *, open_engines: bool = False) -> ServedApp:
    """The app ``microagent serve`` (parsed ``args``) serves; nothing starts yet.

    Raises:
        CliUsageError: a bad ``--tool``, ``--mcp``, ``--remote`` or key file.
        CliError: a bad ``--engine-arg``, or two engines serving one name.
    """
    from ._app import create_app
    from ._quota import KeyQuota
    from ._sessions import SessionSettings
    from ._shutdown import Drain
    from ._state import ServerLimits
    from ._tools import builtin_calculator, load_tool, mcp_server

    try:  # before any engine starts: a bad --tool, --mcp or --remote fails at once
        tools = [load_tool(spec) for spec in args.tool]
        if args.calculator:
            tools.append(builtin_calculator())
        mcp_servers = dict(mcp_server(spec) for spec in args.mcp)
        remotes = make_remotes(args)
        api_keys, admin_keys = serve_keys(args)
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
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
        allow_calculator=args.calculator,
        max_collaboration_tokens=args.max_request_tokens,
        request_timeout=args.request_timeout,
        max_collaborations_per_key=args.key_max_collaborations,
        key_quota=KeyQuota(
            max_concurrent=args.key_max_concurrent,
            tokens_per_minute=args.key_tokens_per_minute,
        ),
    )
    drain = Drain(grace=args.grace)
    app = create_app(
        {b.model: b for b in bridges},
        api_key=api_keys,
        admin_key=admin_keys,
        limits=limits,
        open_engines=open_engines,
        tools=tools,
        mcp_servers=mcp_servers,
        drain=drain,
        sessions=SessionSettings(
            default_ttl=min(args.session_ttl, args.session_ttl_max),
            max_ttl=args.session_ttl_max,
            tool_call_ttl=min(args.tool_call_ttl, args.session_ttl_max),
            max_per_key=args.max_sessions_per_key,
            shared_cache=args.shared_prefix_cache,
            key_retention_share=args.key_retention_share,
        ),
        tracing=otlp_tracing(args.otlp_endpoint) if args.otlp_endpoint else None,
    )
    return ServedApp(app, tuple(bridges), drain, log)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        served = served_app(args)
    except CliUsageError as exc:
        print(f"microagent serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    quiet = log_level(args.verbose or None) == "quiet"
    level = args.log_level or ("warning" if quiet else "info")
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
    from ._render import collaboration_response

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
