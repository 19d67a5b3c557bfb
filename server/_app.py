"""The FastAPI app: OpenAI chat completions, with agents and collaboration when asked.

``create_app(engines)`` serves already-built bridges (a ``ScriptedEngine`` in
tests, ``VLLMBridge``s from ``microagent serve``). Everything heavy happens on
the engines; the event loop only composes token ids (long texts off-loop),
validates, and relays events. Collaboration logic lives in ``actors``: the
server validates with ``prepare_collaboration`` and runs ``collaborate``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio
import attrs
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ..collab import (
    DEFAULT_MAX_TOOL_STEPS,
    AgentSpec,
    CollaborationEvent,
    CollaborationFailed,
    EventCallback,
    InvalidCollaboration,
    McpServer,
    Outcome,
    PreparedCollaboration,
    TokenBudgetExceeded,
    Tool,
    agent_tool_plan,
    collaborate,
    collaboration_modes,
    largest_turn,
    mcp_tools,
    prepare_collaboration,
    unknown_agent_tool,
    worst_case_tokens,
)
from ..engine_bridge import (
    EngineBridge,
    EngineDied,
    EngineUnavailable,
    GenerationResult,
    KVHandle,
    RequestRefused,
    Retain,
    Sampling,
    ToolCallStream,
    ToolPlan,
    UnknownAdapter,
    open_bridges,
    render_tool_result,
    salt_for,
    set_cache_salt,
    with_tool_instructions,
)
from ._errors import ApiError, bad_request, error_responses
from ._guard import Guard
from ._logprobs import choice_logprobs, logprobs_content
from ._metrics import ServerMetrics
from ._params import check_parameters, check_sampling, max_tokens_of, sampling_fields, stops_of
from ._quota import Admission, KeyQuota, Quotas, key_id
from ._remote import remote_failure
from ._responses import completion_responses, health_responses
from ._retry import (
    EngineLost,
    ToolWatch,
    count_lost,
    death_counts,
    died_since,
    engine_cause,
    retry_after,
    run_retrying,
)
from ._schemas import ChatCompletionRequest, served_rules
from ._sessions import SessionPlan, Sessions, SessionSettings
from ._shutdown import Drain
from ._sse import DONE, EventBuffer, SSEResponse, StreamItem
from ._tools import history_calls, tool_plan
from ._ui import add_ui

T = TypeVar("T")

DEFAULT_MAX_TOKENS = 512
"""Completion budget of a plain completion that gives no ``max_tokens``."""


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
        max_collaboration_tokens: completion tokens one request may generate, all
            agents together; a request whose worst case is over it gets 400, and a mode
            with no known bound is stopped before a turn that could cross it.
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
    max_collaboration_tokens: int | None = None
    key_quota: KeyQuota = attrs.field(factory=KeyQuota)


@attrs.define
class _State:
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
    #: what the cached OpenAPI document lists (models, adapters, modes, tools)
    openapi_for: tuple[tuple[str, ...], ...] = ()


def create_app(
    engines: Mapping[str, EngineBridge],
    *,
    api_key: str | Sequence[str] | None = None,
    limits: ServerLimits | None = None,
    open_engines: bool = False,
    title: str = "microagent",
    tools: Iterable[Tool] = (),
    mcp_servers: Mapping[str, McpServer | str] | None = None,
    drain: Drain | None = None,
    sessions: SessionSettings | None = None,
) -> FastAPI:
    """The OpenAI-compatible app serving ``engines`` (served model id -> bridge).

    Args:
        engines: the served models; the first is used when a request names none
            (or names ``"default"`` and no engine is called that).
        api_key: when set (one key, or several), every route but ``/health`` and the
            browser view's files needs ``Authorization: Bearer <key>``; each key has its
            own quota account (``ServerLimits.key_quota``).
        limits: request and overload limits.
        open_engines: open the bridges on startup and close them on shutdown
            (``microagent serve``); otherwise the caller owns their lifecycle.
        title: the OpenAPI title.
        tools: the tools a collaboration may give its agents (``collaboration.tools``
            names them); nothing else can run here.
        mcp_servers: MCP servers (name -> command) started with the app; naming one in
            ``collaboration.tools`` gives the agents all of its tools.
        drain: the graceful-shutdown state (``microagent serve`` drains it on SIGTERM:
            new requests get 503, those in flight get its grace period).
        sessions: how turns are retained for the next one (``prompt_cache_*``, tool
            calls), and whether several API keys share one prefix cache.
    """
    if not engines:
        raise ValueError("serve at least one engine")
    state = _State(
        dict(engines),
        limits or ServerLimits(),
        ServerMetrics(),
        int(time.time()),
        tools={t.name: (t,) for t in tools},
        drain=drain or Drain(),
    )
    state.sessions = Sessions(sessions or SessionSettings())
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    state.salted = len(keys) > 1 and not state.sessions.settings.shared_cache
    state.drain.pending = lambda: state.requests
    if state.limits.key_quota.limited:
        state.quotas = Quotas(state.limits.key_quota, retry_after=state.limits.retry_after)
    servers = dict(mcp_servers or {})
    clash = sorted(set(servers) & set(state.tools))
    if clash:
        raise ValueError(f"tool names used twice (--tool and --mcp): {clash}")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for name, command in servers.items():
                state.tools[name] = tuple(await stack.enter_async_context(mcp_tools(command)))
            if open_engines:
                await stack.enter_async_context(open_bridges(state.engines.values()))
            try:
                yield
            finally:
                for name in servers:
                    state.tools.pop(name, None)

    app = FastAPI(title=title, version="0.1.0", lifespan=lifespan)
    app.state.microagent = state
    app.add_middleware(Guard, api_keys=keys, max_body_bytes=state.limits.max_body_bytes)
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
        return {"status": "ok", "models": list(state.engines)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": state.created, "owned_by": "microagent"}
                for name in state.engines
            ],
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        state.metrics.collaborations_running = state.collaborations
        state.metrics.requests_running = state.requests
        retention = {}
        for name, bridge in state.engines.items():
            with contextlib.suppress(Exception):  # a restarting engine reports nothing
                retention[name] = await bridge.retention_stats()
        return PlainTextResponse(
            state.metrics.render(state.engines, retention), media_type="text/plain; version=0.0.4"
        )

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={**completion_responses(), **error_responses(400, 401, 413, 429, 500, 503)},
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI chat completions; with ``agents``, a multi-agent collaboration."""
        kind = (
            "collaboration"
            if body.agents is not None or body.collaboration is not None
            else "completion"
        )
        # every engine request this request starts (its stream and actors too) is salted
        # with its key's salt: tenants never share, hit or release each other's blocks
        set_cache_salt(salt_for(_tenant(request)) if state.salted else None)
        try:
            if state.drain.draining:
                state.metrics.inc("microagent_rejected_total", reason="shutting_down")
                state.drain.check()
            response: Response | None = None
            with state.drain.track():  # cancelled if it outlives a shutdown's grace period
                if body.agents is not None or body.collaboration is not None:
                    response = await _collaboration(state, body, request)
                else:
                    response = await _completion(state, body, request)
            if response is None:
                raise state.drain.refusal()
        except ApiError as exc:
            state.metrics.inc("microagent_requests_total", kind=kind, status=str(exc.status))
            raise
        state.metrics.inc("microagent_requests_total", kind=kind, status=str(response.status_code))
        return response

    app.openapi = lambda: _openapi(app, state)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI, state: _State) -> dict[str, Any]:
    """FastAPI's document without its 422 responses, plus this server's own rules.

    Validation errors are answered 400. The served models, registered modes and
    adapters and the server's tools are listed as they are now: the document is
    rebuilt when one of them changes (``register_mode`` after startup, say).
    """
    models = sorted({*state.engines, *(b.model for b in state.engines.values()), "default"})
    adapters = sorted({a for b in state.engines.values() for a in b.adapters})
    served = (tuple(models), tuple(adapters), tuple(collaboration_modes()), tuple(state.tools))
    if app.openapi_schema is None or state.openapi_for != served:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        served_rules(
            schema,
            models=models,
            adapters=adapters,
            modes=served[2],
            server_tools=served[3],
            max_n=state.limits.max_n,
            max_agents_per_spec=state.limits.max_agents_per_spec,
            max_total_agents=state.limits.max_total_agents,
        )
        app.openapi_schema = schema
        state.openapi_for = served
    return app.openapi_schema


