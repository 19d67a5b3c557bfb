"""Remote models at serve time: ``--remote NAME=URL`` options, and their failures as API errors.

A remote's key comes from an environment variable named on the command line
(``--remote-key NAME=ENV_VAR``), never from a request; the key is read when
the bridge opens and appears in no argument, log line or error body.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..engine_bridge import RemoteBridge, RemoteError, find_cause
from ._errors import ApiError


def add_remote_options(p: argparse.ArgumentParser) -> None:
    """The ``--remote``, ``--remote-key`` and ``--remote-model`` options of ``serve``."""
    g = p.add_argument_group("remote models (OpenAI-compatible endpoints)")
    g.add_argument(
        "--remote",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="serve the endpoint at URL (e.g. http://host:8000/v1) as model NAME: agents whose "
        "model is NAME run there; repeatable",
    )
    g.add_argument(
        "--remote-key",
        action="append",
        default=[],
        metavar="NAME=ENV_VAR",
        help="send the key held by environment variable ENV_VAR to remote NAME (never the key "
        "itself on the command line)",
    )
    g.add_argument(
        "--remote-model",
        action="append",
        default=[],
        metavar="NAME=MODEL_ID",
        help="the model id remote NAME's endpoint serves (default: NAME)",
    )
    g.add_argument(
        "--remote-cache-salt",
        action="append",
        default=[],
        metavar="NAME",
        help="remote NAME is a vLLM server: with several --api-key, send each key's cache "
        "salt (cache_salt) so keys never share its prefix cache; without it a salted "
        "request's cached_tokens from NAME is reported as 0 (repeatable)",
    )
    g.add_argument(
        "--remote-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="per attempt: to connect, and between bytes of a reply (default 60)",
    )
    g.add_argument(
        "--remote-attempts",
        type=int,
        default=4,
        metavar="N",
        help="requests per generation before the remote's error is final (default 4)",
    )


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in values:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{option} expects NAME=VALUE, got {text!r}")
        if name in out:
            raise ValueError(f"{option} names {name!r} twice")
        out[name] = value
    return out


def make_remotes(args: argparse.Namespace) -> list[RemoteBridge]:
    """One ``RemoteBridge`` per ``--remote``.

    Raises:
        ValueError: a malformed option, or a key or model id for an unknown remote.
    """
    urls = _pairs(args.remote, "--remote")
    keys = _pairs(args.remote_key, "--remote-key")
    models = _pairs(args.remote_model, "--remote-model")
    salted = set(getattr(args, "remote_cache_salt", ()))
    for option, named in (
        ("--remote-key", keys),
        ("--remote-model", models),
        ("--remote-cache-salt", dict.fromkeys(salted, "")),
    ):
        unknown = sorted(set(named) - set(urls))
        if unknown:
            raise ValueError(f"{option} names no --remote: {unknown}")
    for name, url in urls.items():
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--remote {name}: the URL must start with http:// or https://")
    if args.remote_attempts < 1:
        raise ValueError("--remote-attempts must be >= 1")
    return [
        RemoteBridge(
            name,
            url,
            model=models.get(name),
            api_key_env=keys.get(name),
            timeout=args.remote_timeout,
            max_attempts=args.remote_attempts,
            send_cache_salt=name in salted,
        )
        for name, url in urls.items()
    ]


def remote_cause(exc: BaseException | None) -> RemoteError | None:
    """The ``RemoteError`` behind ``exc``: itself, its ``cause``, its chain or a group member."""
    return find_cause(exc, RemoteError)


def remote_failure(exc: BaseException) -> ApiError | None:
    """A 502 naming the remote when a remote's failure caused ``exc`` (never its key)."""
    cause = remote_cause(exc)
    if cause is None:
        return None
    return ApiError(502, str(cause), param="agents.model", code="remote_error")
