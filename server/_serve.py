"""Serving a plan: admit it, run it on the engine loop, and render it with a dialect's
renderer, streamed or as one JSON body.

Every route that runs a model (chat completions, Responses, text completions)
ends here with its own ``Renderer``; the stages are the same whatever the
dialect. A JSON reply gives the request's place back when it is sent; a stream
gives it back when it ends (``_run``).
"""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from ..collab import Outcome
from ._admit import USAGE_REPORT, Admitted, admit
from ._plan import CollaborationPlan, CompletionPlan, Plan
from ._run import Completed, collaborate_once, complete
from ._state import ServerState


class Renderer(Protocol):
    """A dialect's rendering of a run: a finished one as JSON, a streamed one as events."""

    def completion(self, plan: CompletionPlan, done: Completed) -> Response:
        """A finished plain completion's body."""
        ...

    def collaboration(self, plan: CollaborationPlan, outcome: Outcome) -> Response:
        """A finished collaboration's body."""
        ...

    def stream_completion(
        self, state: ServerState, plan: CompletionPlan, admitted: Admitted
    ) -> Response:
        """A plain completion's stream (it runs as the client reads)."""
        ...

    def stream_collaboration(
        self, state: ServerState, plan: CollaborationPlan, admitted: Admitted
    ) -> Response:
        """A collaboration's stream (it runs as the client reads)."""
        ...


async def serve_plan(
    state: ServerState,
    request: Request,
    tenant: str,
    plan: Plan,
    renderer: Renderer,
    *,
    stream: bool,
    deadline: float,
) -> Response:
    """Admit ``plan`` for ``tenant``, run it and render it with ``renderer`` (``deadline``:
    by when a rerun after an engine loss must finish). A client that left gets 499."""
    admitted = _admit(state, tenant, plan, stream, request)
    if stream:  # the stream gives its place back when it ends
        if isinstance(plan, CollaborationPlan):
            return renderer.stream_collaboration(state, plan, admitted)
        return renderer.stream_completion(state, plan, admitted)
    try:
        if isinstance(plan, CollaborationPlan):
            outcome = await collaborate_once(state, plan, admitted, request, deadline)
            if outcome is None:
                return Response(status_code=499)
            return renderer.collaboration(plan, outcome)
        done = await complete(state, plan, admitted, request, deadline)
        if done is None:
            return Response(status_code=499)
        return renderer.completion(plan, done)
    finally:
        admitted.release()


def _admit(state: ServerState, tenant: str, plan: Plan, stream: bool, request: Request) -> Admitted:
    """The plan's place: a slot, its engines' queues, its key's quota at its worst case."""
    collaboration = isinstance(plan, CollaborationPlan)
    bridges = plan.bridges if isinstance(plan, CollaborationPlan) else (plan.bridge,)
    report = request.scope.get("state", {}).get(USAGE_REPORT)
    return admit(
        state,
        tenant,
        bridges,
        plan.worst_tokens,
        collaboration=collaboration,
        stream=stream,
        report=report,
    )
