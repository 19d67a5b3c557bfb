"""``microagent serve``'s options, and the engine options ``serve`` and ``run`` share.

They live with the server, not the command line, because ``microagent.cluster``
builds each replica's app from the same options (``serve_options``, then
``served_app``); the ``microagent`` command (``microagent.cli``) adds them to its
``serve`` and ``run`` subcommands with ``add_serve_options`` and
``add_engine_options``, beside vLLM's own engine flags (``_engine_flags``:
``engine_parser`` builds the parser, vLLM's ``FlexibleArgumentParser``). The
value types (``positive``, ``byte_size``…) turn a bad value into argparse's
usage error.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._engine_flags import ENGINE_SIZES_NOTE, engine_parser
from ._presets import preset_option
from ._remote import add_remote_options
from ._tool_flags import add_tool_call_options

#: Environment variables that hold API keys (several: comma-separated), read by ``serve``
#: besides ``--api-key``/``--api-key-file``: unlike an argument, they never show in ``ps``.
API_KEY_ENV = "MICROAGENT_API_KEY"
ADMIN_KEY_ENV = "MICROAGENT_ADMIN_KEY"


def _key_file(path: str, option: str) -> list[str]:
    """The keys of a key file: one a line; blank lines and ``#`` comments skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{option} {path}: cannot read it ({exc})") from None
    keys = [line.strip() for line in lines]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:  # an empty file would leave the server open: refuse it
        raise ValueError(f"{option} {path}: the file holds no key")
    return keys


def _env_keys(environ: Mapping[str, str], name: str) -> list[str]:
    return [k.strip() for k in environ.get(name, "").split(",") if k.strip()]


def serve_keys(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """``serve``'s API keys and admin keys: the options', their files' and the environment's
    (``API_KEY_ENV``, ``ADMIN_KEY_ENV``), each once, in that order.

    Raises:
        ValueError: a key file that cannot be read or holds no key, or a key that is both
            an API key and an admin key.
    """
    env = os.environ if environ is None else environ
    api = list(args.api_key)
    admin = list(args.admin_key)
    for path in args.api_key_file:
        api += _key_file(path, "--api-key-file")
    for path in args.admin_key_file:
        admin += _key_file(path, "--admin-key-file")
    api += _env_keys(env, API_KEY_ENV)
    admin += _env_keys(env, ADMIN_KEY_ENV)
    api, admin = list(dict.fromkeys(api)), list(dict.fromkeys(admin))
    if set(api) & set(admin):
        raise ValueError("a key is both an API key and an admin key: give each role its own")
    return api, admin


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key, value


def engine_value(value: str) -> Any:
    """An --engine-arg value: JSON when it parses (numbers, booleans, objects), else text."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _preset_value(text: str) -> list[tuple[str, Any]]:
    """A ``--preset`` value (``preset_option``), its errors argparse's usage errors."""
    try:
        return preset_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text}")
    return value


def positive(text: str) -> int:
    """An integer >= 1 (an argparse ``type``: a bad value is a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


_BYTE_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def byte_size(text: str) -> int:
    """A byte count: an integer, or one with a binary unit (``512MiB``, ``2GiB``)."""
    number, scale = text.strip(), 1
    for unit, factor in _BYTE_UNITS.items():
        if number.endswith(unit):
            number, scale = number[: -len(unit)].strip(), factor
            break
    try:
        value = int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes (an integer, or with KiB/MiB/GiB/TiB), got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected bytes >= 0, got {text}")
    return value


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """The engine options ``serve`` and ``run`` share (``make_bridges`` reads them).

    The engine's sizes (``--max-num-seqs``…) are vLLM's own flags, which
    ``engine_parser`` adds beside these where vLLM is importable.
    """
    g = p.add_argument_group("engine", ENGINE_SIZES_NOTE)
    g.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="MODEL",
        help="a model to serve: 'default' (the embedded SmolLM2-135M-Instruct), a local HF "
        "model dir, or a hub id; repeat it (or give MODEL first too) to serve several, each "
        "on an engine of its own with the same engine flags (default: default)",
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
        "--engine-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="any other vLLM AsyncEngineArgs field (VALUE parsed as JSON when it can be); "
        "with --engine scripted, a ScriptedEngine option (e.g. decode_time_per_token=0.01)",
    )
    g.add_argument(
        "--kv-host-bytes",
        type=byte_size,
        default=0,
        metavar="BYTES",
        help="RAM budget of a KV tier below the engine's cache, per model, e.g. 2GiB "
        "(default 0: off). vLLM's --kv-offloading-size N is read as the same tier of N GiB; "
        "give one of them, and no --kv-transfer-config beside it",
    )
    g.add_argument(
        "--kv-disk-bytes",
        type=byte_size,
        default=0,
        metavar="BYTES",
        help="disk budget of a KV file tier under the host tier, in $MICROAGENT_HOME/kv, "
        "e.g. 20GiB (default 0: off; needs --kv-host-bytes); it survives engine restarts",
    )
    g.add_argument(
        "--kv-tier-policy",
        choices=("sessions", "lru"),
        default=None,
        help="which host-tier blocks go first when it is full: 'sessions' keeps the blocks "
        "of conversations waiting on a tool and drops cold ones first; 'lru' is vLLM's own "
        "least-recently-used (default sessions; needs --kv-host-bytes; docs/tiers.md)",
    )
    add_verbose(g)
    g.add_argument(
        "--engine",
        choices=("vllm", "scripted"),
        default="vllm",
        help="'scripted' runs the deterministic ScriptedEngine test double (no model)",
    )


def add_verbose(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--verbose``: the engine libraries' own output instead of a log file."""
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show vLLM's, torch's and transformers' own log lines and warnings "
        "(default: kept in a log file; also MICROAGENT_LOG=info|debug)",
    )


