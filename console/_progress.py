"""Opening engines with a progress display: preparing the model, starting the engine.

``open_engines(bridges)`` prepares each vLLM bridge's model (the default one is
converted once from its GGUF), then starts every engine, with a spinner and
the elapsed time on a terminal (one line per step otherwise), and reports how
long each phase took, so a caller can time its own work apart from engine start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import TextIO

import anyio
import attrs

from ..engine_bridge import EngineBridge, VLLMBridge, open_bridges, resolve_model
from ._quiet import current_engine_log


class EngineStartFailed(Exception):
    """An engine could not be prepared or started; ``cause`` says why.

    Attributes:
        model: the model whose engine failed.
        phase: ``"prepare"`` (the model) or ``"start"`` (the engine).
        cause: the original error.
    """

    def __init__(self, model: str, phase: str, cause: BaseException) -> None:
        self.model = model
        self.phase = phase
        self.cause = cause
        what = "preparing the model" if phase == "prepare" else "starting the engine"
        super().__init__(f"{what} for {model!r} failed: {type(cause).__name__}: {cause}")


@attrs.define
class EngineStart:
    """How long opening the engines took.

    Attributes:
        prepare_seconds: preparing the models (converting, resolving paths).
        start_seconds: loading tokenizers and starting the engines.
    """

    prepare_seconds: float = 0.0
    start_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        """Both phases together."""
        return self.prepare_seconds + self.start_seconds


class _Display:
    """A spinner with the elapsed time (a terminal) or one plain line per step."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self._progress: object | None = None
        self._task: object | None = None

    def begin(self, text: str) -> None:
        if not self.tty:
            return
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=Console(file=self.out, force_terminal=True),
            transient=True,
        )
        progress.start()
        self._task = progress.add_task(text, total=None)
        self._progress = progress

    def end(self, done: str | None) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()  # type: ignore[attr-defined]
        if done is not None:
            mark = "\x1b[32m✓\x1b[0m " if self.tty else ""
            print(f"{mark}{done}", file=self.out, flush=True)


@contextmanager
def showing(text: str, *, out: TextIO | None = None, tty: bool | None = None) -> Iterator[None]:
    """A spinner with the elapsed time while the block runs (nothing when not a terminal)."""
    out = out if out is not None else sys.stderr
    display = _Display(out, out.isatty() if tty is None else tty)
    display.begin(text)
    try:
        yield
    finally:
        display.end(None)


@asynccontextmanager
async def open_engines(
    bridges: Sequence[EngineBridge],
    *,
    out: TextIO | None = None,
    tty: bool | None = None,
) -> AsyncIterator[EngineStart]:
    """Prepare and start ``bridges`` with a progress display; close them on exit.

    Args:
        bridges: the engines to open (ScriptedEngines open at once, silently).
        out: where the display goes (default stderr).
        tty: draw a live spinner (default: whether ``out`` is a terminal).

    Raises:
        EngineStartFailed: a model could not be prepared or an engine not started.
    """
    out = out if out is not None else sys.stderr
    display = _Display(out, out.isatty() if tty is None else tty)
    timing = EngineStart()
    real = [b for b in bridges if isinstance(b, VLLMBridge)]
    log = current_engine_log()
    if log is not None and not log.verbose:  # vLLM's own weight-loading bar
        for vllm in real:
            vllm.extra_engine_args.setdefault("use_tqdm_on_load", False)
    t0 = time.monotonic()
    for vllm in real:
        if vllm.model_path is not None:
            continue
        display.begin(f"preparing the model {vllm.model_spec}")
        try:
            path = await anyio.to_thread.run_sync(_resolve, vllm.model_spec)
        except Exception as exc:
            display.end(None)
            raise EngineStartFailed(vllm.model, "prepare", exc) from exc
        vllm.model_path = path
        display.end(None)
    timing.prepare_seconds = time.monotonic() - t0
    names = ", ".join(b.model for b in bridges)
    async with AsyncExitStack() as stack:
        t1 = time.monotonic()
        if real:
            display.begin(f"starting the engine ({names})")
        for bridge in bridges:  # one at a time, so a failure names its model
            try:
                await stack.enter_async_context(open_bridges([bridge]))
            except Exception as exc:
                display.end(None)
                raise EngineStartFailed(bridge.model, "start", exc) from exc
        timing.start_seconds = time.monotonic() - t1
        if real:
            display.end(f"engine ready: {names} in {timing.seconds:.1f} s")
        try:
            yield timing
        finally:
            if real and display.tty:
                display.begin("stopping the engine")
            try:
                with anyio.CancelScope(shield=True):
                    await stack.aclose()
            finally:
                display.end(None)


def _resolve(spec: str) -> Path | str:
    return resolve_model(spec, progress=False)