# -- validation -------------------------------------------------------------------------


def _validation_message(errors: Sequence[Any]) -> ApiError:
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


def _engine(state: _State, name: str | None, param: str = "model") -> EngineBridge:
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
            400,
            f"unknown model {name!r}; served: {sorted(state.engines)}",
            param=param,
            code="model_not_found",
            type="invalid_request_error",
        )
    return found


def _messages(body: ChatCompletionRequest, plan: ToolPlan | None = None) -> list[dict[str, str]]:
    """The conversation as role/content pairs, tool calls and results as the model reads them.

    ``messages`` is never empty here: the schema's ``minItems`` refuses that with a 400.
    """
    out: list[dict[str, str]] = []
    call_ids: set[str] = set()
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        text = _message_text(message.content, where)
        role = "system" if message.role == "developer" else message.role
        if message.tool_calls is not None:
            if role != "assistant":
                raise bad_request(
                    f"{where}.tool_calls: only assistant messages make tool calls",
                    f"{where}.tool_calls",
                )
            text = history_calls(text, message.tool_calls, where)
            call_ids.update(str(c.get("id")) for c in message.tool_calls if isinstance(c, dict))
        if role == "tool":
            if message.tool_call_id is None:
                raise bad_request(
                    f"{where}.tool_call_id is required in a tool message",
                    f"{where}.tool_call_id",
                )
            if message.tool_call_id not in call_ids:
                raise bad_request(
                    f"{where}: a tool message must answer a tool call of an earlier "
                    f"assistant message (no call has id {message.tool_call_id!r})",
                    f"{where}.tool_call_id",
                )
            text = render_tool_result(text)
        elif message.tool_call_id is not None:
            raise bad_request(
                f"{where}.tool_call_id belongs to tool messages", f"{where}.tool_call_id"
            )
        out.append({"role": role, "content": text})
    if all(not m["content"].strip() for m in out):
        raise bad_request("messages must contain some text", "messages")
    if plan is not None:
        return with_tool_instructions(out, plan)
    return out


def _message_text(content: str | list[Any] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"{where}.content[{j}]: only text parts are supported", f"{where}.content"
            )
        parts.append(part.text)
    return "".join(parts)