def _json_list(text: str) -> list[str]:
    """A CORS option's value: a JSON list of strings, as vLLM takes it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(
            f"expected a JSON list of strings such as '[\"https://app.example\"]', got {text!r}"
        )
    return value


def add_cors_options(p: argparse.ArgumentParser) -> None:
    """vLLM's CORS front-end flags, with its names, JSON-list values and defaults
    (``served_app`` applies them with Starlette's ``CORSMiddleware``)."""
    g = p.add_argument_group(
        "CORS", "browser access from other origins, as `vllm serve` takes it (off by default)"
    )
    g.add_argument(
        "--allowed-origins",
        type=_json_list,
        default=[],
        metavar="JSON",
        help="origins a browser may call from, e.g. '[\"https://app.example\"]' or "
        "'[\"*\"]' (default []: cross-origin access is disabled)",
    )
    g.add_argument(
        "--allowed-methods",
        type=_json_list,
        default=["*"],
        metavar="JSON",
        help='methods allowed across origins (default ["*"])',
    )
    g.add_argument(
        "--allowed-headers",
        type=_json_list,
        default=["*"],
        metavar="JSON",
        help='request headers allowed across origins (default ["*"])',
    )
    g.add_argument(
        "--allow-credentials",
        action="store_true",
        help="allow credentials (cookies, Authorization) on cross-origin requests",
    )


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    """``microagent serve``'s options (also parsed alone by ``serve_options``)."""
    serve.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="the model to serve, as with `vllm serve MODEL` ('default', a local HF model "
        "dir, or a hub id; more with --model; default: default)",
    )
    add_engine_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require `Authorization: Bearer KEY` (all routes but /health and /metrics); "
        "repeatable, each key with its own quota. A key given here shows in `ps`: prefer "
        f"--api-key-file or ${API_KEY_ENV} (comma-separated keys)",
    )
    serve.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        metavar="PATH",
        help="read API keys from PATH: one key a line, blank lines and lines starting with "
        "# ignored (repeatable; the keys add to --api-key's)",
    )
    serve.add_argument(
        "--admin-key",
        action="append",
        default=[],
        help="the key that reads /metrics (the API keys get 403 there once any key is set; "
        f"with no key at all /metrics is open); repeatable; shows in `ps`: prefer "
        f"--admin-key-file or ${ADMIN_KEY_ENV}",
    )
    serve.add_argument(
        "--admin-key-file",
        action="append",
        default=[],
        metavar="PATH",
        help="read admin keys from PATH (the format of --api-key-file)",
    )
    serve.add_argument(
        "--key-max-concurrent",
        type=positive,
        default=None,
        help="requests in flight per API key before 429 (default: no limit)",
    )
    serve.add_argument(
        "--key-tokens-per-minute",
        type=positive,
        default=None,
        help="prompt + completion tokens per API key per sliding minute before 429 "
        "(default: no limit)",
    )
    serve.add_argument(
        "--max-request-tokens",
        type=positive,
        default=None,
        help="prompt + completion tokens one request may use, all its agents together; a "
        "worse declared worst case gets 400 naming max_tokens, a running collaboration that "
        "reaches it is stopped (default: 16 x the max_model_len of the request's model, "
        "4096 for a model that states none, e.g. 65536 at --max-model-len 4096; lower when "
        "--key-tokens-per-minute is lower)",
    )
    serve.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=300.0,
        metavar="SECONDS",
        help="wall-clock limit of one collaboration: a 504 when it runs longer; a request's "
        "collaboration.timeout may ask for less, more is a 400 (default 300)",
    )
    serve.add_argument(
        "--max-concurrent-collaborations",
        type=positive,
        default=64,
        help="collaborations at once before 429 (default 64)",
    )
    serve.add_argument(
        "--key-max-collaborations",
        type=positive,
        default=None,
        help="with several API keys: collaborations one key may run at once before 429, so "
        "no key holds every slot (default: half of --max-concurrent-collaborations, at "
        "least 1)",
    )
    serve.add_argument(
        "--max-agents", type=positive, default=128, help="agents per collaboration (default 128)"
    )
    serve.add_argument(
        "--max-agents-per-spec", type=positive, default=32, help="largest `count` (default 32)"
    )
    serve.add_argument(
        "--allow-code-validators",
        action="store_true",
        help="accept the python_tests validator (runs client code here, sandboxed)",
    )
    serve.add_argument(
        "--calculator",
        action="store_true",
        help="the built-in sandboxed calculator: the compute mode, auto's calculator option "
        "and a calculator tool agents may call (refused at startup where no sandbox can be built)",
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
    serve.add_argument(
        "--preset",
        action="append",
        type=_preset_value,
        default=[],
        dest="presets",
        metavar="NAME=FILE",
        help="serve the collaboration in FILE (JSON: agents, collaboration, optionally "
        "model, the served model that runs it; what `microagent eval` writes) as model NAME: "
        "a request naming it runs it, and /v1/models lists it; repeatable. In --config: "
        "`preset: {NAME: FILE}` (docs/presets.md)",
    )
    serve.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export each collaboration's OpenTelemetry trace and the GenAI metrics "
        "(semantic conventions) to this OTLP collector, e.g. http://127.0.0.1:6006 "
        "(Phoenix). Without it, OTEL_EXPORTER_OTLP_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT turns the export on; OTEL_SERVICE_NAME, "
        "OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf or grpc), OTEL_METRICS_EXPORTER=none "
        "and OTEL_SDK_DISABLED=true apply (docs/observability.md); off by default",
    )
    add_cors_options(serve)
    serve.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEMPLATE",
        help="the chat template of the model (the first, with several), as vLLM takes it: "
        "a file path, or the Jinja template itself inline; it renders every prompt instead "
        "of the tokenizer's template (default: the tokenizer's)",
    )
    add_tool_call_options(serve)
    sessions = serve.add_argument_group("sessions (KV kept for a client's next turn)")
    sessions.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=1800.0,
        metavar="SECONDS",
        help="how long a turn is retained when a request asks for caching without a "
        "lifetime (prompt_cache_retention=in_memory; prompt_cache_key alone until the "
        "key's gaps teach one; default 1800)",
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
        "when the request names no session, until the key's gaps teach one (default 120)",
    )
    sessions.add_argument(
        "--max-sessions-per-key",
        type=positive,
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
    sessions.add_argument(
        "--key-retention-share",
        type=_fraction,
        default=0.5,
        metavar="FRACTION",
        help="with several API keys: the part of each engine's retention budget one key's "
        "retained turns may hold together; past it the key's own oldest go (default 0.5)",
    )
    serve.add_argument(
        "--uvicorn-log-level",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        default=None,
        help="uvicorn's log level, as vLLM names it (default: warning, or info with "
        "--verbose; --log-level is vLLM's own)",
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


def serve_options(argv: Sequence[str]) -> argparse.Namespace:
    """``microagent serve``'s options parsed from ``argv`` (without the ``serve`` word),
    vLLM's engine flags and ``--config FILE`` included where vLLM is importable.

    Raises:
        ValueError: what ``microagent serve`` would refuse, with argparse's message.
    """
    parser = engine_parser(
        "microagent serve",
        add_serve_options,
        verbose="--verbose" in argv or None,
        raise_errors=True,
    )
    try:
        return parser.parse_args(list(argv), argparse.Namespace(command="serve"))
    except OSError as exc:  # --config FILE that cannot be read
        raise ValueError(f"--config: {exc}") from None
