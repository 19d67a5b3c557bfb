"""What the bench scripts share: the machine record and their generated BENCHMARKS.md sections."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def replace_section(path: Path, begin: str, end: str, heading: str, body: str) -> None:
    """Put ``body`` between ``begin`` and ``end`` in ``path`` (a new ``heading`` if absent)."""
    text = path.read_text()
    section = f"{begin}\n{body}{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + section + "\n"
    path.write_text(text)


def machine_sentence(m: dict[str, Any]) -> str:
    """``machine``'s record as report prose: CPUs, load at start (forced or not), duration."""
    forced = " (forced: NOT a quiet machine)" if m.get("forced") else ""
    return (
        f"{m.get('cpus')} CPUs, load average {m.get('loadavg_at_start', 0):.2f} at start"
        f"{forced}, {m.get('seconds', 0)} s in all"
    )


def machine(load: float, forced: bool, started: float) -> dict[str, Any]:
    """The run's machine record: CPUs, the load it started at, whether it was forced, duration.

    ``started`` is ``time.time()`` when the run began.
    """
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": load,
        "forced": forced,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "seconds": round(time.time() - started),
    }
