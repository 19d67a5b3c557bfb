"""Collaboration-level scheduling: which collaboration's request the engine serves first.

The engine sees requests; we see programs. Following Autellix's program-level
least-attained-service (PLAS), a collaboration that has consumed little engine
work so far goes before one that has consumed much — short collaborations are
not stuck behind long ones — and inside a collaboration the critical path (a
later debate round, an aggregator, a deeper graph node) goes first. Aging
keeps it fair: a collaboration's level drops as it grows old, without bound,
so every collaboration eventually outranks any newcomer (no starvation).

The result is vLLM's request ``priority`` (lower runs first). vLLM's priority
policy orders the waiting queue by it, and preempts the lowest-priority
running request (by recompute) when a step cannot allocate; the engine's
``stats().preemptions`` counts that churn.
"""

from __future__ import annotations

import math

import attrs

#: Priority values one level spans: room for a collaboration's critical-path offsets.
LEVEL_SPAN = 64


def _positive(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class ServicePolicy:
    """Least attained service with aging, as a request priority.

    Attributes:
        level_tokens: engine tokens (computed prompt + generated) of the first
            level; each next level doubles it (levels are ``log2`` of the service).
        aging_seconds: a collaboration gains one level of precedence per this
            many seconds of age.
        enabled: False sends every request at its critical-path priority only.
    """

    level_tokens: float = attrs.field(default=512.0, validator=_positive)
    aging_seconds: float = attrs.field(default=10.0, validator=_positive)
    enabled: bool = True

    def level(self, attained_tokens: int, age_seconds: float) -> int:
        """The collaboration's level: lower is served first (may be negative when old)."""
        served = math.floor(math.log2(1 + max(0, attained_tokens) / self.level_tokens))
        return served - math.floor(max(0.0, age_seconds) / self.aging_seconds)

    def priority(self, attained_tokens: int, age_seconds: float, critical: int = 0) -> int:
        """The request priority: the collaboration's level, then its critical-path offset.

        ``critical`` is the mode's own priority for the step (0 normal, negative
        on the critical path); it is clamped to one level's span so that it
        orders steps inside a level and never jumps levels.
        """
        offset = max(-(LEVEL_SPAN // 2) + 1, min(LEVEL_SPAN // 2 - 1, critical))
        if not self.enabled:
            return offset
        return self.level(attained_tokens, age_seconds) * LEVEL_SPAN + offset
