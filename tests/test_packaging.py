"""Packaging: the wheel holds only ``microagent/...``; the public API is explicit and importable."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import microagent
import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("microagent-*.whl")
    return built


def test_wheel_holds_only_the_microagent_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top <= {"microagent", *{n.split("/")[0] for n in names if ".dist-info/" in n}}, top
    assert not any(n.startswith(("mailbox/", "actors/", "tests/", "demos/", "bench/", "server/", "engine_bridge/")) for n in names)
    for sub in ("actors", "mailbox", "engine_bridge", "server"):
        assert f"microagent/{sub}/__init__.py" in names
    assert "microagent/py.typed" in names
    assert not any("/tests/" in n or n.startswith("microagent/tests") for n in names)


def test_stdlib_mailbox_is_not_shadowed() -> None:
    import mailbox

    assert hasattr(mailbox, "Maildir"), mailbox.__file__  # the stdlib module, not ours


def _reexports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.asname is not None:
                    assert alias.asname == alias.name, f"{path}: re-export {alias.name} as {alias.asname}"
                    names.append(alias.name)
    return names


@pytest.mark.parametrize("package", ["", "actors", "mailbox", "engine_bridge", "server"])
def test_public_names_are_explicit_reexports(package: str) -> None:
    """Like trio's test_exports: every public name is re-exported as ``X as X`` and importable."""
    path = ROOT / package / "__init__.py"
    module = microagent if not package else getattr(__import__(f"microagent.{package}"), package)
    names = _reexports(path)
    assert names, path
    for name in names:
        if not name.startswith("_"):
            assert getattr(module, name) is not None


def test_top_level_api() -> None:
    for name in ("Runtime", "Actor", "KVHandle", "VLLMBridge", "ScriptedEngine", "vote", "debate", "reflect",
                 "aggregate", "cascade", "collaborate", "CollaborationOp", "register_mode", "AgentSpec", "Outcome"):
        assert hasattr(microagent, name), name
