"""EventBuffer: producers never wait; deltas merge; droppable deltas are counted when full."""

from __future__ import annotations

import anyio
import pytest
from microagent.server._sse import EventBuffer, StreamItem, encode


def delta(owner: str, text: str, *, droppable: bool = True) -> StreamItem:
    return StreamItem(
        build=lambda t: {"owner": owner, "text": t},
        text=text,
        owner=owner,
        mergeable=True,
        droppable=droppable,
    )


def essential(name: str) -> StreamItem:
    return StreamItem(build=lambda _t: {"event": name}, owner=name)


@pytest.mark.anyio
async def test_deltas_merge_per_owner_and_keep_order() -> None:
    buf = EventBuffer(4)
    buf.put(delta("a", "x"))
    buf.put(delta("b", "1"))
    buf.put(delta("a", "y"))
    buf.put(delta("b", "2"))
    buf.close()
    out = []
    while (item := await buf.get()) is not None:
        out.append(item.build(item.text))
    assert out == [{"owner": "a", "text": "xy"}, {"owner": "b", "text": "12"}]
    assert buf.merged == 2
    assert buf.dropped == 0


@pytest.mark.anyio
async def test_full_buffer_drops_only_droppable_deltas_and_counts_them() -> None:
    buf = EventBuffer(2)
    buf.put(essential("x"))
    buf.put(essential("y"))
    buf.put(delta("z", "lost"))  # full, cannot merge: dropped
    buf.put(essential("final"))  # essential events are always kept
    buf.put(delta("p", "kept", droppable=False))
    assert buf.dropped == 1
    assert len(buf) == 4
    buf.close()
    names = []
    while (item := await buf.get()) is not None:
        names.append(item.build(item.text))
    assert names[-2:] == [{"event": "final"}, {"owner": "p", "text": "kept"}]


@pytest.mark.anyio
async def test_a_delta_after_an_essential_event_of_its_owner_does_not_merge_backwards() -> None:
    buf = EventBuffer(8)
    buf.put(delta("a", "one"))
    buf.put(StreamItem(build=lambda _t: {"finished": "a"}, owner="a"))
    buf.put(delta("a", "two"))
    assert len(buf) == 3


@pytest.mark.anyio
async def test_get_waits_for_put_and_close() -> None:
    buf = EventBuffer(1)
    got: list[object] = []

    async def consume() -> None:
        while (item := await buf.get()) is not None:
            got.append(item.text)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        buf.put(delta("a", "hi"))
        await anyio.wait_all_tasks_blocked()
        assert got == ["hi"]
        buf.close()
    assert got == ["hi"]
    buf.put(delta("a", "late"))  # ignored once closed
    assert len(buf) == 0


def test_encode() -> None:
    assert encode("[DONE]") == b"data: [DONE]\n\n"
    assert encode({"a": 1}) == b'data: {"a":1}\n\n'
    with pytest.raises(ValueError):
        EventBuffer(0)
