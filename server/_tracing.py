"""What a collaboration's OpenTelemetry trace says about its HTTP request.

``genai_request`` turns a plan's request into the GenAI attributes of the
collaboration's span (``collab.trace.GenAIRequest``): the sampling parameters the
client gave, the conversation (its session: ``prompt_cache_key``, which a
``previous_response_id`` chain sets to the chain's) and the response's id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..collab.trace import GenAIRequest

if TYPE_CHECKING:
    from ._plan import CollaborationPlan


def genai_request(plan: CollaborationPlan) -> GenAIRequest:
    """The GenAI request attributes of ``plan``'s collaboration (absent: not given)."""
    body = plan.body
    return GenAIRequest(
        temperature=body.temperature,
        top_p=body.top_p,
        max_tokens=(
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        ),
        seed=body.seed,
        conversation_id=body.prompt_cache_key,
        response_id=plan.stamp.id,
    )
