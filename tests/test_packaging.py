"""Packaging: the wheel holds only ``microagent/...``, every subpackage included, and
every third-party module the package imports is declared in pyproject.toml."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


# -- every import declared -----------------------------------------------------------------

#: Third-party modules the package imports without declaring them, each with why.
UNDECLARED_ON_PURPOSE = {
    # OTEL_EXPORTER_OTLP_PROTOCOL=grpc asks for it; without it the error names the package
    "opentelemetry-exporter-otlp-proto-grpc": "optional OTLP/gRPC exporter",
}

_NOT_PACKAGE = {"tests", "demos", "bench", "build", "docs", "dist"}


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _declared(*, extras: bool) -> set[str]:
    """Canonical names of the distributions pyproject declares (base, plus every extra)."""
    project = _pyproject()["project"]
    lines = list(project["dependencies"])
    if extras:
        lines += [r for group in project["optional-dependencies"].values() for r in group]
    names = {canonicalize_name(Requirement(line).name) for line in lines}
    return names - {"microagent"}


def _package_sources() -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*.py")
        if not ({p.relative_to(ROOT).parts[0]} & _NOT_PACKAGE or ".venv" in str(p))
        and not p.relative_to(ROOT).parts[0].endswith(".egg-info")
    ]


def _dynamic_module(call: ast.Call) -> str | None:
    """``__import__("a.b")`` / ``import_module(f"a.b.{x}")``: the module's constant part."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name not in ("__import__", "import_module") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value.rsplit(".", 1)[0] or None
    return None


def third_party_imports(source: str) -> set[str]:
    """Absolute module names ``source`` imports (statements and dynamic imports), stdlib out."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call) and (module := _dynamic_module(node)):
            found.add(module)
    return {
        m
        for m in found
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "microagent"
    }


@functools.cache
def _top_level_owners() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


def distributions_of(module: str) -> set[str]:
    """The installed distributions that provide ``module`` (a namespace package such as
    ``opentelemetry`` is split over several: the one holding the submodule's files)."""
    candidates = _top_level_owners().get(module.split(".")[0], [])
    if len(set(candidates)) <= 1:
        return {canonicalize_name(d) for d in candidates}
    path = module.replace(".", "/")
    owners = set()
    for dist in set(candidates):
        files = importlib.metadata.distribution(dist).files or []
        if any(str(f) == f"{path}.py" or str(f).startswith(f"{path}/") for f in files):
            owners.add(canonicalize_name(dist))
    return owners


def test_every_third_party_import_is_declared() -> None:
    declared = _declared(extras=True) | set(UNDECLARED_ON_PURPOSE)
    missing: dict[str, set[str]] = {}
    for path in _package_sources():
        for module in third_party_imports(path.read_text(encoding="utf-8")):
            owners = distributions_of(module)
            assert owners, f"{path.relative_to(ROOT)} imports {module!r}, installed by nothing"
            if not owners & declared:
                missing.setdefault(f"{module} ({', '.join(sorted(owners))})", set()).add(
                    str(path.relative_to(ROOT))
                )
    assert missing == {}, "imported but declared in no dependency list of pyproject.toml"


def test_the_import_reader_sees_every_kind_of_import() -> None:
    source = (
        "import os, numpy.linalg\nfrom yaml import safe_load\nfrom . import sibling\n"
        "def f(kind):\n    import torch\n    __import__(f'opentelemetry.exporter.otlp.proto"
        ".http.{kind}_exporter')\n    importlib.import_module('vllm.engine.arg_utils')\n"
    )
    assert third_party_imports(source) == {
        "numpy.linalg",
        "yaml",
        "torch",
        "opentelemetry.exporter.otlp.proto.http",
        "vllm.engine.arg_utils",
    }
    assert distributions_of("opentelemetry.sdk.trace") == {"opentelemetry-sdk"}
    assert distributions_of("opentelemetry.trace") == {"opentelemetry-api"}


def _closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require, transitively (markers evaluated)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def module_level_imports(source: str) -> set[str]:
    """The third-party modules ``source`` imports when it is imported: statements outside
    function bodies and ``if TYPE_CHECKING:`` blocks."""

    def visit(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from visit(node.orelse)
                continue
            yield node
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, [])
                for child in children:
                    if isinstance(child, ast.ExceptHandler):
                        yield from visit(child.body)
                yield from visit([c for c in children if isinstance(c, ast.stmt)])

    statements = [
        n for n in visit(ast.parse(source).body) if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    return third_party_imports(ast.unparse(ast.Module(body=statements, type_ignores=[])))


def test_import_microagent_needs_only_the_base_dependencies(tmp_path: Path) -> None:
    """``pip install microagent`` without extras is enough for ``import microagent``: every
    module it loads imports, at module level, only the base dependencies (and theirs)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, microagent; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not the repository root, whose mailbox/ would shadow the stdlib's
        timeout=120,
    )
    loaded = [m.split(".")[1:] for m in done.stdout.split() if m.split(".")[0] == "microagent"]
    assert ["actors", "_cell"] in loaded  # it reads what was really imported
    allowed = _closure(_declared(extras=False))
    wrong: dict[str, set[str]] = {}
    for parts in loaded:
        path = ROOT.joinpath(*parts)
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for module in module_level_imports(source.read_text(encoding="utf-8")):
            if not distributions_of(module) & allowed:
                wrong.setdefault(module, set()).add(str(source.relative_to(ROOT)))
    assert wrong == {}, "import microagent needs these, but the base dependencies lack them"


def test_the_module_level_reader_skips_function_bodies_and_type_checking() -> None:
    source = (
        "import attrs\nif TYPE_CHECKING:\n    import vllm\nelse:\n    import regex\n"
        "try:\n    import uvloop\nexcept ImportError:\n    import yaml\n"
        "class C:\n    import anyio\n    def m(self):\n        import torch\n"
        "def f():\n    import numpy\n"
    )
    assert module_level_imports(source) == {"attrs", "regex", "uvloop", "yaml", "anyio"}


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
