"""The ingress: keys, quotas and routing in front of the engine replicas.

Serve's HTTP proxy sees no body, so routing by session or prefix happens here,
one tier in: the ingress checks the API key (``server.Guard``), counts the key's
quota, reads the request's ``RouteHint`` and calls an engine replica through a
handle whose router (``AffinityRouter``) picks the replica. A replica that dies
before its answer is whole is replaced: a request that has sent nothing yet runs
again on another replica until ``retry_deadline`` (unless a server-side tool may
have run), and a stream that was under way ends with the error event.

Quotas: a request is admitted on its key's account and charged what the replica
reports it used: with the answer's last part (``Usage``), or, when the client
leaves first, by asking the replica that ran it (``EngineReplica.usage_of``, under
the request's ticket) once the request has wound down there.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import attrs
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.responses import Response, StreamingResponse

from ..server import (
    Admission,
    ApiError,
    Guard,
    KeyQuota,
    Quotas,
    ServerLimits,
    key_id,
    serve_keys,
    serve_options,
    sse_error_ending,
)
from ._asgi import Forwarded, ResponseStart
from ._replica import REPLICA_HEADER, Accepted, Usage
from ._route import RouteHint, route_of
from ._router import preferred_for
from ._settings import ClusterSettings

__all__ = ["IngressApp", "may_run_tools"]

#: A request header that pins a request to one replica (``/metrics`` of each replica).
PIN_HEADER = b"x-microagent-replica"
ROUTE_HEADER = "x-microagent-route"
REPLICA_LOST = (RayActorError, ActorUnavailableError)
Scope = MutableMapping[str, Any]


def may_run_tools(body: bytes) -> bool:
    """Whether the request may run a server-side tool (a collaboration's ``tools``): such
    a request is never run twice, since its tool may have acted already."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(parsed, dict):
        return False
    collaboration = parsed.get("collaboration")
    if isinstance(collaboration, dict) and collaboration.get("tools"):
        return True
    agents = parsed.get("agents")
    return isinstance(agents, list) and any(isinstance(a, dict) and a.get("tools") for a in agents)


def _lost(replica_error: BaseException) -> ApiError:
    return ApiError(
        503,
        f"the engine replica serving this request was lost ({type(replica_error).__name__}); "
        "retry the request",
        code="replica_lost",
        type="server_error",
        headers={"retry-after": "1"},
    )


@attrs.define
class _Call:
    """One request's call to the replicas: its ticket, and the replica running it."""

    ticket: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    replica: str | None = None


class IngressApp:
    """The ingress's ASGI app (wrapped in ``Guard`` by ``build``): forwards every request
    to an engine replica through ``replicas`` (a Serve deployment handle)."""

    def __init__(self, settings: ClusterSettings, replicas: DeploymentHandle[Any]) -> None:
        self.settings = settings
        self.replicas = replicas
        options = serve_options(settings.serve_args)
        quota = KeyQuota(
            max_concurrent=options.key_max_concurrent,
            tokens_per_minute=options.key_tokens_per_minute,
        )
        self.quotas = Quotas(quota) if quota.limited else None
        # the keys ``microagent serve`` reads (options, key files, the environment)
        self.api_keys, self.admin_keys = serve_keys(options)
        #: the background collections of what left requests used (kept until they end)
        self._settling: set[asyncio.Task[None]] = set()

    @classmethod
    def build(cls, settings: ClusterSettings, replicas: DeploymentHandle[Any]) -> Guard:
        """The app with the key check and body cap in front, as Serve's ingress runs it."""
        app = cls(settings, replicas)
        limit = ServerLimits().max_body_bytes  # the replicas' own (``microagent serve``'s)
        return Guard(app, api_keys=app.api_keys, admin_keys=app.admin_keys, max_body_bytes=limit)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            response = await self._forward(scope, receive)
        except ApiError as exc:
            response = exc.response()
        await response(scope, receive, send)

    async def _forward(self, scope: Scope, receive: Any) -> Response:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return Response(status_code=499)
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = tuple((bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", ()))
        tenant = scope.get("state", {}).get("api_key_id") or key_id(None)
        pinned = next((v.decode() for k, v in headers if k == PIN_HEADER), None)
        request = Forwarded(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            tuple((k, v) for k, v in headers if k != PIN_HEADER),
            body,
            tuple(scope["client"]) if scope.get("client") else None,
        )
        admission = self.quotas.admit(tenant, 0) if self.quotas is not None else None
        route = route_of(scope["path"], body, tenant, pinned)
        call = _Call()
        try:
            start, parts, used, chunks = await self._answer(request, route, call)
        except ApiError:
            if admission is not None:
                admission.settle(0)  # its replica was lost: what it used is unknown
            raise
        except BaseException:  # the client left: what the replica used, once it knows
            if admission is not None:
                self._settle_left(admission, call)
            raise
        if chunks is not None:
            if admission is not None:
                admission.settle(used)
            return Response(
                b"".join(chunks), status_code=start.status, headers=_headers(start, route)
            )

        async def relay() -> AsyncIterator[bytes]:
            got: int | None = None
            try:
                async for part in parts:
                    if isinstance(part, Usage):
                        got = part.tokens
                    elif isinstance(part, bytes):
                        yield part
            except REPLICA_LOST as exc:  # data went out already: the stream says so, ends
                got = 0  # what the lost replica used is unknown
                yield sse_error_ending(_lost(exc))
            finally:
                parts.cancel()  # a client that left stops the replica's request too
                if admission is not None:
                    if got is not None:
                        admission.settle(got)
                    else:  # the client left mid-stream
                        self._settle_left(admission, call)

        return StreamingResponse(relay(), status_code=start.status, headers=_headers(start, route))

    def _settle_left(self, admission: Admission, call: _Call) -> None:
        """Charge a request whose client left what its replica reports it used, in the
        background (the replica first winds the request down); 0 if it reached none."""
        if call.replica is None:
            admission.settle(0)
            return
        task = asyncio.get_running_loop().create_task(self._collect(admission, call))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _collect(self, admission: Admission, call: _Call) -> None:
        used = 0
        try:
            hint = RouteHint("replica", call.replica or "")
            found = await self.replicas.usage_of.remote(call.ticket, route=hint)
            preferred_for(hint)  # the router's note of where it went is not needed
            used = found if isinstance(found, int) else 0
        except Exception:  # the replica is gone: what it used is unknown
            used = 0
        finally:
            admission.settle(used)

    async def _answer(
        self, request: Forwarded, route: RouteHint, call: _Call
    ) -> tuple[ResponseStart, Any, int, list[bytes] | None]:
        """A replica's answer: its start, the parts still to come, and for a JSON answer
        its tokens and whole body (None for a stream, relayed as it comes).

        A replica lost before a stream started, or before a JSON answer was whole, is
        replaced: the request runs again on another replica until ``retry_deadline``
        (nothing reached the client yet), unless a server-side tool may have run."""
        deadline = time.monotonic() + self.settings.retry_deadline
        again = not may_run_tools(request.body)
        while True:
            parts: Any = self.replicas.options(stream=True).answer.remote(
                request, route=route, ticket=call.ticket
            )
            try:
                start = await parts.__anext__()
                if isinstance(start, Accepted):  # the replica that runs it (its usage)
                    call.replica = start.replica
                    start = await parts.__anext__()
                if not isinstance(start, ResponseStart):
                    raise RuntimeError(f"a replica answered {type(start).__name__} first")
                content_type = dict(start.headers).get(b"content-type", b"")
                if content_type.startswith(b"text/event-stream"):
                    return start, parts, 0, None
                chunks: list[bytes] = []
                used = 0
                async for part in parts:
                    if isinstance(part, Usage):
                        used = part.tokens
                    else:
                        chunks.append(part)
                return start, parts, used, chunks
            except REPLICA_LOST as exc:
                if not again or time.monotonic() >= deadline:
                    raise _lost(exc) from None
            except BaseException:  # the client left (or the ingress stops): so does the replica
                parts.cancel()
                raise


def _headers(start: ResponseStart, route: RouteHint) -> dict[str, str]:
    """The replica's headers (less the framing ones) and ``x-microagent-route``: how the
    router placed the request (``session``/``prefix``/``replica`` on the key's replica,
    ``fallback`` when that one was overloaded, ``any`` without a key)."""
    skip = {b"content-length", b"transfer-encoding"}
    out = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.headers if k not in skip}
    out[ROUTE_HEADER] = route.decision(out.get(REPLICA_HEADER.decode(), ""), preferred_for(route))
    return out
