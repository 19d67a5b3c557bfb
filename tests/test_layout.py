"""The package's layout: layers import downwards, no cycles, the chat format in the engine layer.

Read from the source with ``ast`` (every import counts: module level, inside
functions, and under ``TYPE_CHECKING``), so a violation fails here before it
becomes a cycle at run time or a leak of one layer into another.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "microagent"
LAYERS = (
    "mailbox",
    "engine_bridge",
    "console",
    "actors",
    "collab",
    "server",
    "evaluation",
    "cluster",
    "cli",
    "testing",
)

#: What each layer may import of the other layers (type-checking imports included).
ALLOWED: dict[str, set[str]] = {
    "mailbox": set(),
    "engine_bridge": set(),
    "console": {"engine_bridge"},  # the terminal display: no web framework, no collaboration
    "actors": {"mailbox", "engine_bridge"},
    "collab": {"mailbox", "engine_bridge", "actors"},
    "server": {"mailbox", "engine_bridge", "console", "actors", "collab"},
    "evaluation": {"mailbox", "engine_bridge", "console", "actors", "collab", "server"},
    "cluster": {"mailbox", "engine_bridge", "console", "actors", "collab", "server"},
    "testing": {"engine_bridge"},
}
#: The command line is the top layer: it may import every other.
ALLOWED["cli"] = set(LAYERS) - {"cli"}
#: Where a chat template's own tokens may be written down.
CHAT_LITERAL = re.compile(
    r"<\|(?:im_end|im_start|endoftext|eot_id|start_header_id|end_header_id)\|>|</s>"
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def package_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in LAYERS or len(rel.parts) == 1:
            out.append(path)
    return sorted(out)


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, *, runtime_only: bool) -> Iterator[str]:
    """Absolute names of the ``microagent`` modules (or module members) ``path`` imports."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    yield from imports_in(path.read_text(encoding="utf-8"), package, runtime_only=runtime_only)


def imports_in(source: str, package: str, *, runtime_only: bool) -> Iterator[str]:
    """Like ``imports`` for ``source`` of a module whose package is ``package``."""
    tree = ast.parse(source)

    def visit(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.If) and is_type_checking(node) and runtime_only:
            yield from (n for child in node.orelse for n in visit(child))
            return
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == PACKAGE:
                for alias in node.names:
                    yield f"{target}.{alias.name}"
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(tree)


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_tree_holds_every_layer() -> None:
    found = {path.relative_to(ROOT).parts[0] for path in package_files()}
    assert set(LAYERS) <= found
    assert not (ROOT / "actors" / "_collab.py").exists()
    collab_in_actors = [
        p.name
        for p in (ROOT / "actors").glob("*.py")
        if re.search(r"collab|_ops_|graph|trace", p.name)
    ]
    assert collab_in_actors == []


