"""Embedding microagent in an existing async app that serves other routes too.

One engine and one actor Runtime live for the app's lifetime (FastAPI
lifespan); a normal route runs a vote through them. The other routes keep
working while collaborations run: nothing blocks the event loop.

    python demos/embed_fastapi.py          # then: curl 'localhost:8001/ask?q=Is+17+prime%3F'
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from microagent import EngineBridge, Runtime, VLLMBridge, vote


def create_app(engine: EngineBridge | None = None) -> FastAPI:
    """The app; pass an engine to share one (tests), or it starts its own VLLMBridge."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            bridge = (
                engine
                if engine is not None
                else await stack.enter_async_context(VLLMBridge("default"))
            )
            app.state.runtime = await stack.enter_async_context(Runtime(engine=bridge))
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, Any]:  # an ordinary route of the app
        return {"id": item_id, "name": f"item {item_id}"}

    @app.get("/ask")
    async def ask(q: str, voters: int = 3) -> dict[str, Any]:
        outcome = await vote(
            app.state.runtime, q, voters=voters, choices=["yes", "no"], style="direct", max_tokens=4
        )
        return {
            "answer": outcome.answer,
            "votes": outcome.votes,
            "early_stopped": outcome.early_stopped,
        }

    return app


if __name__ == "__main__":
    import sys

    import uvicorn
    from microagent.console import quiet_engine_logs

    quiet_engine_logs("--verbose" in sys.argv)  # vLLM's and torch's logs go to a file
    uvicorn.run(create_app(), host="127.0.0.1", port=8001, loop="uvloop")
