"""The browser view at ``/ui``: plain HTML, JS and CSS shipped in ``server/ui/``.

The page holds no data and talks only to the public API (``GET /v1/models``,
``POST /v1/chat/completions`` with ``stream: true``): it draws the same SSE
stream any client gets. Its three files are served as they are, from the
package (no CDN, no build step, works offline), with a content security
policy that lets the page reach nothing but this server.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from starlette.responses import Response

from ._errors import ApiError

UI_PATH = "/ui"
"""Where the page is served; the guard lets ``GET`` reach it without a key (it holds no data)."""

_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_HEADERS = {
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
}


def ui_file(name: str) -> bytes:
    """The bytes of one of the page's files (``index.html``, ``app.js``, ``style.css``)."""
    if name not in _FILES:
        raise KeyError(name)
    return resources.files(__package__ or "microagent.server").joinpath("ui", name).read_bytes()


def add_ui(app: FastAPI) -> None:
    """Serve the browser view on ``app`` at ``/ui`` (and its files at ``/ui/<name>``)."""

    def respond(name: str) -> Response:
        if name not in _FILES:
            raise ApiError(404, "no such route")
        return Response(ui_file(name), media_type=_FILES[name], headers=_HEADERS)

    @app.get(UI_PATH, include_in_schema=False)
    async def ui_page() -> Response:
        return respond("index.html")

    @app.get(UI_PATH + "/{name}", include_in_schema=False)
    async def ui_asset(name: str) -> Response:
        return respond(name)
