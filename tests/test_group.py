"""``open_bridges``: opened in order, the opened ones closed in reverse, even on failure."""

from __future__ import annotations

import anyio
import pytest
from microagent.engine_bridge import open_bridges
from microagent.testing import ScriptedEngine

pytestmark = pytest.mark.anyio


class Logged(ScriptedEngine):
    """A ScriptedEngine that logs its opens and closes (and can fail to open)."""

    def __init__(self, name: str, log: list[str], *, fail: bool = False) -> None:
        super().__init__(model=name)
        self.log = log
        self.fail = fail

    async def open(self) -> None:
        if self.fail:
            raise RuntimeError(f"{self.model} cannot start")
        await super().open()
        self.log.append(f"open {self.model}")

    async def close(self) -> None:
        await super().close()
        self.log.append(f"close {self.model}")


async def test_opens_in_order_and_closes_in_reverse() -> None:
    log: list[str] = []
    bridges = [Logged("a", log), Logged("b", log)]
    async with open_bridges(bridges) as opened:
        assert opened == bridges
        assert log == ["open a", "open b"]
    assert log == ["open a", "open b", "close b", "close a"]


async def test_a_failed_open_closes_those_already_open() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="b cannot start"):
        async with open_bridges([Logged("a", log), Logged("b", log, fail=True), Logged("c", log)]):
            pytest.fail("the body must not run")
    assert log == ["open a", "close a"]


async def test_closing_survives_cancellation() -> None:
    log: list[str] = []
    with anyio.CancelScope() as scope:
        async with open_bridges([Logged("a", log), Logged("b", log)]):
            scope.cancel()
            await anyio.sleep(1)
    assert log[-2:] == ["close b", "close a"]