async def _compose(bridge: EngineBridge, messages: Sequence[Mapping[str, Any]]) -> KVHandle:
    """The conversation as a handle; long texts are tokenized off the event loop."""
    chat: Any = bridge.chat
    messages = list(messages)
    roles = getattr(getattr(chat, "template", None), "roles", None)
    if roles is not None:
        for i, m in enumerate(messages):
            if m["role"] == "tool" and "tool" not in roles:  # a template without tool turns
                messages[i] = {"role": "user", "content": m["content"]}
            elif m["role"] not in roles:
                raise bad_request(
                    f"messages[{i}].role: role {m['role']!r} is not supported by the chat "
                    "template of "
                    f"{bridge.model!r} (supported: {sorted(roles)})",
                    f"messages[{i}].role",
                )
    size = sum(len(m["content"]) for m in messages)
    try:
        if size < 2048:
            handle: KVHandle = chat.context(messages)
            return handle
        result: KVHandle = await anyio.to_thread.run_sync(chat.context, messages)
        return result
    except (ValueError, KeyError, TypeError) as exc:
        raise bad_request(
            f"messages cannot be composed for {bridge.model!r}: {exc}", "messages"
        ) from None


def _context_limit(bridge: EngineBridge) -> int | None:
    value = getattr(bridge, "max_model_len", None)
    return value if isinstance(value, int) and value > 0 else None


def _check_length(bridge: EngineBridge, prompt_tokens: int, max_tokens: int) -> None:
    limit = _context_limit(bridge)
    if limit is None:
        return
    if prompt_tokens >= limit:
        raise bad_request(
            f"the context is {prompt_tokens} tokens; model {bridge.model!r} allows {limit}",
            "messages",
            "context_length_exceeded",
        )
    if prompt_tokens + max_tokens > limit:
        raise bad_request(
            f"the context ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
            f"the {limit} tokens model {bridge.model!r} allows",
            "max_tokens",
            "context_length_exceeded",
        )


def _overloaded(state: _State, what: str) -> ApiError:
    state.metrics.inc("microagent_rejected_total", reason=what)
    status = 503 if what == "engine_queue" else 429
    return ApiError(
        status,
        f"server overloaded ({what.replace('_', ' ')}); retry later",
        code="overloaded",
        headers={"retry-after": str(state.limits.retry_after)},
    )


def _check_engine_queue(state: _State, bridges: Sequence[EngineBridge]) -> None:
    limit = state.limits.max_engine_waiting
    if limit is None:
        return
    for bridge in bridges:
        if bridge.stats().scheduler_waiting >= limit:
            raise _overloaded(state, "engine_queue")


def _engine_error(exc: BaseException, retry: int = 5) -> ApiError:
    """The API error for ``exc``; an engine failure is ``EngineLost`` (503, ``Retry-After``)."""
    if isinstance(exc, ApiError):
        return exc
    remote = remote_failure(exc)
    if remote is not None:
        return remote
    if isinstance(exc, UnknownAdapter):
        return bad_request(str(exc), "adapter", "adapter_not_found")
    if isinstance(exc, RequestRefused):
        return bad_request(str(exc), exc.field)
    if isinstance(exc, EngineDied | EngineUnavailable):
        return EngineLost(exc, retry)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


# -- running until the client leaves ------------------------------------------------------


class _ClientGone(Exception):
    pass


async def _until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work``; cancel it if the client disconnects first (raises ``_ClientGone``)."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    tg.cancel_scope.cancel()
                    return

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:
                failure.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if failure:
        raise failure[0]
    if not outcome:
        raise _ClientGone
    return outcome[0]


def _reserve(state: _State, collaboration: bool) -> Callable[[], None]:
    """Take a request slot (429 when none is free); returns its idempotent release."""
    limits = state.limits
    if state.requests >= limits.max_concurrent_requests:
        raise _overloaded(state, "concurrent_requests")
    if collaboration and state.collaborations >= limits.max_concurrent_collaborations:
        raise _overloaded(state, "concurrent_collaborations")
    state.requests += 1
    state.collaborations += int(collaboration)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.requests -= 1
            state.collaborations -= int(collaboration)

    return release


def _check_budget(
    state: _State, worst: int, param: str, prepared: PreparedCollaboration | None = None
) -> None:
    """A 400 when a request's worst case is over the server's per-request token budget."""
    budget = state.limits.max_collaboration_tokens
    if budget is None or worst <= budget:
        return
    how = ""
    if prepared is not None:
        turns = prepared.op.max_turns(prepared.config, prepared.agents)
        how = f" ({turns} turns of up to {largest_turn(prepared)} tokens, tool steps included)"
    raise bad_request(
        f"{param}: this request may generate up to {worst} completion tokens{how}, more than "
        f"this server's budget of {budget} per request; lower max_tokens, the agents' count "
        "or collaboration.rounds",
        param,
        "token_budget_exceeded",
    )


def _tenant(request: Request) -> str:
    """The request's API key id (a digest): its quota account, cache salt and session scope."""
    found = getattr(request.state, "api_key_id", None)
    return found if isinstance(found, str) else key_id(None)


def _admit(state: _State, request: Request, worst: int) -> Admission | None:
    """Take the request's place in its API key's quota account (429 when full)."""
    if state.quotas is None:
        return None
    key = _tenant(request)
    try:
        return state.quotas.admit(key, worst)
    except ApiError as exc:
        state.metrics.inc("microagent_rejected_total", reason=exc.code or "quota")
        raise


@attrs.define(eq=False)
class _Meter:
    """Tokens a stream has used so far (prompt and completion), counted as it goes."""

    tokens: int = 0

    def add(self, tokens: int) -> None:
        self.tokens += tokens


