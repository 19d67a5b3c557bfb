"""What ``microagent serve``'s options build: the engines, then the app over them.

``make_bridges`` turns the engine options (the models, ``--engine``, vLLM's
engine flags, ``--engine-arg``, the KV tiers) into bridges; ``served_app`` builds the whole
app ``serve`` runs, without starting anything. They live with the server, not
the command line, because ``microagent.cluster`` builds each Ray Serve replica
from the same options; ``microagent.cli`` calls them for ``serve`` and ``run``.
Option errors are ``CliError`` (exit status 1) or ``CliUsageError`` (status 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..collab.trace import otlp_tracing_from_env
from ..console import EngineLog, quiet_engine_logs
from ..engine_bridge import EngineBridge, VLLMBridge, check_chat_template, load_chat_template
from ..engine_bridge.scripted import ScriptedEngine
from ._engine_flags import bridge_settings, flag_name, given_engine_flags
from ._remote import make_remotes
from ._serve_options import engine_value, serve_keys
from ._tool_flags import apply_tool_format, tool_format_of

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ._shutdown import Drain


class CliError(Exception):
    """A bad option of ``microagent serve`` or ``run`` (the message says which), found
    while building their engines or app: the command prints it without a traceback and
    exits with status 1."""


class CliUsageError(CliError):
    """A bad option value found before anything starts: the command exits with status 2."""


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


def serve_models(args: argparse.Namespace) -> list[str]:
    """The models a command serves: ``serve``'s MODEL, then each ``--model`` (default:
    ``default``, the embedded model)."""
    first: str | None = getattr(args, "model_tag", None)
    return [*([first] if first else []), *(args.models or [])] or ["default"]


def make_bridges(args: argparse.Namespace) -> list[EngineBridge]:
    """One bridge per model (``--engine scripted``: a ScriptedEngine each).

    vLLM's engine flags the user gave apply to every model's engine alike
    (``bridge_settings``); ``--served-model-name`` names the first, ``--adapter``
    registers with the first.

    Raises:
        CliUsageError: a refused engine flag, or one thing said twice (the message names
            the flags).
        CliError: an ``--engine-arg`` the ScriptedEngine does not take, or two models
            serving one name.
    """
    models = serve_models(args)
    engine_args = {k: engine_value(v) for k, v in args.engine_arg}
    template = chat_template(args)
    if args.engine == "scripted":
        return _scripted(args, models, engine_args, template)
    try:
        settings = bridge_settings(args, engine_args)
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    bridges: list[EngineBridge] = []
    for i, model in enumerate(models):
        bridges.append(
            VLLMBridge(
                model,
                served_name=settings.served_name if i == 0 else None,
                adapters=dict(args.adapter) if i == 0 else None,
                chat_template=template if i == 0 else None,
                engine_args=settings.engine_args,
                **settings.bridge,  # type: ignore[arg-type]
            )
        )
    names = [b.model for b in bridges]
    if len(set(names)) != len(names):
        raise CliError(f"two models serve the same name: {names}")
    return bridges


def chat_template(args: argparse.Namespace) -> str | None:
    """``--chat-template``'s template (a file's text, or the value inline), parsed once
    so that a bad one stops the server before any engine starts; None when not given.

    Raises:
        CliUsageError: no file at a path-like value, or a template that is not valid
            Jinja (the message names ``--chat-template``).
    """
    value: str | None = getattr(args, "chat_template", None)
    if value is None:
        return None
    try:
        template = load_chat_template(value)
        check_chat_template(template)
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    return template


def _scripted(
    args: argparse.Namespace,
    models: Sequence[str],
    engine_args: dict[str, Any],
    template: str | None = None,
) -> list[EngineBridge]:
    """``--engine scripted``: ScriptedEngines; of vLLM's flags, only ``--max-num-seqs``."""
    given = given_engine_flags(args)
    if "max_num_seqs" in given:
        engine_args.setdefault("max_num_seqs", given.pop("max_num_seqs"))
    if given:
        names = ", ".join(flag_name(args, dest) for dest in sorted(given))
        raise CliError(f"--engine scripted takes no vLLM engine flag but --max-num-seqs: {names}")
    unknown = sorted(set(engine_args) - set(SCRIPTED_OPTIONS))
    if unknown:
        raise CliError(
            f"--engine scripted takes --engine-arg {', '.join(SCRIPTED_OPTIONS)}; "
            f"not {', '.join(unknown)}"
        )
    if args.kv_host_bytes or args.kv_disk_bytes or args.kv_tier_policy:
        raise CliError("--kv-host-bytes, --kv-disk-bytes and --kv-tier-policy need --engine vllm")
    engine_args.setdefault("history_limit", SCRIPTED_HISTORY)
    return [
        ScriptedEngine(
            model=m if m != "default" else "scripted",
            chat_template=template if i == 0 else None,
            **engine_args,
        )
        for i, m in enumerate(models)
    ]


def engine_log(args: argparse.Namespace, bridges: Sequence[EngineBridge]) -> EngineLog:
    """Quiet the engine libraries before any engine starts (only real engines are noisy).

    ``serve`` and ``run`` call it once their bridges exist, before opening them.
    """
    if any(isinstance(b, VLLMBridge) for b in bridges):
        return quiet_engine_logs(args.verbose or None)
    return EngineLog(verbose=True)


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
        CliUsageError: a bad ``--tool``, ``--mcp``, ``--remote``, key file or ``--preset``
            (a preset is checked as a request carrying its fields would be).
        CliError: a bad ``--engine-arg``, or two engines serving one name.
    """
    from ._app import create_app
    from ._presets import load_presets
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
        presets = load_presets(getattr(args, "presets", ()))
        tracing = otlp_tracing_from_env(args.otlp_endpoint)  # and the OTEL_* variables
        call_format = tool_format_of(args)  # --tool-call-parser, --enable-auto-tool-choice
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    bridges = make_bridges(args)
    apply_tool_format(bridges, call_format)
    log = engine_log(args, bridges)
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
    try:
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
            tracing=tracing,
            presets=presets,
        )
    except ValueError as exc:  # a bad preset: its file and field named
        raise CliUsageError(str(exc)) from None
    add_cors(app, args)
    return ServedApp(app, tuple(bridges), drain, log)


def add_cors(app: FastAPI, args: argparse.Namespace) -> None:
    """vLLM's CORS flags on ``app``, as ``vllm serve`` applies them: Starlette's
    ``CORSMiddleware``, outermost, so a browser's preflight is answered before the
    API key check (which it cannot pass) and every answer carries the headers."""
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=args.allowed_origins,
        allow_credentials=args.allow_credentials,
        allow_methods=args.allowed_methods,
        allow_headers=args.allowed_headers,
    )
