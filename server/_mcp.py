"""MCP servers kept running: each ``--mcp`` server is restarted with backoff when it dies.

An MCP server is a child process; it can crash or exit at any time, and without
supervision its tools would fail for the server's whole life while ``/health``
said ok. ``McpSupervisor`` starts every server (a server that does not start
fails the app's startup, as before), then watches each one's output
(``McpConnection.closed``): when it ends, the server is marked down, started
again after ``backoff`` seconds (doubling on each failed try, up to
``max_backoff``; back to ``backoff`` once a server stayed up ``stable`` seconds),
and its tools replaced by the new process's. ``down`` names the servers not
running now: ``/health`` reports ``degraded`` while it is not empty.

One process serves every tenant: its state (files, caches, sessions) is shared
by all API keys (see ``docs/security.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Final

import anyio
import attrs
from anyio.abc import TaskStatus

from ..collab import McpServer, Tool, mcp_connection

#: Seconds before the first restart of a server that died; each failed try doubles it.
RESTART_BACKOFF: Final = 0.5
#: The longest wait between two tries.
MAX_RESTART_BACKOFF: Final = 30.0
#: A server that stayed up this long (seconds) restarts after ``RESTART_BACKOFF`` again.
STABLE_SECONDS: Final = 60.0


@attrs.define(eq=False)
class McpSupervisor:
    """Starts the MCP servers, puts their tools in ``tools`` and restarts any that dies.

    Attributes:
        servers: name -> how to start it.
        tools: where each server's current tools go (the app's ``collaboration.tools``).
        backoff: seconds before the first restart; doubled on each failed try.
        max_backoff: the longest wait between tries.
        stable: seconds up after which a restart waits ``backoff`` again.
        down: the servers not running now.
        restarts: successful restarts, per server.
    """

    servers: Mapping[str, McpServer | str]
    tools: dict[str, tuple[Tool, ...]]
    backoff: float = RESTART_BACKOFF
    max_backoff: float = MAX_RESTART_BACKOFF
    stable: float = STABLE_SECONDS
    down: set[str] = attrs.field(factory=set)
    restarts: dict[str, int] = attrs.field(factory=dict)

    @contextlib.asynccontextmanager
    async def supervising(self) -> AsyncIterator[None]:
        """Start every server, keep them running while the block runs, stop them after.

        Raises:
            ToolServerError: a server did not start (the others are stopped first).
        """
        failure: BaseException | None = None
        async with anyio.create_task_group() as tg:
            for name, server in self.servers.items():
                failure = await tg.start(self._keep, name, server)
                if failure is not None:
                    break
            if failure is None:
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
            else:
                tg.cancel_scope.cancel()
        if failure is not None:  # raised here, not inside the group: as the server's error
            raise failure

    async def _keep(
        self,
        name: str,
        server: McpServer | str,
        *,
        task_status: TaskStatus[BaseException | None],
    ) -> None:
        first = True
        delay = self.backoff
        while True:
            up_since: float | None = None
            try:
                async with mcp_connection(server) as connection:
                    self.tools[name] = tuple(connection.tools)
                    self.down.discard(name)
                    up_since = anyio.current_time()
                    if first:
                        first = False
                        task_status.started(None)
                    else:
                        self.restarts[name] = self.restarts.get(name, 0) + 1
                    await connection.closed.wait()
            except Exception as exc:  # it did not start, or its stop failed: retried below
                if first:  # the app does not start without its servers
                    task_status.started(exc)
                    return
            self.down.add(name)
            if up_since is not None and anyio.current_time() - up_since >= self.stable:
                delay = self.backoff
            await anyio.sleep(delay)  # the backoff itself: nothing to wait on but time
            delay = min(2 * delay, self.max_backoff)