def _settling(
    release: Callable[[], None], admission: Admission | None, meter: _Meter | None = None
) -> Callable[[], None]:
    """``release`` that also settles ``admission``, if nothing settled it before: with what
    the ``meter`` counted (a stream, whole or cut), else at its worst case (a request that
    failed after it was admitted)."""
    if admission is None:
        return release

    def both() -> None:
        admission.settle(meter.tokens if meter is not None else admission.promised)
        release()

    return both


# -- responses ------------------------------------------------------------------------------


def _usage(prompt: int, cached: int, completion: int, **extra: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    usage.update(extra)
    return usage


def _finish_reason(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


@attrs.frozen
class _Stamp:
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, model: str) -> _Stamp:
        return cls(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model)

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def _fixed(payload: dict[str, Any] | str) -> StreamItem:
    return StreamItem(build=lambda _text: payload)


# -- plain completions ------------------------------------------------------------------------


async def _completion(state: _State, body: ChatCompletionRequest, request: Request) -> Response:
    deadline = anyio.current_time() + state.limits.retry_deadline
    bridge = _engine(state, body.model)
    check_parameters(body, collaboration=False)
    check_sampling(body, state.limits.max_n)
    plan = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls)
    fields = sampling_fields(body)
    if (
        plan is not None
        and plan.active
        and any(k in fields for k in ("json_schema", "json_object"))
    ):
        raise bad_request(
            "response_format json and tools cannot both shape one reply", "response_format"
        )
    tenant = _tenant(request)
    messages = state.sessions.splice(tenant, bridge, _messages(body, plan))
    release = _reserve(state, collaboration=False)
    handed = False
    try:
        _check_engine_queue(state, [bridge])
        context = await _compose(bridge, messages)
        prompt = bridge.chat.generation_prompt(context)
        limit = _context_limit(bridge)
        max_tokens = max_tokens_of(body)
        if max_tokens is None:
            max_tokens = (
                DEFAULT_MAX_TOKENS
                if limit is None
                else max(1, min(DEFAULT_MAX_TOKENS, limit - len(prompt)))
            )
        _check_length(bridge, len(prompt), max_tokens)
        _check_budget(state, body.n * max_tokens, "max_tokens")
        try:
            sampling = Sampling(
                max_tokens=max_tokens,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                seed=body.seed,
                stop=stops_of(body),  # type: ignore[arg-type]
                **fields,
            )
            if plan is not None:
                sampling = plan.constrain(sampling)
            for _ in range(body.n):  # refuse before anything starts
                bridge.check_request(prompt, sampling)
        except (RequestRefused, UnknownAdapter, EngineUnavailable) as exc:
            raise _engine_error(exc) from None
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        session = _session_plan(
            state, tenant, bridge, prompt, body, tools=plan is not None and plan.active
        )
        if body.n > 1:  # n forks of one prompt: none of them is the session's next turn
            session = attrs.evolve(session, retain=None)
        stamp = _Stamp.new(bridge.model)
        admission = _admit(state, request, len(prompt) * body.n + body.n * max_tokens)
        meter = _Meter() if body.stream else None
        release = _settling(release, admission, meter)
        if meter is not None:  # a stream
            handed = True
            return _stream_completion(
                state,
                bridge,
                body,
                prompt,
                sampling,
                stamp,
                release,
                meter,
                plan,
                (tenant, session),
            )
        hint = retry_after([bridge], state.limits.retry_after)

        async def attempt() -> list[GenerationResult]:
            try:
                return await _generate_n(
                    bridge, prompt, sampling, body.n, session.priority, session.retain
                )
            except Exception as exc:
                raise _engine_error(exc, hint) from None

        try:
            results = await _until_disconnect(
                request,
                lambda: run_retrying(
                    attempt, kind="completion", metrics=state.metrics, deadline=deadline
                ),
            )
        except _ClientGone:
            return Response(status_code=499)
        except Exception as exc:
            raise _engine_error(exc, hint) from None
        prompt_tokens = sum(r.prompt_tokens for r in results)
        cached = sum(r.cached_tokens for r in results)
        completion = sum(r.completion_tokens for r in results)
        if admission is not None:  # what it used, not its worst case
            admission.settle(prompt_tokens + completion)
        choices = [
            _choice(bridge, i, r, plan, body.top_logprobs or 0) for i, r in enumerate(results)
        ]
        await _turn_done(state, bridge, tenant, session, results[0], choices[0]["message"])
    finally:
        if not handed:
            release()
    state.metrics.add_usage(prompt_tokens, cached, completion)
    return JSONResponse(
        {
            "id": stamp.id,
            "object": "chat.completion",
            "created": stamp.created,
            "model": stamp.model,
            "choices": choices,
            "usage": _usage(prompt_tokens, cached, completion),
        }
    )


def _session_plan(
    state: _State,
    tenant: str,
    bridge: EngineBridge,
    prompt: KVHandle,
    body: ChatCompletionRequest,
    *,
    tools: bool,
) -> SessionPlan:
    """What the request's ``prompt_cache_*`` fields (and a tool call) ask the sessions to keep."""
    options = body.prompt_cache_options
    return state.sessions.plan(
        tenant,
        bridge,
        prompt,
        cache_key=body.prompt_cache_key,
        ttl=options.ttl if options is not None else None,
        retention=body.prompt_cache_retention,
        tools=tools and body.n == 1,
    )


