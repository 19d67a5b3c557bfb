"""Program order: how a bridge schedules the requests whose caller names no priority.

An embedding app's simplest loop (``generate(handle, sampling, retain=Retain(key))``,
with no ``priority`` and no ``next_use``) gives the retention policy nothing to order
by: every request at priority 0, every entry with an unknown next use. Under pressure
such an entry is never worth keeping (``RetentionTable``), so each waiting request
releases the oldest one, which is LRU order; and on the cyclic pattern of agents that
take turns (a working set larger than the cache) LRU evicts every session just before
it comes back. Returning turns also queue behind newer sessions' first turns. The HTTP
session path fills both in for its sessions (``server/_sessions.py``); a bridge fills
them in for callers that leave scheduling to it:

* **Priority:** a program's first-come-first-served place (``PROGRAM_SPAN`` apart, as
  the collaboration layer spaces its programs). A program is named by its retention
  key: a request retained under a key seen before, or whose prompt extends a handle
  retained under one, is served at that program's priority; any other request starts
  a new program, after every earlier one.
* **Next use:** the median gap a program's turns have shown (from a retained turn's
  end to the next request of the program); before one is seen, the median over all
  programs; before any at all, 0 (expected back at once, and held while late by the
  table's ``min_hold``, as a late owner is).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from statistics import median
from typing import Final

import attrs

#: Priority values between two programs (the collaboration layer's ``LEVEL_SPAN``).
PROGRAM_SPAN: Final = 64
#: Programs remembered (least recently used go first past it).
MAX_PROGRAMS: Final = 65536
#: Gaps remembered per program, and over all programs.
_GAPS: Final = 32
_ALL_GAPS: Final = 256


@attrs.define(eq=False)
class _Program:
    priority: int
    gaps: deque[float] = attrs.Factory(lambda: deque(maxlen=_GAPS))
    #: when its last retained turn ended (None: none has, or the next request came)
    finished: float | None = None


@attrs.define(eq=False)
class ProgramOrder:
    """The programs a bridge scheduled by default: their priorities and observed gaps."""

    limit: int = MAX_PROGRAMS
    _arrivals: itertools.count[int] = attrs.field(factory=itertools.count, init=False)
    _programs: OrderedDict[str, _Program] = attrs.field(factory=OrderedDict, init=False)
    _gaps: deque[float] = attrs.field(factory=lambda: deque(maxlen=_ALL_GAPS), init=False)

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, key: object) -> bool:
        return key in self._programs

    def plan(self, key: str | None, parent: str | None, now: float) -> tuple[int, float]:
        """The priority of a request retained under ``key`` (None: not retained) whose
        prompt extends the handle retained under ``parent``, and its expected next use.

        A request of a known program ends the gap since that program's last turn.
        """
        program = self._programs.get(key) if key is not None else None
        if program is None and parent is not None:
            program = self._programs.get(parent)
        if program is None:
            program = _Program(next(self._arrivals) * PROGRAM_SPAN)
        elif program.finished is not None:
            gap = max(0.0, now - program.finished)
            program.gaps.append(gap)
            self._gaps.append(gap)
            program.finished = None
        if parent is not None and parent in self._programs:
            self._programs.move_to_end(parent)
        if key is not None:
            self._programs[key] = program
            self._programs.move_to_end(key)
        while len(self._programs) > self.limit:
            self._programs.popitem(last=False)
        gaps = program.gaps or self._gaps
        return program.priority, median(gaps) if gaps else 0.0

    def finished(self, key: str, now: float) -> None:
        """A turn retained under ``key`` ended: its program's next request ends a gap."""
        program = self._programs.get(key)
        if program is not None:
            program.finished = now

    def forget(self, keys: Iterable[str] = (), *, prefix: str | None = None) -> None:
        """The programs named ``keys`` (and those starting with ``prefix``) ended."""
        names = set(keys)
        if prefix is not None:
            names.update(k for k in self._programs if k.startswith(prefix))
        for name in names:
            self._programs.pop(name, None)
