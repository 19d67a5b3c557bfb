"""``microagent.console``: the terminal display is a room of its own, below the server.

Demos and scripts import a quiet terminal (``quiet_engine_logs``, ``open_engines``,
``LiveView``) from it; that must not pull in FastAPI, which only the HTTP server needs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

DEMOS = Path(__file__).resolve().parents[1] / "demos"
WEB = ("fastapi", "starlette")


def web_modules_after(statement: str) -> list[str]:
    """The web-framework modules a fresh interpreter holds after running ``statement``."""
    probe = (
        f"import sys\n{statement}\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {WEB!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return list(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def test_the_console_imports_no_web_framework() -> None:
    assert web_modules_after("import microagent.console") == []


def test_the_probe_sees_a_web_framework() -> None:
    """The check above can fail: importing the server does pull in FastAPI."""
    found = web_modules_after("import microagent.server")
    assert "fastapi" in found and "starlette" in found


def test_demos_take_the_terminal_from_the_console() -> None:
    """No demo reaches ``microagent.server`` for its terminal; only the FastAPI demo
    (which embeds microagent in its own app) imports a web framework."""
    strays = []
    for path in sorted(DEMOS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                web = name.split(".")[0] in WEB and path.stem != "embed_fastapi"
                if web or name.startswith("microagent.server"):
                    strays.append(f"{path.name}: {name}")
    assert strays == []
