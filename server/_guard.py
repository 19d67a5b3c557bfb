"""The ASGI guard in front of every route: API key and body size.

It runs before FastAPI parses anything, so a wrong key or an oversized body
costs the server almost nothing and never touches requests already running.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import ApiError
from ._quota import key_id

_OPEN_PATHS = frozenset({"/health"})
#: The browser view's static files hold no data: a browser must load them before it can
#: send a key (``GET`` only). Everything the page then asks the API carries the key.
_OPEN_PAGES = "/ui"


class Guard:
    """Checks ``Authorization: Bearer <key>`` (constant time) and caps request bodies.

    With several keys, every one is compared (no early exit), so timing tells nothing
    about which keys exist; the matching key's digest (``key_id``, never the key) is
    put in ``scope["state"]["api_key_id"]`` for its quota account.

    A body is read whole (up to ``max_body_bytes``) before the app sees it, then
    replayed; the client's later messages (its disconnect) pass through.
    """

    def __init__(self, app: ASGIApp, *, api_keys: Sequence[str], max_body_bytes: int) -> None:
        if any(not k for k in api_keys):
            raise ValueError("an API key must not be empty")
        self.app = app
        self.api_keys = [(k.encode(), key_id(k)) for k in api_keys]
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_keys and not _is_open(scope) and not self._authorize(scope):
            await _send_error(
                ApiError(
                    401,
                    "invalid or missing API key (send `Authorization: Bearer <key>`)",
                    code="invalid_api_key",
                    headers={"www-authenticate": "Bearer"},
                ),
                scope,
                receive,
                send,
            )
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

    def _authorize(self, scope: Scope) -> bool:
        value = _header(scope, b"authorization") or ""
        scheme, _, token = value.partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        found: str | None = None
        for key, name in self.api_keys:  # all of them, whatever matched
            if hmac.compare_digest(given, key) and found is None:
                found = name
        if found is None:
            return False
        scope.setdefault("state", {})["api_key_id"] = found
        return True


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
