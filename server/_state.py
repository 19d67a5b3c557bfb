"""What one server holds: its limits, engines, counters and the per-key state.

``ServerState`` is created once by ``create_app`` and handed to every stage of a
request (parse, plan, admit, run, render); nothing else is shared between them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
from starlette.requests import Request

from ..collab import Tool
from ..collab.trace import OtlpTracing
from ..engine_bridge import EngineBridge
from ._errors import ApiError
from ._metrics import ServerMetrics
from ._quota import KeyQuota, Quotas, key_id
from ._sessions import Sessions
from ._shutdown import Drain
from ._sse import DEFAULT_MAX_BYTES, DEFAULT_SEND_TIMEOUT, EventBuffer, SSEResponse

if TYPE_CHECKING:
    from ._presets import Preset


@attrs.frozen(kw_only=True)
class ServerLimits:
    """What one server accepts; past these, requests get 400 (bad input) or 429/503 (overload).

    Attributes:
        max_agents_per_spec: the largest ``count`` of one agent spec.
        max_total_agents: agents of one collaboration, all specs together.
        max_concurrent_collaborations: collaborations running at once (then 429).
        max_concurrent_requests: chat requests of any kind running at once (then 429).
        max_engine_waiting: requests waiting in an engine's queue before new work gets 503.
        max_body_bytes: request body size limit (then 413).
        max_sse_buffer: pending stream events per client before deltas are dropped.
        max_n: the largest ``n`` of a plain completion.
        retry_after: seconds suggested in ``Retry-After`` on 429/503.
        retry_deadline: seconds after its arrival by which a non-streaming request
            whose engine died must have finished its rerun on the restarted engine;
            past it (or when it cannot be run again), a 503 with ``Retry-After``.
        allow_code_validators: accept the ``python_tests`` validator, which runs
            client-supplied code on this machine, in a sandbox (``run_sandboxed``).
        allow_calculator: accept the ``compute`` mode and ``auto``'s ``calculator``,
            which evaluate model-written arithmetic in the sandbox (``serve --calculator``,
            which also offers the ``calculator`` tool).
        max_collaboration_tokens: tokens (prompt and completion, all agents together)
            one request may use; None: ``request_tokens_per_context`` times the
            ``max_model_len`` of the request's model (``request_budget``). A request whose
            worst case is over it gets 400, and a running collaboration is stopped before
            a turn that could cross it (or the key's tokens per minute, when lower).
        request_tokens_per_context: the default budget's multiple of the model's context:
            16, the most samples (``n``) of one plain completion, so no plain completion
            that fits the context is refused by it.
        request_timeout: seconds a collaboration may run (its ``collaboration.timeout``
            when it names a shorter one; a longer one is a 400); past it, a 504.
        max_collaborations_per_key: collaborations one API key may run at once when the
            server has several keys (then 429); None: half of
            ``max_concurrent_collaborations`` (at least 1), so no key holds every slot.
        max_sse_bytes: what one stream may hold unsent (its text plus
            ``SSE_ITEM_BYTES`` per event); past it the client is not reading: its
            stream ends and its work is cancelled.
        sse_send_timeout: seconds one write to a stream's client may wait (a client
            that reads nothing for this long is disconnected).
        key_quota: per-API-key limits (requests in flight, tokens per minute; 429 with
            ``Retry-After``); every client together is one account without a key.
    """

    max_agents_per_spec: int = 32
    max_total_agents: int = 128
    max_concurrent_collaborations: int = 64
    max_concurrent_requests: int = 1024
    max_engine_waiting: int | None = None
    max_body_bytes: int = 1 << 20
    max_sse_buffer: int = 256
    max_n: int = 16
    retry_after: int = 1
    retry_deadline: float = 120.0
    allow_code_validators: bool = False
    allow_calculator: bool = False
    max_collaboration_tokens: int | None = None
    request_tokens_per_context: int = 16
    request_timeout: float = 300.0
    max_collaborations_per_key: int | None = None
    max_sse_bytes: int = DEFAULT_MAX_BYTES
    sse_send_timeout: float = DEFAULT_SEND_TIMEOUT
    key_quota: KeyQuota = attrs.field(factory=KeyQuota)

    @property
    def collaborations_per_key(self) -> int:
        """What one key may run at once on a server with several keys (its fair share)."""
        if self.max_collaborations_per_key is not None:
            return self.max_collaborations_per_key
        return max(1, self.max_concurrent_collaborations // 2)


@attrs.define
class ServerState:
    """The server's engines, limits, counters, tools, quotas and sessions."""

    engines: dict[str, EngineBridge]
    limits: ServerLimits
    metrics: ServerMetrics
    created: int
    #: what ``collaboration.tools`` can name: a ``--tool`` (one tool) or an ``--mcp`` server
    tools: dict[str, tuple[Tool, ...]] = attrs.Factory(dict)
    collaborations: int = 0
    requests: int = 0
    drain: Drain = attrs.Factory(Drain)
    quotas: Quotas | None = None
    sessions: Sessions = attrs.Factory(Sessions)
    #: salt each API key's prefix cache apart (several keys, no shared cache)
    salted: bool = False
    #: OpenTelemetry: each collaboration's trace goes here (None: off, nothing loaded)
    tracing: OtlpTracing | None = None
    #: what the cached OpenAPI document lists (models, adapters, modes, tools)
    openapi_for: tuple[tuple[str, ...], ...] = ()
    #: API keys the server accepts (several: each key gets a fair share of collaborations)
    api_keys: int = 0
    #: collaborations running per API key id
    key_collaborations: dict[str, int] = attrs.Factory(dict)
    #: collaborations served under a model name (``serve --preset``), by that name
    presets: dict[str, Preset] = attrs.Factory(dict)

    def event_buffer(self) -> EventBuffer:
        """A stream's buffer, bounded by this server's limits (events and bytes)."""
        return EventBuffer(self.limits.max_sse_buffer, self.limits.max_sse_bytes)

    def sse_response(
        self,
        produce: Callable[[EventBuffer], Awaitable[None]],
        buffer: EventBuffer,
        on_close: Callable[[], None],
    ) -> SSEResponse:
        """A stream ``produce`` fills through ``buffer``: tracked by the drain, and cut
        when its client reads nothing for this server's send timeout."""
        return SSEResponse(
            produce,
            buffer,
            on_close=on_close,
            track=self.drain.track,
            send_timeout=self.limits.sse_send_timeout,
        )


