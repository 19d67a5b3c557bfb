"""Public names report their public module (as trio's ``fixup_module_metadata`` does).

A class defined in ``microagent/collab/_spec.py`` and exported from
``microagent.collab`` should say ``microagent.collab.AgentSpec`` in reprs,
tracebacks and pickles, not the private module it happens to live in.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping


def publish(namespace: Mapping[str, object], module: str, *, below: str | None = None) -> None:
    """Make the classes and functions of ``namespace['__all__']`` below ``module`` report it.

    ``below`` names another package whose private modules' names ``module`` exports
    instead (``microagent.testing`` exports the double of ``engine_bridge.scripted``).
    """
    root = below or module
    for name in namespace.get("__all__", ()):  # type: ignore[attr-defined]
        obj = namespace[name]
        if not (isinstance(obj, type) or inspect.isfunction(obj)):
            continue
        home = getattr(obj, "__module__", "") or ""
        if home.startswith(root + ".") and "._" in home[len(root) :]:
            obj.__module__ = module
