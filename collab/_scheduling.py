"""Collaboration-level scheduling: which collaboration's request the engine serves first.

The engine sees requests; we see programs. Following Autellix's multi-level
queues over program-level attained service (PLAS/ATLAS), a collaboration
that has consumed little engine work so far sits in a better level than one
that has consumed much, so short collaborations are not stuck behind hogs.
Inside a level, collaborations are served first come, first served by the
time *the collaboration* started (not the request): a client's requests
reach vLLM one by one and a collaboration's second round queues behind
every newer collaboration's first, which stretches them all (processor
sharing); here the older collaboration finishes first and its KV is still
warm. Inside a collaboration the critical path (a later debate round, an
aggregator, a deeper graph node) goes first. Aging keeps it fair: a
collaboration's level drops as it grows old, without bound, so every
collaboration eventually outranks any newcomer (no starvation).

The result is vLLM's request ``priority`` (lower runs first, an int64).
vLLM's priority policy orders the waiting queue by it, and preempts the
lowest-priority running request (by recompute) when a step cannot allocate;
the engine's ``stats().preemptions`` counts that churn.
"""

from __future__ import annotations

import itertools
import math

import attrs

_arrivals = itertools.count()


def arrival_number() -> int:
    """The next collaboration's place in this process's start order (0, 1, 2, ...)."""
    return next(_arrivals)


#: Priority values one collaboration spans: room for its critical-path offsets.
LEVEL_SPAN = 64
#: Arrival numbers one level spans (a process's collaborations, in start order).
_ARRIVAL_RANKS = 2**41
#: Levels are clamped to this magnitude so that a priority stays inside vLLM's int64.
_MAX_LEVEL = 2**12


def arrival_priority() -> int:
    """A request priority in this process's start order, for a program that is no collaboration.

    A plain request (or a session's first turn) takes the next arrival's place one
    collaboration span apart, so later collaborations and programs queue behind it.
    """
    return arrival_number() * LEVEL_SPAN


def critical_offset(priority: int) -> int:
    """The critical-path offset inside a request priority made by ``ServicePolicy.priority``."""
    return (priority + LEVEL_SPAN // 2) % LEVEL_SPAN - LEVEL_SPAN // 2


def _positive(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class ServicePolicy:
    """Levels of attained service with aging, first come first served inside a level.

    Attributes:
        level_tokens: engine tokens (computed prompt + generated) of the first
            level; each next level doubles it (levels are ``log2`` of the
            service). The default is about one whole collaboration on a
            2 000-token context, so ordinary ones stay in the first level and
            only hogs are demoted.
        aging_seconds: a collaboration gains one level of precedence per this
            many seconds of age.
        arrival_order: inside a level, the collaboration that started first
            goes first; False leaves the tie to vLLM (request arrival), which
            interleaves the collaborations of a level.
        enabled: False sends every request at its critical-path priority only.
    """

    level_tokens: float = attrs.field(default=4096.0, validator=_positive)
    aging_seconds: float = attrs.field(default=10.0, validator=_positive)
    arrival_order: bool = True
    enabled: bool = True

    @staticmethod
    def critical_offset(priority: int) -> int:
        """The critical-path offset inside a request ``priority`` that ``priority()`` made
        (0 normal, negative on the critical path: a later debate round, an aggregator)."""
        return critical_offset(priority)

    def level(self, attained_tokens: int, age_seconds: float) -> int:
        """The collaboration's level: lower is served first (may be negative when old)."""
        served = math.floor(math.log2(1 + max(0, attained_tokens) / self.level_tokens))
        level = served - math.floor(max(0.0, age_seconds) / self.aging_seconds)
        return max(-_MAX_LEVEL, min(_MAX_LEVEL, level))

    def priority(
        self, attained_tokens: int, age_seconds: float, critical: int = 0, arrival: int = 0
    ) -> int:
        """The request priority: the collaboration's level, its arrival, its critical-path offset.

        ``critical`` is the mode's own priority for the step (0 normal, negative
        on the critical path); it is clamped to one collaboration's span so
        that it orders steps inside a collaboration and never jumps past
        another. ``arrival`` is the collaboration's ``arrival_number()``:
        inside a level, a lower one goes first.
        """
        offset = max(-(LEVEL_SPAN // 2) + 1, min(LEVEL_SPAN // 2 - 1, critical))
        if not self.enabled:
            return offset
        rank = min(_ARRIVAL_RANKS - 1, max(0, arrival)) if self.arrival_order else 0
        return (
            self.level(attained_tokens, age_seconds) * _ARRIVAL_RANKS + rank
        ) * LEVEL_SPAN + offset
