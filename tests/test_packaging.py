"""Packaging: the wheel holds only ``microagent/...``, every subpackage included."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
#: Folders of the repository that are not the package.
OUTSIDE = {"tests", "demos", "bench", "docs", "build", "dist", ".venv"}


def listed_packages() -> list[str]:
    """``[tool.setuptools] packages``: the package and each subpackage, one by one."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages: list[str] = config["tool"]["setuptools"]["packages"]
    return packages


def tree_packages() -> set[str]:
    """Every folder of the package with an ``__init__.py``, as an import name."""
    found = set()
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and (rel.parts[0] in OUTSIDE or rel.parts[0].startswith(".")):
            continue
        found.add(".".join(["microagent", *rel.parts]))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("microagent-*.whl")
    return built


def test_wheel_holds_only_the_microagent_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top <= {"microagent", *{n.split("/")[0] for n in names if ".dist-info/" in n}}, top
    assert not any(
        n.startswith(
            (
                "mailbox/",
                "actors/",
                "collab/",
                "testing/",
                "tests/",
                "demos/",
                "bench/",
                "server/",
                "engine_bridge/",
            )
        )
        for n in names
    )
    subpackages = (
        "actors",
        "mailbox",
        "engine_bridge",
        "server",
        "testing",
        "collab",
        "collab/graph",
        "collab/modes",
        "collab/trace",
    )
    for sub in subpackages:
        assert f"microagent/{sub}/__init__.py" in names
    assert "microagent/collab/modes/_vote.py" in names
    assert "microagent/py.typed" in names
    for asset in ("index.html", "app.js", "style.css"):  # the browser view at /ui
        assert f"microagent/server/ui/{asset}" in names
    assert not any("/tests/" in n or n.startswith("microagent/tests") for n in names)


def test_stdlib_mailbox_is_not_shadowed() -> None:
    import mailbox

    assert hasattr(mailbox, "Maildir"), mailbox.__file__  # the stdlib module, not ours


def test_pyproject_lists_every_package_of_the_tree_once() -> None:
    """A new folder (``console/``, ``cli/``, ``engine_bridge/scripted/`` …) is in the wheel
    only if ``pyproject.toml`` names it: the list and the tree agree."""
    listed = listed_packages()
    assert len(listed) == len(set(listed))
    assert set(listed) == tree_packages()


def test_the_wheel_holds_every_listed_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [
        package
        for package in listed_packages()
        if "/".join([*package.split("."), "__init__.py"]) not in names
    ]
    assert missing == []
    for module in ("engine_bridge/scripted/_engine.py", "engine_bridge/vllm/_models.py"):
        assert f"microagent/{module}" in names


def test_the_readme_layout_names_every_layer_and_engine_room() -> None:
    """The README's layout section matches the tree: each top-level package, each engine room."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    top = {p for p in listed_packages() if p.count(".") == 1}
    assert [p for p in top if f"`{p}`" not in layout] == []
    rooms = [p for p in listed_packages() if p.startswith("microagent.engine_bridge.")]
    assert [r for r in rooms if f"`engine_bridge/{r.rsplit('.', 1)[1]}/`" not in layout] == []