@pytest.mark.parametrize("path", package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_layers_import_only_downwards(path: Path) -> None:
    layer = path.relative_to(ROOT).parts[0]
    if layer not in LAYERS:
        return  # the root package re-exports every layer
    for name in imports(path, runtime_only=False):
        other = layer_of(name)
        if other is None or other == layer:
            continue
        assert other in ALLOWED[layer], f"{module_name(path)} ({layer}) imports {name} ({other})"


def test_only_the_entry_point_imports_the_command_line() -> None:
    """``cli/`` is the top: no layer imports it (the table says so), nor the root package
    but ``python -m microagent`` (``__main__.py``)."""
    users = [
        str(path.relative_to(ROOT))
        for path in package_files()
        if path.relative_to(ROOT).parts[0] != "cli"
        and any(layer_of(name) == "cli" for name in imports(path, runtime_only=False))
    ]
    assert users == ["__main__.py"]


def test_no_import_cycle_inside_a_package() -> None:
    """Within each layer the modules' run-time imports form no cycle (function-level ones too)."""
    modules = {module_name(p): p for p in package_files()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in imports(path, runtime_only=True):
            target = imported if imported in modules else imported.rsplit(".", 1)[0]
            if target in modules and target != name and layer_of(target) == layer_of(name):
                edges.add(target)
        graph[name] = edges
    # a package's __init__ re-exporting its modules is not a cycle of its own
    for name in graph:
        graph[name] = {
            t
            for t in graph[name]
            if not (modules[t].name == "__init__.py" and name.startswith(t + "."))
        }

    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)


def test_the_chat_format_stays_in_the_engine_layer() -> None:
    """No template token literal outside ``engine_bridge/``: another model's template just works."""
    leaks = []
    for path in package_files():
        if path.relative_to(ROOT).parts[0] == "engine_bridge":
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CHAT_LITERAL.search(line):
                leaks.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert leaks == []


def test_the_import_reader_sees_every_kind_of_import() -> None:
    """Relative, type-checking and function-level imports are read (the tests above can fail)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..collab import Outcome\n"
        "from ..server import x\n"
        "def f():\n    from ._cell import current_cell\n"
        "import microagent.mailbox\n"
    )
    everything = set(imports_in(source, "microagent.actors", runtime_only=False))
    assert everything == {
        "microagent.collab.Outcome",
        "microagent.server.x",
        "microagent.actors._cell.current_cell",
        "microagent.mailbox",
    }
    assert "microagent.collab.Outcome" not in set(
        imports_in(source, "microagent.actors", runtime_only=True)
    )


def own_unit(test: Path, private: str) -> bool:
    """Whether ``test`` tests the private module ``private`` itself (their names share a
    word: ``test_tools.py`` and ``_tool_calls``, ``test_collab_soft.py`` and ``_soft``)."""
    words = test.stem.removeprefix("test_").split("_")
    unit = private.lstrip("_").split("_")
    return any(w.startswith(u) or u.startswith(w) for w in words for u in unit if u and w)


#: Private names a test needs beyond its own unit, each with its reason.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {
    ("strategies.py", "microagent.collab._debias.voter_order"): (
        "property tests draw voters' orders exactly as the vote does"
    ),
    ("test_collab_properties.py", "microagent.collab._debias.voter_order"): "the same",
    ("test_collab_properties.py", "microagent.collab._tally.adaptive_vote"): (
        "the adaptive stop rules are checked against an independent model"
    ),
    ("test_collab_properties.py", "microagent.collab._tally.beta_majority_probability"): (
        "the same"
    ),
    ("test_bench_early_stop.py", "microagent.collab._tally.adaptive_vote"): (
        "the bench replays votes through the rule the mode uses"
    ),
    ("test_bench_early_stop.py", "microagent.collab._tally.StopRule"): "the same",
    ("test_bench_early_stop.py", "microagent.collab._tally.majority"): "the same",
    ("test_collab_properties.py", "microagent.collab._tally.StopRule"): (
        "the adaptive stop rules are checked against an independent model"
    ),
    ("test_collab_properties.py", "microagent.collab._tally.majority"): "the same",
    ("test_collab_properties.py", "microagent.collab._debias.ChoiceView"): (
        "the vote shows each voter its own order of the choices; the property reads it back"
    ),
    ("test_answers.py", "microagent.collab._tally.Tally"): (
        "answers are read and counted by the tally the vote mode keeps (collab's own counting)"
    ),
    ("test_answers.py", "microagent.collab._tally.all_agree"): "the same",
    ("test_answers.py", "microagent.collab._tally.majority"): "the same",
    ("test_collab_soft.py", "microagent.collab._tally.Tally"): (
        "a soft ballot against the exact tally it generalises"
    ),
    ("test_bench_accuracy.py", "microagent.collab._tally.majority"): (
        "the bench scores a majority exactly as the vote mode decides it"
    ),
    ("test_graph.py", "microagent.collab._scheduling.LEVEL_SPAN"): (
        "a graph's warm-up request sits in its collaboration's priority level"
    ),
    ("test_compute.py", "microagent.collab._calculator.calculate"): (
        "the compute mode's calculator, checked directly (the mode only shows its results)"
    ),
    ("test_compute.py", "microagent.collab._calculator.CalculationError"): "the same",
    ("test_compute.py", "microagent.collab._calculator.CALCULATOR"): "the same",
    ("test_compute.py", "microagent.collab._calculator.calculate_program"): "the same",
    ("test_compute.py", "microagent.collab._calculator.STEP_REGEX"): (
        "each program step's turn is held to the calculator's step grammar"
    ),
    ("test_compute.py", "microagent.collab._calculator.ANSWER_STEP_REGEX"): "the same",
    ("test_collab_strategies_real.py", "microagent.collab._calculator.CALCULATOR"): (
        "the real model is asked for expressions the calculator's grammar accepts"
    ),
    ("test_collab_strategies_real.py", "microagent.collab._calculator.EXPRESSION_REGEX"): (
        "the same"
    ),
    ("test_hostile_collab.py", "microagent.collab._calculator.calculate"): (
        "hostile expressions are refused by the calculator itself, naming the bound"
    ),
    ("test_hostile_collab.py", "microagent.collab._calculator.CalculationError"): "the same",
    ("test_code_gate.py", "microagent.collab._calculator.calculate"): (
        "the server's code policy reaches every place that runs code"
    ),
    ("test_code_gate.py", "microagent.collab._validators.run_validator"): "the same",
    ("test_validators.py", "microagent.collab._sandbox.SandboxUnavailable"): (
        "a code validator without a sandbox fails with the sandbox's own error"
    ),
    ("test_bench_agents_sim.py", "microagent.engine_bridge.scripted._step_cost.prefill_pairs"): (
        "the simulator's cost model is calibrated on the attention pairs the double counts"
    ),
    ("test_mcp.py", "microagent.collab._tools.run_calls"): (
        "MCP tools run through the agents' own call runner"
    ),
    ("test_params.py", "microagent.server._schemas.REFUSED_PARAMETERS"): (
        "every parameter of the installed SDK is either honoured or in this table"
    ),
    ("test_server_faults.py", "microagent.server._sse.SSEResponse"): (
        "a producer that fails must still end its stream with the error event"
    ),
    ("test_server_faults.py", "microagent.server._retry.engine_cause"): (
        "engine-loss classification, unit by unit"
    ),
    ("test_server_faults.py", "microagent.server._retry.death_counts"): "the same",
    ("test_server_faults.py", "microagent.server._retry.died_since"): "the same",
    ("test_server_faults.py", "microagent.server._retry.EngineLost"): "the same",
    ("test_server_faults.py", "microagent.server._retry.run_retrying"): "the same",
    ("test_hostile_server.py", "microagent.server._sse.StreamItem"): (
        "a stream's buffer is filled as its producers fill it, to check its bound"
    ),
    ("test_hostile_server.py", "microagent.server._sse.SSE_ITEM_BYTES"): "the same",
    ("test_cli.py", "microagent.server._served.make_bridges"): (
        "the engine options' bridge factory that serve and run share (served_app's part)"
    ),
    ("test_cluster.py", "microagent.cluster.__main__._parser"): (
        "the cluster's command line (``python -m microagent.cluster``; no Python API)"
    ),
    ("test_cluster.py", "microagent.cluster.__main__.main"): "the same",
    ("test_cluster.py", "microagent.cluster.__main__.settings_from"): "the same",
    ("test_hostile_tenancy.py", "microagent.server._sessions.MAX_GAP_SERIES"): (
        "the documented bound a client inventing cache keys must not pass"
    ),
    ("test_hostile_tenancy.py", "microagent.cluster._replica.UsageLedger"): (
        "the ingress's accounting of a left request, checked without Ray: the real ingress "
        "and replica classes joined by a stand-in for Serve's handle"
    ),
    ("test_hostile_tenancy.py", "microagent.cluster._replica.EngineReplica"): "the same",
    ("test_hostile_tenancy.py", "microagent.cluster._replica.replica_options"): "the same",
    ("test_hostile_tenancy.py", "microagent.cluster._ingress.IngressApp"): "the same",
    ("test_hostile_tenancy.py", "microagent.cluster._asgi.Lifespan"): "the same",
}


def test_tests_import_public_names_but_for_their_own_unit() -> None:
    """A test reaches the package through its public API; only the test of a private
    module's own unit imports that module, and ``PRIVATE_ALLOWED`` lists the rest with
    their reasons (``tests/_*.py`` helpers count as users of the public API)."""
    strays = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for name in imports(path, runtime_only=False):
            parts = name.split(".")[1:-1]
            private = [p for p in parts if p.startswith("_")]
            rooms = [p for p in parts[1:] if not p.startswith("_")]  # engine_bridge.vllm
            allowed = (path.name, name) in PRIVATE_ALLOWED
            mine = any(own_unit(path, unit) for unit in [*private[-1:], *rooms])
            if private and not mine and not allowed:
                strays.append(f"{path.name}: {name}")
    assert strays == []


#: Each engine implementation's room in the engine layer (the contract stays at its top).
ENGINE_ROOMS = {
    "vllm": "engine_bridge/vllm",
    "remote": "engine_bridge/remote",
    "scripted": "engine_bridge/scripted",
}
#: Who reaches the test double's room through its ``__init__``: ``microagent.testing``
#: exports it (the engine layer's own ``__init__`` does not), and ``serve --engine
#: scripted`` builds it.
SCRIPTED_USERS = {"testing/__init__.py", "server/_served.py"}


def _third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_each_engine_has_its_own_room() -> None:
    """vLLM is imported only in ``engine_bridge/vllm/`` (whose scheduler the EngineCore loads),
    the remote bridge lives in ``engine_bridge/remote/``, the test double and its helpers in
    ``engine_bridge/scripted/``; the rest of the package reaches the vLLM and remote rooms only
    through ``engine_bridge``'s public names (its ``__init__`` re-exports them), and the
    scripted room only through its own ``__init__``, from ``SCRIPTED_USERS``."""
    rooms = {room: ROOT / folder for room, folder in ENGINE_ROOMS.items()}
    assert all((folder / "__init__.py").exists() for folder in rooms.values())
    for flat in ("_vllm", "_remote", "_scripted", "_step_cost", "_json_instance", "_models"):
        assert not (ROOT / "engine_bridge" / f"{flat}.py").exists(), flat
    vllm_users = [
        str(p.relative_to(ROOT))
        for p in package_files()
        if "vllm" in _third_party_imports(p) and rooms["vllm"] not in p.parents
    ]
    assert vllm_users == []
    strays = []
    for path in package_files():
        rel = str(path.relative_to(ROOT))
        home = next((r for r, folder in rooms.items() if folder in path.parents), None)
        for name in imports(path, runtime_only=False):
            parts = name.split(".")
            room = parts[2] if len(parts) > 2 and parts[1] == "engine_bridge" else None
            if room not in rooms or room == home:
                continue
            if room == "scripted":
                through_init = len(parts) == 4 and not parts[3].startswith("_")
                if through_init and rel in SCRIPTED_USERS:
                    continue
            elif path == ROOT / "engine_bridge" / "__init__.py":
                continue
            strays.append(f"{rel}: {name}")
    assert strays == []


def test_the_public_import_rule_can_fail() -> None:
    assert own_unit(Path("test_tools.py"), "_tool_calls")
    assert own_unit(Path("test_collab_soft.py"), "_soft")
    assert not own_unit(Path("test_openapi.py"), "_scripted")


_SYS_PATH_EDITS = frozenset({"insert", "append", "extend", "remove", "pop", "clear"})


def _mutates_sys_path(source: str) -> bool:
    """Whether ``source`` edits ``sys.path`` (a method call, an assignment, ``syspath_prepend``)."""

    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (
            (is_sys_path(node.value) and node.attr in _SYS_PATH_EDITS)
            or node.attr == "syspath_prepend"
        ):
            return True
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t.value if isinstance(t, ast.Subscript) else t) for t in targets):
                return True
    return False


def test_no_test_mutates_sys_path() -> None:
    """Tests import bench modules through pytest's ``pythonpath`` (pyproject.toml) and shared
    helpers from ``tests/`` or ``microagent.testing``: no import depends on which test file
    happened to be collected first."""
    assert _mutates_sys_path("import sys\nsys.path.insert(0, 'bench')\n")
    assert _mutates_sys_path("import sys\nsys.path[:0] = ['bench']\n")
    assert not _mutates_sys_path("import sys\nprint(sys.path[0])\n")
    strays = [
        path.name
        for path in sorted((ROOT / "tests").glob("*.py"))
        if _mutates_sys_path(path.read_text(encoding="utf-8"))
    ]
    assert strays == []
