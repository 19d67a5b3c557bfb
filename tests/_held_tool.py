"""A server tool for the shutdown test: it holds its call until the test lets it go.

``microagent serve --tool hold=_held_tool:hold`` (with ``tests/`` on ``PYTHONPATH``):
the call touches ``$MICROAGENT_TEST_DIR/started``, then waits for
``$MICROAGENT_TEST_DIR/release`` (files: the server is another process).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def hold(note: str) -> str:
    """Hold the call until the test releases it."""
    folder = Path(os.environ["MICROAGENT_TEST_DIR"])
    (folder / "started").touch()
    deadline = time.monotonic() + 60
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # another process writes the file: there is nothing to wait on
    return f"released: {note}"
