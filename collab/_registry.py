"""The default mode registry (the built-in modes, plus what ``register_mode`` adds)."""

from __future__ import annotations

from ._mode import AnyOp, ModeRegistry
from .modes import BUILTIN_MODES

#: The registry ``collaborate`` and the server use unless given another.
default_registry = ModeRegistry(BUILTIN_MODES)


def register_mode(op: type[AnyOp]) -> type[AnyOp]:
    """Register a mode in the default registry by its ``name`` (usable as a class decorator).

    A user's mode is then usable from Python (``collaborate(engine, "mine", …)``)
    and from the HTTP API (``collaboration.mode = "mine"``).
    """
    return default_registry.register(op)


def unregister_mode(name: str) -> None:
    """Remove a mode from the default registry."""
    default_registry.unregister(name)


def collaboration_modes() -> list[str]:
    """Names of the modes in the default registry (built-in and user-registered)."""
    return default_registry.names()


def get_mode(name: str) -> type[AnyOp]:
    """The mode ``name`` of the default registry (raises ``InvalidCollaboration``)."""
    return default_registry.get(name)
