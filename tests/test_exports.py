"""The public API is deliberate (as trio's ``_tests/test_exports.py`` checks it).

Every public name is in its package's ``__all__`` exactly once, reports a
public module, and the core namespaces stay small and documented.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path

import microagent
import pytest

PUBLIC_PACKAGES = (
    "microagent",
    "microagent.mailbox",
    "microagent.engine_bridge",
    "microagent.console",
    "microagent.actors",
    "microagent.collab",
    "microagent.collab.graph",
    "microagent.collab.modes",
    "microagent.collab.trace",
    "microagent.server",
    "microagent.cluster",
    "microagent.cli",
    "microagent.testing",
)


def public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_all_lists_the_public_surface_exactly_once(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "a name is listed twice in __all__"
    assert set(exported) == public_names(module), "public names and __all__ differ"
    for name in exported:
        assert hasattr(module, name), name


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_public_names_report_a_public_module(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        if isinstance(value, type) or inspect.isfunction(value):
            home = value.__module__
            if home.split(".")[0] != "microagent":
                continue  # a re-exported third-party type
            assert "._" not in home and not home.startswith("_"), f"{package}.{name} reports {home}"
            assert importlib.import_module(home).__dict__.get(value.__name__) is value, name


@pytest.mark.parametrize("package", PUBLIC_PACKAGES)
def test_public_names_are_explicit_reexports(package: str) -> None:
    """Every name an ``__init__`` imports is re-exported as ``X as X`` or kept private."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    reexported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                name = alias.asname or alias.name
                if name.startswith("_"):
                    continue
                assert alias.asname == alias.name, (
                    f"{package}: import {alias.name} as {alias.asname}"
                )
                reexported.add(name)
    assert reexported <= set(module.__all__), sorted(reexported - set(module.__all__))


def test_the_core_is_small_and_every_name_is_documented() -> None:
    """``microagent`` exports what the README and docs teach, at most 40 names."""
    assert len(microagent.__all__) <= 40
    root = Path(microagent.__file__).parent
    docs = "\n".join(
        p.read_text(encoding="utf-8") for p in [root / "README.md", *root.glob("docs/**/*.md")]
    )
    undocumented = [
        name
        for name in microagent.__all__
        if f"`{name}`" not in docs and f"import {name}" not in docs and f", {name}" not in docs
    ]
    assert undocumented == []


def test_the_collaboration_layer_exports_at_most_60_documented_names() -> None:
    """``microagent.collab`` exports what users need; its README lists every name."""
    collab = importlib.import_module("microagent.collab")
    assert len(collab.__all__) <= 60
    readme = (Path(microagent.__file__).parent / "collab" / "README.md").read_text("utf-8")
    listed = readme.split("## The public names", 1)[1]
    assert [name for name in collab.__all__ if f"`{name}`" not in listed] == []
    assert f"these {len(collab.__all__)} names" in listed


def test_each_layer_has_one_base_error_exported_at_the_top() -> None:
    bases = {
        "mailbox": microagent.MailboxError,
        "engine_bridge": microagent.EngineBridgeError,
        "actors": microagent.ActorError,
        "collab": microagent.CollaborationError,
    }
    for layer, base in bases.items():
        module = importlib.import_module(f"microagent.{layer}")
        errors = [
            value
            for name in module.__all__
            if isinstance(value := getattr(module, name), type) and issubclass(value, Exception)
        ]
        assert errors and base in errors
        strays = [e.__name__ for e in errors if not issubclass(e, base)]
        assert strays == [], f"{layer} errors outside {base.__name__}: {strays}"


def test_a_layer_exports_what_it_defines_from_its_own_home() -> None:
    """A public object is defined in one layer; other packages may re-export it, not redefine it."""
    seen: dict[int, str] = {}
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) or inspect.isfunction(value):
                home = value.__module__
                seen.setdefault(id(value), home)
                assert seen[id(value)] == home
    assert microagent.AgentSpec.__module__ == "microagent.collab"
    assert microagent.Runtime.__module__ == "microagent.actors"
    assert microagent.testing.ScriptedEngine.__module__ == "microagent.testing"
    assert repr(microagent.InvalidCollaboration("agents", "x")).startswith("InvalidCollaboration(")


def test_the_test_double_is_exported_from_testing_only() -> None:
    """``ScriptedEngine`` and its helpers are where users' tests find them, and only there
    (httpx's ``MockTransport``); the top level keeps no shim of names it once exported."""
    double = ("ScriptedEngine", "StepCost", "ToyTokenizer", "make_random_lora")
    for package in PUBLIC_PACKAGES:
        exported = set(importlib.import_module(package).__all__)
        if package == "microagent.testing":
            assert set(double) <= exported
        else:
            assert not set(double) & exported, package
    for gone in ("ScriptedEngine", "ActorRef", "write_trace"):
        with pytest.raises(AttributeError):
            getattr(microagent, gone)
