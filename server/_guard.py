"""The ASGI guard in front of every route: API key, admin key and body size.

It runs before FastAPI parses anything, so a wrong key or an oversized body
costs the server almost nothing and never touches requests already running.
``/metrics`` (every key's series) is the operator's: once any key is set, only an
admin key reads it, and an API key gets 403 there.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import ApiError
from ._quota import key_id

_OPEN_PATHS = frozenset({"/health"})
#: What only an admin key reads once the server has keys (every tenant's series).
_ADMIN_PATHS = frozenset({"/metrics"})
#: The browser view's static files hold no data: a browser must load them before it can
#: send a key (``GET`` only). Everything the page then asks the API carries the key.
_OPEN_PAGES = "/ui"


class Guard:
    """Checks ``Authorization: Bearer <key>`` (constant time) and caps request bodies.

    With several keys, every one is compared (no early exit), so timing tells nothing
    about which keys exist; the matching key's digest (``key_id``, never the key) is
    put in ``scope["state"]["api_key_id"]`` for its quota account. An admin key reads
    ``_ADMIN_PATHS`` (``/metrics``) and nothing else; an API key gets 403 there. With no
    key of either kind, every route is open.

    A body is read whole (up to ``max_body_bytes``) before the app sees it, then
    replayed; the client's later messages (its disconnect) pass through.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Sequence[str],
        max_body_bytes: int,
        admin_keys: Sequence[str] = (),
    ) -> None:
        if any(not k for k in [*api_keys, *admin_keys]):
            raise ValueError("an API key must not be empty")
        if set(api_keys) & set(admin_keys):
            raise ValueError("a key is both an API key and an admin key")
        self.app = app
        self.api_keys = [(k.encode(), key_id(k)) for k in api_keys]
        self.admin_keys = [(k.encode(), "admin") for k in admin_keys]
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _send_error(refusal, scope, receive, send)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_big = ApiError(
            413,
            f"request body exceeds the limit of {self.max_body_bytes} bytes",
            code="request_too_large",
            type="invalid_request_error",
        )
        length = _header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await _send_error(too_big, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await _send_error(too_big, scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _refusal(self, scope: Scope) -> ApiError | None:
        """The 401 (no known key) or 403 (a key of the other role) ``scope`` gets, if any."""
        if not self.api_keys and not self.admin_keys:
            return None
        admin_path = scope["path"] in _ADMIN_PATHS
        if not admin_path and (_is_open(scope) or not self.api_keys):
            return None
        given = _bearer(scope)
        tenant = _match(given, self.api_keys)
        admin = _match(given, self.admin_keys)
        if admin_path and admin is not None:
            return None
        if not admin_path and tenant is not None:
            scope.setdefault("state", {})["api_key_id"] = tenant
            return None
        if tenant is None and admin is None:
            return ApiError(
                401,
                "invalid or missing API key (send `Authorization: Bearer <key>`)",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        what = "an admin key" if admin_path else "an API key (an admin key reads /metrics only)"
        return ApiError(
            403,
            f"this key may not use {scope['path']}: it needs {what}",
            code="forbidden",
            type="permission_error",
        )


def _bearer(scope: Scope) -> bytes:
    value = _header(scope, b"authorization") or ""
    scheme, _, token = value.partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else b""


def _match(given: bytes, keys: Sequence[tuple[bytes, str]]) -> str | None:
    """The name of the key ``given`` is, comparing every key (constant time, no early exit)."""
    found: str | None = None
    for key, name in keys:  # all of them, whatever matched
        if hmac.compare_digest(given, key) and found is None:
            found = name
    return found


def _is_open(scope: Scope) -> bool:
    path: str = scope["path"]
    if path in _OPEN_PATHS:
        return True
    page = path == _OPEN_PAGES or path.startswith(_OPEN_PAGES + "/")
    return page and scope["method"] in ("GET", "HEAD")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _send_error(error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    await error.response()(scope, receive, send)
