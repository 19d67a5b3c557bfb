"""A quiet terminal: vLLM's, torch's and transformers' logs and warnings go to a file.

vLLM configures its logging from environment variables when it is first
imported, and its EngineCore and worker processes inherit the environment, so
``quiet_engine_logs()`` must run before the engine starts (the ``microagent``
command and the demos call it first thing). Quiet (the default), every log
record of ``vllm``, ``torch`` and ``transformers`` goes to
``$MICROAGENT_HOME/logs/engine-<pid>.log``; Python warnings from libraries are
ignored; torch's C++ warnings and progress bars are off. Verbose
(``--verbose``, or ``MICROAGENT_LOG=info|debug``) leaves everything as the
libraries print it.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import warnings
from pathlib import Path

import attrs

LOG_ENV = "MICROAGENT_LOG"
"""``quiet`` (the default), ``info`` (the libraries' own output) or ``debug`` (vLLM at DEBUG)."""

_CHILD_ENV = "MICROAGENT_ENGINE_LOG"  # tells the engine's own processes where to log
_KEEP_LOGS = 8
_MAX_MESSAGE = 400
_LIBRARY_LOGGERS = ("vllm", "torch", "transformers", "huggingface_hub", "accelerate")
_QUIET_ENV = {
    "PYTHONWARNINGS": "ignore",  # the engine's own processes start with no library warnings
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10's "[W… utils.cpp] Warning: NUMA binding…"
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",  # vLLM's "Loading safetensors checkpoint shards" bar
}
_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Died)\b:? ?.*$")


@attrs.frozen
class EngineLog:
    """Where the engine's output went.

    Attributes:
        verbose: the libraries print as they like (nothing was redirected).
        path: the file holding their log records when quiet; None when verbose.
    """

    verbose: bool
    path: Path | None = None

    def last_error(self) -> str | None:
        """The last exception line (``SomeError: message``) in the log file, if any."""
        if self.path is None:
            return None
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines[-400:]):
            if _EXCEPTION_LINE.match(line):
                return line.strip()
        return None

    def explain(self, message: str) -> str:
        """``message`` with the engine's own cause and where its full log is, on one line."""
        message = " ".join(message.split())  # a multi-line error (pydantic's) on one line
        if len(message) > _MAX_MESSAGE:
            message = message[: _MAX_MESSAGE - 1] + "…"
        cause = self.last_error()
        if cause and cause not in message:
            message = f"{message} (engine: {cause})"
        if self.path is not None:
            message = f"{message}; engine log: {self.path}"
        return message


def log_level(verbose: bool | None = None) -> str:
    """``quiet``, ``info`` or ``debug``: ``--verbose`` wins, then ``$MICROAGENT_LOG``."""
    if verbose:
        return "debug" if os.environ.get(LOG_ENV, "").lower() == "debug" else "info"
    value = os.environ.get(LOG_ENV, "quiet").strip().lower()
    if value in ("debug", "info", "verbose"):
        return "debug" if value == "debug" else "info"
    return "quiet"


def quiet_engine_logs(verbose: bool | None = None, *, home: Path | None = None) -> EngineLog:
    """Send the engine libraries' logs to a file and silence their warnings (unless verbose).

    Call it before the first engine starts: vLLM reads its logging settings
    once, and its subprocesses take them from the environment set here.

    Args:
        verbose: show the libraries' own output (default: ``$MICROAGENT_LOG``).
        home: the cache root for ``logs/`` (default ``$MICROAGENT_HOME`` or the user cache).

    Returns:
        Where the output went (``EngineLog.explain`` turns an engine error into one line).
    """
    level = log_level(verbose)
    if level == "debug":
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
    global _current
    if level != "quiet":
        _current = EngineLog(verbose=True)
        return _current
    path = _log_file(_logs_dir(home))
    if path is not None:
        config = path.with_name(f"logging-{os.getpid()}.json")
        config.write_text(json.dumps(_logging_config(path)))
        os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config)
        os.environ[_CHILD_ENV] = str(path)
    else:  # no writable cache: drop vLLM's records rather than print them
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
        os.environ[_CHILD_ENV] = os.devnull
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    _silence_this_process(path)
    _current = EngineLog(verbose=False, path=path)
    return _current


_current: EngineLog | None = None


def current_engine_log() -> EngineLog | None:
    """What the last ``quiet_engine_logs`` call in this process set up (None: never called)."""
    return _current


def _logs_dir(home: Path | None) -> Path:
    if home is not None:
        return home / "logs"
    env = os.environ.get("MICROAGENT_HOME")
    if env:
        return Path(env).expanduser() / "logs"
    import platformdirs

    return Path(platformdirs.user_cache_dir("microagent")) / "logs"


def _log_file(logs: Path) -> Path | None:
    """A fresh ``engine-<pid>.log`` in ``logs`` (None when it cannot be written)."""
    try:
        logs.mkdir(parents=True, exist_ok=True)
        _prune(logs)
        path = logs / f"engine-{os.getpid()}.log"
        path.write_text("")
    except OSError:
        return None
    return path


def _prune(logs: Path) -> None:
    """Keep the newest few engine logs; never those of a process still running."""
    for pattern in ("engine-*.log", "logging-*.json"):
        old = sorted(logs.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in old[_KEEP_LOGS:]:
            if not _alive(stale.stem.rpartition("-")[2]):
                stale.unlink(missing_ok=True)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _logging_config(path: Path) -> dict[str, object]:
    """The ``dictConfig`` vLLM applies in every process: its records into ``path``."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "engine": {
                "format": "%(asctime)s %(processName)s pid=%(process)d %(levelname)s "
                "[%(name)s] %(message)s"
            }
        },
        "handlers": {
            "engine": {
                "class": "logging.FileHandler",
                "filename": str(path),
                "mode": "a",
                "encoding": "utf-8",
                "formatter": "engine",
                "level": "INFO",
            }
        },
        "loggers": {
            name: {"handlers": ["engine"], "level": "INFO", "propagate": False}
            for name in _LIBRARY_LOGGERS
        },
    }


_HANDLED: set[str] = set()


def _silence_this_process(path: Path | None) -> None:
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"microagent(\.|$)")
    handler: logging.Handler = (
        logging.FileHandler(path, mode="a", encoding="utf-8")
        if path is not None
        else logging.NullHandler()
    )
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if name not in _HANDLED:
            _HANDLED.add(name)
            logger.addHandler(handler)
        logger.propagate = False


# The engine's processes (vLLM's EngineCore and its workers, started with
# multiprocessing's spawn) import the parent's main module, and so this one,
# before vLLM: records they log before vLLM configures logging go to the file too.
# (While spawn prepares a child, its process already has its own name.)
if os.environ.get(_CHILD_ENV) and multiprocessing.current_process().name != "MainProcess":
    _child_log = os.environ[_CHILD_ENV]
    _silence_this_process(None if _child_log == os.devnull else Path(_child_log))
