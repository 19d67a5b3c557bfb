"""A progress line on stderr: done/total, percent, elapsed time and an estimate of the rest.

On a terminal it rewrites one line; elsewhere (a log, CI) it prints a line at
every tenth of the way, so a log stays short. No dependency: evaluation runs
wherever the library does.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import attrs


@attrs.define
class Progress:
    """Counts finished requests and shows how far a run is.

    Attributes:
        total: requests in the run.
        label: what is counted.
        stream: where it writes (stderr by default); None shows nothing.
    """

    total: int
    label: str = "requests"
    stream: TextIO | None = attrs.field(factory=lambda: sys.stderr)
    done: int = 0
    _start: float = attrs.field(factory=time.monotonic, init=False)
    _shown_tenth: int = attrs.field(default=-1, init=False)

    def advance(self, n: int = 1) -> None:
        """``n`` more finished; redraw."""
        self.done += n
        self._show()

    def _line(self) -> str:
        elapsed = time.monotonic() - self._start
        pct = 100.0 * self.done / self.total if self.total else 100.0
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        return (
            f"[{bar}] {self.done}/{self.total} {self.label} {pct:5.1f}% "
            f"{elapsed:6.0f} s elapsed, ~{left:.0f} s left"
        )

    def _show(self) -> None:
        if self.stream is None:
            return
        if self.stream.isatty():
            end = "\n" if self.done >= self.total else ""
            self.stream.write("\r" + self._line() + end)
            self.stream.flush()
            return
        tenth = 10 * self.done // self.total if self.total else 10
        if tenth != self._shown_tenth:
            self._shown_tenth = tenth
            self.stream.write(self._line() + "\n")
            self.stream.flush()

    def start(self) -> None:
        """Show the starting line (resumed requests already counted)."""
        self._show()
