"""Packaging: the wheel holds only ``microagent/...``, every subpackage included."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


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