async def _collaboration_turn_done(
    state: _State,
    bridge: EngineBridge,
    tenant: str,
    session: SessionPlan | None,
    messages: Sequence[Mapping[str, Any]],
    answer: str,
) -> None:
    """A collaboration answered a session's turn: keep the conversation and the answer, composed
    as the client's next turn will send them back, for that turn to extend.

    The agents' own threads are released when the collaboration ends; what the next
    turn re-sends is the conversation plus this answer. Composing it costs a prefill of
    the answer (the conversation is still cached) and one decoded token; a failure
    here never fails the reply, the session just recomputes.
    """
    if session is None or session.retain is None:
        return
    try:
        kept = await _compose(bridge, [*messages, {"role": "assistant", "content": answer}])
        result = await bridge.generate(
            kept, Sampling(max_tokens=1), retain=session.retain, priority=session.priority
        )
    except Exception:
        with contextlib.suppress(Exception):  # a dead engine took the retention with it
            await bridge.release(session.retain.key)
        return
    ok = result.finish_reason in ("stop", "length")
    await state.sessions.finished(tenant, bridge, session, kept, tool_calls=False, ok=ok)


async def _turn_done(
    state: _State,
    bridge: EngineBridge,
    tenant: str,
    session: SessionPlan,
    result: GenerationResult,
    message: Mapping[str, Any],
) -> None:
    """A turn finished: remember its ids under the text the client will send back, and keep
    (or release) its retention for the session's next turn."""
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    text = history_calls(content, calls, "message") if calls else content
    if result.finish_reason in ("stop", "length"):
        state.sessions.remember_generated(tenant, bridge.model, text, result.output_ids)
    await state.sessions.finished(
        tenant,
        bridge,
        session,
        result.handle,
        tool_calls=bool(calls),
        ok=result.finish_reason in ("stop", "length"),
    )


def _choice(
    bridge: EngineBridge, index: int, result: GenerationResult, plan: ToolPlan | None, top: int
) -> dict[str, Any]:
    """One ``choices[]`` entry: the message (its tool calls parsed out) and its logprobs."""
    content: str | None = result.content
    calls: list[dict[str, Any]] = []
    if plan is not None and result.finish_reason in ("stop", "length"):
        content, calls = plan.parse(result.content, complete=result.finish_reason == "stop")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": choice_logprobs(bridge, result.logprobs, top),
        "finish_reason": "tool_calls" if calls else _finish_reason(result.finish_reason),
    }


async def _generate_n(
    bridge: EngineBridge,
    prompt: KVHandle,
    sampling: Sampling,
    n: int,
    priority: int = 0,
    retain: Retain | None = None,
) -> list[GenerationResult]:
    results: list[GenerationResult | None] = [None] * n
    failures: list[BaseException] = []

    async def one(i: int) -> None:
        try:
            results[i] = await bridge.generate(
                prompt, sampling, priority=priority, retain=retain if i == 0 else None
            )
        except Exception as exc:
            failures.append(exc)
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    if failures:
        raise failures[0]
    return [r for r in results if r is not None]


def _stream_completion(
    state: _State,
    bridge: EngineBridge,
    body: ChatCompletionRequest,
    prompt: KVHandle,
    sampling: Sampling,
    stamp: _Stamp,
    release: Callable[[], None],
    meter: _Meter,
    plan: ToolPlan | None = None,
    session: tuple[str, SessionPlan] | None = None,
) -> Response:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    buffer = EventBuffer(state.limits.max_sse_buffer)
    totals = [0, 0, 0]
    top = body.top_logprobs or 0

    def chunk(index: int, delta: dict[str, Any], **fields: Any) -> StreamItem:
        entry = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return _fixed(stamp.chunk([{**entry, **fields}]))

    def delta_item(index: int, text: str) -> StreamItem:
        return StreamItem(
            build=lambda t: stamp.chunk(
                [{"index": index, "delta": {"content": t}, "logprobs": None, "finish_reason": None}]
            ),
            text=text,
            owner=f"choice-{index}",
            mergeable=True,
        )

    async def one(index: int) -> None:
        buffer.put(chunk(index, {"role": "assistant", "content": ""}))
        calls = ToolCallStream(plan) if plan is not None else None
        turn = session[1] if session is not None else None
        async with bridge.stream(
            prompt,
            sampling,
            priority=0 if turn is None else turn.priority,
            retain=turn.retain if turn is not None and index == 0 else None,
        ) as gen:
            meter.add(len(prompt))  # submitted: the engine computes (or hits) the prompt
            async for delta in gen:
                meter.add(len(delta.token_ids))
                text = bridge.chat.content(delta.text)
                if calls is not None:
                    text = calls.feed(text)
                if sampling.logprobs is not None:  # a chunk per delta: its tokens' logprobs
                    entries = logprobs_content(bridge, delta.logprobs, top)
                    if text or entries:
                        logprobs = {"content": entries, "refusal": None}
                        buffer.put(chunk(index, {"content": text}, logprobs=logprobs))
                elif text:
                    buffer.put(delta_item(index, text))
            result = gen.result
        assert result is not None
        totals[0] += result.prompt_tokens
        totals[1] += result.cached_tokens
        totals[2] += result.completion_tokens
        reason = _finish_reason(result.finish_reason)
        if calls is not None:
            unsent, made = (
                calls.finish(complete=result.finish_reason == "stop")
                if result.finish_reason in ("stop", "length")
                else ("", [])
            )
            if unsent:
                buffer.put(chunk(index, {"content": unsent}))
            if made:
                reason = "tool_calls"
                deltas = [{"index": k, **call} for k, call in enumerate(made)]
                buffer.put(chunk(index, {"tool_calls": deltas}))
        if session is not None and index == 0:
            message = (
                _choice(bridge, 0, result, plan, 0)["message"]
                if plan is not None
                else {"content": result.content}
            )
            await _turn_done(state, bridge, session[0], session[1], result, message)
        buffer.put(chunk(index, {}, finish_reason=reason))

    async def produce(buf: EventBuffer) -> None:
        try:
            async with anyio.create_task_group() as tg:
                for i in range(body.n):
                    tg.start_soon(one, i)
        except Exception as exc:
            error = _engine_error(
                engine_cause(exc) or _first(exc), retry_after([bridge], state.limits.retry_after)
            )
            if isinstance(error, EngineLost):
                count_lost(state.metrics, "completion", "stream")
            buf.put(_fixed(error.body()))
            buf.put(_fixed(DONE))
            return
        finally:
            release()
        state.metrics.add_usage(*totals)
        if include_usage:
            buf.put(_fixed(stamp.chunk([], usage=_usage(*totals))))
        buf.put(_fixed(DONE))

    return SSEResponse(produce, buffer, on_close=release, track=state.drain.track)


