"""A planned, admitted request that is not streamed: run it (again, if its engine died
and nothing forbids it, within the retry deadline) and render its JSON body.

A client that leaves cancels the run (499, nothing rendered); the key's quota is
settled with what the request used, not its worst case: a reply that finished with
its usage, one cut short with what its meter counted as it ran (each prompt when
submitted and each token generated; a collaboration's finished turns), as a stream.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..collab import CollaborationEvent, Outcome
from ..engine_bridge import GenerationResult
from ._admit import Admitted, Meter
from ._plan import CollaborationPlan, CompletionPlan
from ._render import choice, collaboration_response, usage
from ._retry import ToolWatch, retry_after, run_retrying
from ._run import (
    ClientGone,
    collaboration_turn_done,
    engine_error,
    generate_n,
    run_collaboration,
    turn_done,
    until_disconnect,
)
from ._state import ServerState


async def complete(
    state: ServerState,
    plan: CompletionPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> tuple[list[GenerationResult], list[dict[str, Any]]] | None:
    """Run a plain completion: its results and their ``choices[]`` (None: the client left).

    The key is charged what it used, the session keeps its turn, the usage is counted.
    """
    bridge, body, session = plan.bridge, plan.body, plan.session
    hint = retry_after([bridge], state.limits.retry_after)
    meter = _metered(admitted)

    async def attempt() -> list[GenerationResult]:
        try:
            return await generate_n(
                bridge,
                plan.prompt,
                plan.sampling,
                body.n,
                session.priority,
                session.retain,
                used=meter.add,
            )
        except Exception as exc:
            raise engine_error(exc, hint) from None

    try:
        results = await until_disconnect(
            request,
            lambda: run_retrying(
                attempt, kind="completion", metrics=state.metrics, deadline=deadline
            ),
        )
    except ClientGone:
        return None
    except Exception as exc:
        raise engine_error(exc, hint) from None
    prompt_tokens, cached, completion = used_tokens(results)
    admitted.settle(prompt_tokens + completion)  # what it used, not its worst case
    top = body.top_logprobs or 0
    choices = [choice(bridge, i, r, plan.tools, top) for i, r in enumerate(results)]
    await turn_done(state, bridge, plan.tenant, session, results[0], choices[0]["message"])
    state.metrics.add_usage(prompt_tokens, cached, completion, model=bridge.model)
    return results, choices


async def reply_completion(
    state: ServerState,
    plan: CompletionPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> Response:
    """A plain completion's ``chat.completion`` body, its ``n`` choices and ``usage``."""
    done = await complete(state, plan, admitted, request, deadline)
    if done is None:
        return Response(status_code=499)
    results, choices = done
    stamp = plan.stamp
    return JSONResponse(
        {
            "id": stamp.id,
            "object": "chat.completion",
            "created": stamp.created,
            "model": stamp.model,
            "choices": choices,
            "usage": usage(*used_tokens(results)),
        }
    )


def _metered(admitted: Admitted) -> Meter:
    """The meter of a JSON reply (a stream's is made when it is admitted): what the key is
    charged if the request ends before its usage is known (its client left)."""
    if admitted.meter is None:
        admitted.meter = Meter()
    return admitted.meter


def used_tokens(results: list[GenerationResult]) -> tuple[int, int, int]:
    """Prompt, cached and completion tokens of ``results`` together."""
    return (
        sum(r.prompt_tokens for r in results),
        sum(r.cached_tokens for r in results),
        sum(r.completion_tokens for r in results),
    )


async def collaborate_once(
    state: ServerState,
    plan: CollaborationPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> Outcome | None:
    """Run a collaboration (again after an engine loss, unless it ran a tool: its effect
    happened); its outcome, or None when the client left."""
    meter = _metered(admitted)

    def count(event: CollaborationEvent) -> None:
        if event.type == "agent_finished":  # each engine request's usage, as it ends
            used = [event.data.get("prompt_tokens"), event.data.get("completion_tokens")]
            meter.add(sum(n for n in used if isinstance(n, int)))

    watch = ToolWatch(forward=count)
    mode = plan.prepared.op.name

    def lost() -> None:
        state.metrics.inc("microagent:collaborations_total", mode=mode, status="failed")

    try:
        outcome = await until_disconnect(
            request,
            lambda: run_retrying(
                lambda: run_collaboration(state, plan, watch),
                kind="collaboration",
                metrics=state.metrics,
                deadline=deadline,
                may_retry=lambda: not watch.ran_tool,
                on_lost=lost,
            ),
        )
    except ClientGone:  # counted as cancelled by run_collaboration
        return None
    admitted.settle(outcome.usage.prompt_tokens + outcome.usage.completion_tokens)
    await collaboration_turn_done(state, plan, outcome.answer)
    return outcome


async def reply_collaboration(
    state: ServerState,
    plan: CollaborationPlan,
    admitted: Admitted,
    request: Request,
    deadline: float,
) -> Response:
    """A collaboration's ``chat.completion`` body with its ``collaboration`` outcome."""
    outcome = await collaborate_once(state, plan, admitted, request, deadline)
    if outcome is None:
        return Response(status_code=499)
    stamp = plan.stamp
    return JSONResponse(collaboration_response(outcome, stamp.model, stamp.id, stamp.created))
