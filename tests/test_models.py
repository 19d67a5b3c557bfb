"""Model resolution: the embedded default model, once-only atomic preparation, errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from microagent.engine_bridge import ModelPreparationError
from microagent.engine_bridge.vllm import _models as models
from microagent.engine_bridge.vllm._models import (
    is_prepared,
    model_home,
    prepare_dir,
    resolve_model,
)


def test_default_model_is_prepared_idempotently() -> None:
    path = resolve_model("default", progress=False)
    assert isinstance(path, Path)
    assert is_prepared(path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert list(path.glob("*.safetensors"))
    template = models.chat_template_of(path)
    assert template is not None and "<|im_start|>" in template
    stamps = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    t0 = time.monotonic()
    again = resolve_model("default", progress=False)
    elapsed = time.monotonic() - t0
    assert again == path
    assert elapsed < 0.5
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == stamps


def test_stale_temp_dir_beside_the_default_model_is_cleaned() -> None:
    path = resolve_model("default", progress=False)
    assert isinstance(path, Path)
    stale = path.parent / f".{path.name}.tmp-999999-1"
    stale.mkdir(exist_ok=True)
    (stale / "model.safetensors").write_bytes(b"half written")
    assert resolve_model("default", progress=False) == path
    assert not stale.exists()


def _builder(calls: list[int]) -> Callable[[Path, Callable[[str], None]], None]:
    def build(out: Path, step: Callable[[str], None]) -> None:
        calls.append(1)
        (out / "config.json").write_text("{}")
        step("built")

    return build


def test_prepare_dir_ignores_and_removes_half_written_temp_dirs(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    target.parent.mkdir(parents=True)
    stale = target.parent / ".m.tmp-123-456"
    stale.mkdir()
    (stale / "config.json").write_text("half")
    calls: list[int] = []
    assert prepare_dir(target, _builder(calls), progress=False) == target
    assert calls == [1]
    assert is_prepared(target)
    assert (target / "config.json").read_text() == "{}"
    assert not stale.exists()
    assert not list(target.parent.glob(".m.tmp-*"))
    # idempotent: the builder does not run again
    assert prepare_dir(target, _builder(calls), progress=False) == target
    assert calls == [1]


def test_prepare_dir_replaces_an_unmarked_target(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "leftover.bin").write_bytes(b"x")
    calls: list[int] = []
    prepare_dir(target, _builder(calls), progress=False)
    assert calls == [1]
    assert not (target / "leftover.bin").exists()
    assert is_prepared(target)


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def broken(out: Path, step: Callable[[str], None]) -> None:
        (out / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(ModelPreparationError, match="disk full"):
        prepare_dir(target, broken, progress=False)
    assert not target.exists()
    assert not list(tmp_path.glob(".m.tmp-*"))


def test_concurrent_preparations_build_once(tmp_path: Path) -> None:
    target = tmp_path / "m"
    calls: list[int] = []
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(prepare_dir(target, _builder(calls), progress=False))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target] * 4
    assert calls == [1]


def test_local_dirs_hub_ids_and_bad_paths(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    with pytest.raises(ModelPreparationError, match=r"config\.json"):
        resolve_model(str(model_dir))
    (model_dir / "config.json").write_text("{}")
    assert resolve_model(str(model_dir)) == model_dir.resolve()
    with pytest.raises(ModelPreparationError, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelPreparationError, match="does not exist"):
        resolve_model("./surely-not-a-model-dir")
    assert (
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_missing_gguf_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "_GGUF_PACKAGE", "no_such_package_xyz")
    monkeypatch.setattr(models, "_GGUF_DISTRIBUTION", "no-such-package-xyz")
    with pytest.raises(ModelPreparationError, match="no-such-package-xyz"):
        resolve_model("default", home=tmp_path, progress=False)
    target = tmp_path / "models" / models.DEFAULT_MODEL_NAME
    assert not target.exists()
    assert not list(target.parent.glob(f".{target.name}.tmp-*"))


def test_model_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MICROAGENT_HOME", str(tmp_path))
    assert model_home() == tmp_path
    assert model_home(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("MICROAGENT_HOME")
    assert "microagent" in str(model_home())