def engine_for(state: ServerState, name: str | None, param: str = "model") -> EngineBridge:
    """The engine a request (or an agent: ``param``) names.

    An unknown request ``model`` is a 404 ``model_not_found`` (what vLLM and OpenAI answer:
    the SDKs raise ``NotFoundError``); an unknown agent's model is a 400 naming its field.
    """
    if name is None:
        return next(iter(state.engines.values()))
    found = state.engines.get(name)
    if found is None and name == "default":
        return next(iter(state.engines.values()))
    if found is None:
        for bridge in state.engines.values():
            if bridge.model == name:
                return bridge
        raise ApiError(
            404 if param == "model" else 400,
            f"unknown model {name!r}; served: {sorted(state.engines)}",
            param=param,
            code="model_not_found",
            type="invalid_request_error",
        )
    return found


def tenant_of(request: Request) -> str:
    """The request's API key id (a digest): its quota account, cache salt and session scope."""
    found = getattr(request.state, "api_key_id", None)
    return found if isinstance(found, str) else key_id(None)


def overloaded(state: ServerState, what: str) -> ApiError:
    """429 (503 for a full engine queue) with ``Retry-After``, counted as rejected."""
    state.metrics.inc("microagent:rejected_total", reason=what)
    status = 503 if what == "engine_queue" else 429
    return ApiError(
        status,
        f"server overloaded ({what.replace('_', ' ')}); retry later",
        code="overloaded",
        headers={"retry-after": str(state.limits.retry_after)},
    )
