"""The shared real-engine session for tests: one vLLM engine for the whole test run.

Starting vLLM takes ~25 s on a 2-core CPU, so every real-engine test shares one
``VLLMBridge`` (the embedded default model, LoRA enabled with two tiny random
adapters). The bridge is asyncio-only while tests run on several anyio
backends, so it lives in its own event loop: an asyncio blocking portal
running in a background thread. Tests hand it coroutine functions with
``engine.call(async_fn, *args)`` and get the result back synchronously.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal
from microagent.engine_bridge import KVHandle, VLLMBridge, resolve_model
from microagent.testing import make_random_lora

T = TypeVar("T")

ADAPTER_NAMES = ("lora-a", "lora-b")


@attrs.define
class RealEngine:
    """A running shared engine: ``bridge`` lives on ``portal``'s asyncio loop.

    Attributes:
        bridge: the ``VLLMBridge`` (default model, LoRA on, adapters ``lora-a``/``lora-b``).
        portal: the blocking portal whose event loop owns the bridge.
        start_seconds: how long opening the bridge took (engine start included).
        adapters: registered adapter name -> directory.
    """

    bridge: VLLMBridge
    portal: BlockingPortal
    start_seconds: float
    adapters: dict[str, Path]

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the bridge's loop and return its result."""
        return self.portal.call(fn, *args)

    def assert_idle(self, timeout: float = 5.0) -> None:
        """Fail unless no request is live in the bridge and the scheduler runs none."""
        assert self.call(self.bridge.wait_idle, timeout), self.bridge.stats()


@contextlib.contextmanager
def real_engine_session(workdir: Path, **bridge_kwargs: Any) -> Iterator[RealEngine]:
    """Start the shared engine (model prepared if needed), yield it, close it."""
    model_dir = resolve_model("default", progress=False)
    assert isinstance(model_dir, Path)
    adapters = {
        name: make_random_lora(model_dir, workdir / name, rank=8, seed=i + 1)
        for i, name in enumerate(ADAPTER_NAMES)
    }
    kwargs: dict[str, Any] = {
        "enable_lora": True,
        "adapters": {k: str(v) for k, v in adapters.items()},
        "max_num_seqs": 16,
        "progress": False,
    }
    kwargs.update(bridge_kwargs)
    with start_blocking_portal("asyncio") as portal:
        bridge = VLLMBridge("default", **kwargs)
        t0 = time.monotonic()
        portal.call(bridge.open)
        engine = RealEngine(bridge, portal, time.monotonic() - t0, adapters)
        try:
            yield engine
        finally:
            portal.call(bridge.close)


# -- prompts unique to one test (so cache-hit counts are exact) -------------------------

_WORDS = [
    "river",
    "mountain",
    "lantern",
    "harbor",
    "copper",
    "meadow",
    "orbit",
    "signal",
    "velvet",
    "anchor",
    "canyon",
    "ember",
    "falcon",
    "glacier",
    "horizon",
    "island",
    "jasmine",
    "kernel",
    "lattice",
    "marble",
    "nectar",
    "obsidian",
    "prism",
    "quartz",
    "ripple",
    "saffron",
    "timber",
    "umbra",
    "vertex",
    "willow",
]


def _document(nonce: str, n_words: int) -> str:
    words = [_WORDS[(i * 7 + len(nonce)) % len(_WORDS)] for i in range(n_words)]
    return f"Case {nonce}. " + " ".join(words) + "."


def _context(
    bridge: VLLMBridge, min_tokens: int, accept: Callable[[KVHandle], bool] = lambda _: True
) -> KVHandle:
    """A chat context of at least ``min_tokens`` tokens, unique to this call.

    ``accept`` can ask for more: the document grows a word at a time until it holds.
    """
    nonce = uuid.uuid4().hex
    n = min_tokens // 2
    while True:
        ctx = bridge.chat.context(
            [
                {"role": "system", "content": "You are a careful analyst."},
                {"role": "user", "content": "Read this log:\n" + _document(nonce, n)},
            ]
        )
        if len(ctx) >= min_tokens and accept(ctx):
            return ctx
        n += 1 if len(ctx) >= min_tokens else max(1, (min_tokens - len(ctx)) // 2)


def _fork(bridge: VLLMBridge, base: KVHandle, question: str) -> KVHandle:
    return bridge.chat.generation_prompt(bridge.chat.append(base, "user", question))
