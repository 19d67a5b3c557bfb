"""``open_bridges``: open several engine bridges as one, close what was opened on the way out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import anyio

from ._bridge import EngineBridge


@asynccontextmanager
async def open_bridges(bridges: Iterable[EngineBridge]) -> AsyncIterator[list[EngineBridge]]:
    """Open every bridge in order; on exit close the opened ones in reverse order.

    A bridge that fails to open leaves the ones before it closed again (the
    error propagates); closing is shielded from cancellation, so a cancelled
    server or CLI never leaves an engine process behind.
    """
    opened: list[EngineBridge] = []
    try:
        for bridge in bridges:
            await bridge.open()
            opened.append(bridge)
        yield opened
    finally:
        with anyio.CancelScope(shield=True):
            for bridge in reversed(opened):
                await bridge.close()
