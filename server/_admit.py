"""Admission: a planned request takes its place, or is refused before anything runs.

Three gates, in this order, each answered with ``Retry-After``: a request slot
(``max_concurrent_requests``, and ``max_concurrent_collaborations`` for a
collaboration, of which one key holds at most its share when the server has
several keys: 429), the engines' waiting queues (``max_engine_waiting``: 503),
and the API key's quota account at the plan's worst case (429). ``Admitted``
gives everything back exactly once, whichever way the request ends, and settles
the key's account with what the request really used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..engine_bridge import EngineBridge
from ._errors import ApiError
from ._quota import Admission
from ._state import ServerState, overloaded

#: The ASGI scope's ``state`` key of a callable told what the request used, once, when its
#: account settles: how a Ray Serve replica (``microagent.cluster``) reports a request's
#: tokens to the ingress that counts the key's quota (``Admitted.report``).
USAGE_REPORT = "microagent.usage_report"


@attrs.define(eq=False)
class Meter:
    """Tokens a stream has used so far (prompt and completion), counted as it goes."""

    tokens: int = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens


@attrs.define(eq=False)
class Admitted:
    """A request's slot and its key's admission, given back once by ``release``.

    Attributes:
        admission: its place in the key's quota account (None without quotas).
        meter: a stream's running count of what it used (None for a JSON reply).
        report: told what the request used when it settles, once (``USAGE_REPORT``).
    """

    _state: ServerState
    _collaboration: bool
    _tenant: str
    admission: Admission | None = None
    meter: Meter | None = None
    report: Callable[[int], None] | None = None
    _released: bool = False
    _reported: bool = False

    def settle(self, used_tokens: int) -> None:
        """Charge the key what the request used (a finished reply: not its worst case)."""
        if self.admission is not None:
            self.admission.settle(used_tokens)
        self._report(used_tokens)

    def _report(self, used_tokens: int) -> None:
        if self.report is not None and not self._reported:
            self._reported = True
            self.report(used_tokens)

    def release(self) -> None:
        """Give the slot back and settle the key's account, if nothing settled it before:
        with what the meter counted (a stream, whole or cut), else at the worst case (a
        request that failed after it was admitted). Idempotent."""
        if self._released:
            return
        self._released = True
        meter = self.meter
        if self.admission is not None:
            self.admission.settle(meter.tokens if meter is not None else self.admission.promised)
        self._report(meter.tokens if meter is not None else 0)  # a failed JSON reply: 0 used
        self._state.requests -= 1
        if self._collaboration:
            self._state.collaborations -= 1
            held = self._state.key_collaborations
            held[self._tenant] -= 1
            if not held[self._tenant]:
                del held[self._tenant]


def admit(
    state: ServerState,
    tenant: str,
    bridges: Sequence[EngineBridge],
    worst_tokens: int,
    *,
    collaboration: bool,
    stream: bool,
    report: Callable[[int], None] | None = None,
) -> Admitted:
    """Take a slot, check the engines' queues and admit ``worst_tokens`` on ``tenant``'s
    account; the first gate that is full refuses (429 or 503, nothing taken)."""
    limits = state.limits
    if state.requests >= limits.max_concurrent_requests:
        raise overloaded(state, "concurrent_requests")
    if collaboration and state.collaborations >= limits.max_concurrent_collaborations:
        raise overloaded(state, "concurrent_collaborations")
    if collaboration and state.api_keys > 1:
        share = limits.collaborations_per_key
        held = state.key_collaborations.get(tenant, 0)
        if held >= share:
            state.metrics.inc("microagent:rejected_total", reason="key_collaborations")
            raise ApiError(
                429,
                f"this API key runs {held} collaborations, its share of the server's "
                f"{limits.max_concurrent_collaborations}; retry when one finishes",
                code="collaboration_share_exceeded",
                type="rate_limit_error",
                headers={"retry-after": str(limits.retry_after)},
            )
    if limits.max_engine_waiting is not None:
        for bridge in bridges:
            if bridge.stats().scheduler_waiting >= limits.max_engine_waiting:
                raise overloaded(state, "engine_queue")
    admission: Admission | None = None
    if state.quotas is not None:
        try:
            admission = state.quotas.admit(tenant, worst_tokens)
        except ApiError as exc:
            state.metrics.inc("microagent:rejected_total", reason=exc.code or "quota")
            raise
    state.requests += 1
    if collaboration:
        state.collaborations += 1
        state.key_collaborations[tenant] = state.key_collaborations.get(tenant, 0) + 1
    return Admitted(state, collaboration, tenant, admission, Meter() if stream else None, report)
