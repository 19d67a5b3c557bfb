"""Where a request should run: its session's replica, its prefix's replica, or any.

The ingress reads this from the request body before it calls an engine replica;
``AffinityRouter`` turns it into a replica. Keys are digests, never the text.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping

import attrs

__all__ = ["PREFIX_CHARS", "RouteHint", "route_of"]

#: The leading characters of a conversation that choose its replica when it names no
#: session: about the first few KV blocks (a system prompt and the shared document), so
#: requests over one document meet their cached prefix, and short unrelated ones spread.
PREFIX_CHARS = 2048
_TICKETS = itertools.count()
#: Paths whose body is a chat or Responses request (others go anywhere).
ROUTED_PATHS = frozenset({"/v1/chat/completions", "/v1/responses"})


@attrs.define
class RouteHint:
    """A request's routing key.

    Serve copies a call's arguments before its router sees them, so the router's choice
    comes back through ``_router.PREFERRED`` under the hint's ``ticket``.

    Attributes:
        kind: ``"session"`` (``prompt_cache_key``), ``"prefix"`` (the leading text),
            ``"replica"`` (pinned by the ``x-microagent-replica`` header) or ``"any"``.
        key: the digest the replica is chosen by (empty for ``"any"``).
        ticket: this hint's number in its process (how the router's choice is found).
    """

    kind: str
    key: str = ""
    ticket: int = attrs.field(factory=lambda: next(_TICKETS), eq=False)

    def decision(self, replica: str, preferred: str | None) -> str:
        """What the response says about its routing: served on ``replica`` when the router
        preferred ``preferred`` (None: it had no preference)."""
        if self.kind == "any" or preferred is None:
            return "any"
        return self.kind if replica == preferred else "fallback"


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _text(content: object) -> str:
    """A message's text (a string, or the text parts of a content list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _leading(body: Mapping[str, object]) -> str:
    """The conversation's opening: instructions and system messages, then its first other
    message (the first user turn), capped at ``PREFIX_CHARS``. Later turns extend a
    conversation without changing its opening, so every turn of it maps to one replica."""
    parts: list[str] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        parts.append(f"system:{instructions}")
    items = body.get("messages", body.get("input"))
    if isinstance(items, str):
        parts.append(f"user:{items}")
    elif isinstance(items, list):
        for item in items:
            if not isinstance(item, Mapping):
                continue
            role = str(item.get("role", item.get("type", "")))
            parts.append(f"{role}:{_text(item.get('content'))}")
            if role not in ("system", "developer"):
                break
    return "\n".join(parts)[:PREFIX_CHARS]


def route_of(path: str, body: bytes, tenant: str, pinned: str | None = None) -> RouteHint:
    """The routing key of a request to ``path`` with ``body``, for ``tenant``'s key digest.

    A ``prompt_cache_key`` is a session: scoped by the tenant, so two keys' equal cache
    keys are two sessions. Otherwise the model and the conversation's opening (``_leading``)
    choose the replica (a collaboration is one request: it never spans
    replicas). A body that does not parse goes anywhere; its replica answers the 400.
    """
    if pinned:
        return RouteHint("replica", pinned)
    if path not in ROUTED_PATHS:
        return RouteHint("any")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return RouteHint("any")
    if not isinstance(parsed, Mapping):
        return RouteHint("any")
    model = str(parsed.get("model", ""))
    session = parsed.get("prompt_cache_key")
    if isinstance(session, str) and session:
        return RouteHint("session", _digest("session", tenant, model, session))
    leading = _leading(parsed)
    if not leading:
        return RouteHint("any")
    return RouteHint("prefix", _digest("prefix", tenant, model, leading))