def _first(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


# -- collaborations -----------------------------------------------------------------------------


async def _collaboration(state: _State, body: ChatCompletionRequest, request: Request) -> Response:
    deadline = anyio.current_time() + state.limits.retry_deadline
    check_parameters(body, collaboration=True)
    if body.n != 1:
        raise bad_request("n must be 1 for a collaboration", "n")
    bridge = _engine(state, body.model)
    check_sampling(body, state.limits.max_n)
    limits = state.limits
    specs: list[AgentSpec] = []
    total = 0
    bridges = [bridge]
    for i, raw in enumerate(body.agents or ()):
        where = f"agents[{i}]"
        try:  # the agent's own rules (types, bounds) are AgentSpec's: one definition
            spec = AgentSpec.from_dict(raw)
        except InvalidCollaboration as exc:
            field = exc.field.replace("agents", where, 1)
            raise bad_request(f"{field}: {exc.reason}", field) from None
        if spec.count > limits.max_agents_per_spec:  # this server's own, tighter cap
            raise bad_request(
                f"{where}.count must be in 1..{limits.max_agents_per_spec}, got {spec.count}",
                f"{where}.count",
            )
        total += spec.count
        if total > limits.max_total_agents:
            raise bad_request(
                f"too many agents: at most {limits.max_total_agents} in total",
                "agents",
                "too_many_agents",
            )
        target = bridge if spec.model is None else _engine(state, spec.model, f"{where}.model")
        bridges.append(target)
        if spec.adapter is not None and spec.adapter not in target.adapters:
            raise bad_request(
                f"{where}.adapter: unknown adapter {spec.adapter!r} for model {target.model!r}; "
                f"registered: {sorted(target.adapters)}",
                f"{where}.adapter",
                "adapter_not_found",
            )
        specs.append(spec if spec.model is None else attrs.evolve(spec, model=target.model))
    mode = body.collaboration.mode if body.collaboration is not None else "vote"
    options = body.collaboration_options()
    validator = options.get("validator")
    if (
        isinstance(validator, dict)
        and validator.get("type") == "python_tests"
        and not limits.allow_code_validators
    ):
        raise bad_request(
            "collaboration.validator.type: python_tests runs client code on the server and is "
            "disabled; start the server with --allow-code-validators to accept it",
            "collaboration.validator.type",
        )
    try:
        prepared = prepare_collaboration(mode, specs, options, max_agents=limits.max_total_agents)
    except InvalidCollaboration as exc:
        field = (
            exc.field
            if exc.field.startswith(("collaboration", "agents"))
            else f"collaboration.{exc.field}"
        )
        raise bad_request(f"{field}: {exc.reason}", field) from None
    tools = _server_tools(state, body)
    names = sorted(t.name for t in tools)
    unknown = unknown_agent_tool(specs, names)
    if unknown is not None:  # refused before anything streams
        i, _, name = unknown
        raise bad_request(
            f"agents[{i}].tools: {name!r} is not among the collaboration's tools ({names})",
            f"agents[{i}].tools",
        )
    tenant = _tenant(request)
    messages = _messages(body)
    # re-sent answers as their generated ids (with tools, collaborate composes the context)
    conversation = messages if tools else state.sessions.splice(tenant, bridge, messages)
    release = _reserve(state, collaboration=True)
    handed = False
    try:
        _check_engine_queue(state, bridges)
        # with tools, collaborate composes the context itself (their description first);
        # the same composition here only measures it for the length check
        measured = (
            with_tool_instructions(messages, agent_tool_plan({t.name: t for t in tools}))
            if tools
            else conversation
        )
        composed = await _compose(bridge, measured)
        context: KVHandle | list[dict[str, str]] = messages if tools else composed
        # a session's turn keeps the conversation and its answer for the next turn (not with
        # tools: their description leads the agents' context, not the conversation's)
        session = (
            None if tools else _session_plan(state, tenant, bridge, composed, body, tools=False)
        )
        per_agent = [s.max_tokens for s in specs if s.max_tokens is not None]
        budget = max([int(options.get("max_tokens", 256)), *per_agent])
        _check_length(bridge, len(composed) + 16, budget)
        worst = worst_case_tokens(prepared, tool_steps=DEFAULT_MAX_TOOL_STEPS if tools else 0)
        if worst is not None:
            _check_budget(state, worst, "max_tokens", prepared)
        agents_total = sum(s.count for s in prepared.agents)
        promised = len(composed) * agents_total + (
            worst if worst is not None else largest_turn(prepared) * agents_total
        )
        admission = _admit(state, request, promised)
        meter = _Meter() if body.stream else None
        release = _settling(release, admission, meter)
        stamp = _Stamp.new(bridge.model)
        engines = {name: b for name, b in state.engines.items()}
        for b in state.engines.values():
            engines.setdefault(b.model, b)
        if meter is not None:  # a stream
            handed = True
            return _stream_collaboration(
                state,
                bridge,
                engines,
                body,
                prepared,
                context,
                stamp,
                release,
                meter,
                tools,
                (tenant, session, conversation),
            )
        watch = ToolWatch()  # a collaboration that ran a tool is never run again
        mode = prepared.op.name

        def lost() -> None:
            state.metrics.inc("microagent_collaborations_total", mode=mode, status="failed")

        try:
            outcome = await _until_disconnect(
                request,
                lambda: run_retrying(
                    lambda: _run_collaboration(
                        state, bridge, engines, prepared, context, watch, tools, _tool_choice(body)
                    ),
                    kind="collaboration",
                    metrics=state.metrics,
                    deadline=deadline,
                    may_retry=lambda: not watch.ran_tool,
                    on_lost=lost,
                ),
            )
        except _ClientGone:  # counted as cancelled by _run_collaboration
            return Response(status_code=499)
        if admission is not None:  # what it used, not its worst case
            admission.settle(outcome.usage.prompt_tokens + outcome.usage.completion_tokens)
        await _collaboration_turn_done(state, bridge, tenant, session, conversation, outcome.answer)
    finally:
        if not handed:
            release()
    return JSONResponse(collaboration_response(outcome, stamp.model, stamp.id, stamp.created))


def _server_tools(state: _State, body: ChatCompletionRequest) -> list[Tool]:
    """The server tools ``collaboration.tools`` names (a 400 for any this server lacks)."""
    names = body.collaboration.tools if body.collaboration is not None else None
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    for i, name in enumerate(names or ()):
        group = state.tools.get(name)
        if group is None:
            raise bad_request(
                f"collaboration.tools[{i}]: no server tool named {name!r} "
                f"(this server has: {sorted(state.tools)})",
                f"collaboration.tools[{i}]",
                "tool_not_found",
            )
        for tool in group:
            if tool.name in seen and seen[tool.name] != name:
                raise bad_request(
                    f"collaboration.tools[{i}]: {name!r} and {seen[tool.name]!r} both have a "
                    f"tool named {tool.name!r}",
                    f"collaboration.tools[{i}]",
                )
            if tool.name not in seen:
                seen[tool.name] = name
                tools.append(tool)
    if not tools and body.collaboration is not None and body.collaboration.tool_choice:
        raise bad_request(
            "collaboration.tool_choice needs collaboration.tools", "collaboration.tool_choice"
        )
    return tools


def _tool_choice(body: ChatCompletionRequest) -> Literal["auto", "required"]:
    collab = body.collaboration
    return "auto" if collab is None or collab.tool_choice is None else collab.tool_choice


def collaboration_response(
    outcome: Outcome, model: str, id: str | None = None, created: int | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` object of a finished collaboration (``Outcome``)."""
    return {
        "id": id or f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.answer},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _collab_usage(outcome),
        "collaboration": outcome.to_dict(),
    }


def _collab_usage(outcome: Outcome) -> dict[str, Any]:
    u = outcome.usage
    usage = _usage(
        u.prompt_tokens,
        u.cached_tokens,
        u.completion_tokens,
        saved_completion_tokens=u.saved_completion_tokens,
    )
    # each model's own tokenizer's counts: a remote's are what its endpoint reported
    usage["by_model"] = {name: m.to_dict() for name, m in outcome.usage_by_model.items()}
    return usage


async def _run_collaboration(
    state: _State,
    bridge: EngineBridge,
    engines: Mapping[str, EngineBridge],
    prepared: PreparedCollaboration,
    context: KVHandle | list[dict[str, str]],
    on_event: EventCallback | None,
    tools: Sequence[Tool] = (),
    tool_choice: Literal["auto", "required"] = "auto",
) -> Outcome:
    """Run one validated collaboration and count it; errors come out as ``ApiError``.

    An engine death comes out as ``EngineLost``, not counted yet: the caller may
    run the collaboration again, and counts how it finally ended.
    """
    metrics = state.metrics
    mode = prepared.op.name
    involved = list({id(b): b for b in (bridge, *engines.values())}.values())
    deaths = death_counts(involved)
    try:
        outcome = await collaborate(
            bridge,
            prepared,
            context,
            engines=engines,
            on_event=on_event,
            tools=tools,
            tool_choice=tool_choice,
            token_budget=state.limits.max_collaboration_tokens,
        )
    except InvalidCollaboration as exc:
        metrics.inc("microagent_collaborations_total", mode=mode, status="invalid")
        raise bad_request(f"{exc.field}: {exc.reason}", exc.field) from None
    except TokenBudgetExceeded as exc:  # a mode with no bound, stopped before crossing it
        metrics.inc("microagent_collaborations_total", mode=mode, status="invalid")
        raise bad_request(exc.reason, "max_tokens", "token_budget_exceeded") from None
    except CollaborationFailed as exc:
        remote = remote_failure(exc)
        if remote is not None:
            metrics.inc("microagent_collaborations_total", mode=mode, status="failed")
            raise remote from None
        lost = _engine_loss(exc, involved, deaths, state.limits.retry_after)
        if lost is not None:
            raise lost from None
        metrics.inc("microagent_collaborations_total", mode=mode, status="failed")
        raise ApiError(
            500, f"collaboration failed: {exc.reason}", code="collaboration_failed"
        ) from None
    except anyio.get_cancelled_exc_class():
        metrics.inc("microagent_collaborations_total", mode=mode, status="cancelled")
        raise
    except Exception as exc:
        lost = _engine_loss(exc, involved, deaths, state.limits.retry_after)
        if lost is not None:
            raise lost from None
        metrics.inc("microagent_collaborations_total", mode=mode, status="error")
        raise _engine_error(exc) from None
    metrics.inc("microagent_collaborations_total", mode=mode, status="ok")
    if outcome.early_stopped:
        metrics.inc("microagent_early_stops_total", mode=mode)
    pruned = sum(1 for a in outcome.agents if a.finish_reason == "pruned")
    if pruned:
        metrics.inc("microagent_pruned_agents_total", pruned, mode=mode)
    u = outcome.usage
    metrics.add_usage(
        u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.saved_completion_tokens
    )
    return outcome


def _engine_loss(
    exc: BaseException,
    bridges: Sequence[EngineBridge],
    deaths: Mapping[int, tuple[int, int]],
    default_retry: int,
) -> EngineLost | None:
    """``EngineLost`` when an engine failure caused ``exc``, or an engine died meanwhile.

    A mode may fail with "no voter produced an answer" without naming why.
    """
    cause = engine_cause(exc)
    if cause is None:
        dead = died_since(bridges, deaths)
        if dead is None:
            return None
        cause = EngineDied(str(exc), dead[1])
    return EngineLost(cause, retry_after(bridges, default_retry))


def _stream_collaboration(
    state: _State,
    bridge: EngineBridge,
    engines: Mapping[str, EngineBridge],
    body: ChatCompletionRequest,
    prepared: PreparedCollaboration,
    context: KVHandle | list[dict[str, str]],
    stamp: _Stamp,
    release: Callable[[], None],
    meter: _Meter,
    tools: Sequence[Tool] = (),
    session: tuple[str, SessionPlan | None, Sequence[Mapping[str, Any]]] | None = None,
) -> Response:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    buffer = EventBuffer(state.limits.max_sse_buffer)
    answer_sent = [False]

    def empty(event: dict[str, Any]) -> dict[str, Any]:
        return stamp.chunk(
            [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}],
            collaboration_event=event,
        )

    def on_event(event: CollaborationEvent) -> None:
        data = event.to_dict()
        if event.type == "agent_finished":  # each engine request's usage, as it ends
            used = [data.get("prompt_tokens"), data.get("completion_tokens")]
            meter.add(sum(n for n in used if isinstance(n, int)))
        if event.type == "delta":
            agent = event.agent or ""
            text = str(data.pop("text", ""))

            def build(t: str, data: dict[str, Any] = data) -> dict[str, Any]:
                return empty({**data, "text": t})

            buffer.put(
                StreamItem(
                    build=build, text=text, owner=f"agent:{agent}", mergeable=True, droppable=True
                )
            )
            return
        if event.type == "final" and isinstance(data.get("answer"), str) and not answer_sent[0]:
            answer_sent[0] = True
            content = data["answer"]
            buffer.put(
                _fixed(
                    stamp.chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"content": content},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                        collaboration_event=data,
                    )
                )
            )
            return
        buffer.put(StreamItem(build=lambda _t: empty(data), owner=f"agent:{event.agent or ''}"))

    async def produce(buf: EventBuffer) -> None:
        try:
            outcome = await _run_collaboration(
                state, bridge, engines, prepared, context, on_event, tools, _tool_choice(body)
            )
        except ApiError as exc:
            if isinstance(exc, EngineLost):  # data went out already: the stream says so, ends
                mode = prepared.op.name
                state.metrics.inc("microagent_collaborations_total", mode=mode, status="failed")
                count_lost(state.metrics, "collaboration", "stream")
            buf.put(_fixed(exc.body()))
            buf.put(_fixed(DONE))
            return
        finally:
            release()
        if session is not None:
            tenant, plan, messages = session
            await _collaboration_turn_done(state, bridge, tenant, plan, messages, outcome.answer)
        if not answer_sent[0]:
            buf.put(
                _fixed(
                    stamp.chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"content": outcome.answer},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
            )
        collaboration = outcome.to_dict()

        def final(_t: str) -> dict[str, Any]:
            state.metrics.inc("microagent_sse_dropped_events_total", buf.dropped)
            return stamp.chunk(
                [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                collaboration=collaboration,
                dropped_events=buf.dropped,
                merged_deltas=buf.merged,
            )

        buf.put(StreamItem(build=final))
        if include_usage:
            buf.put(_fixed(stamp.chunk([], usage=_collab_usage(outcome))))
        buf.put(_fixed(DONE))

    buffer.put(
        _fixed(
            stamp.chunk(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        )
    )
    return SSEResponse(produce, buffer, on_close=release, track=state.drain.track)
