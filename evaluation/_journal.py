"""The resume journal: every reply appended as one JSON line as soon as it arrives.

An interrupted run (Ctrl-C, a lost engine, a killed process) keeps every reply
already written; a rerun with the same journal reads them back and runs only the
rest. A reply is reused only for the same item (line and content), the same
configuration (its request fields' fingerprint) and the same runner label, so an
edited item or configuration runs again. A torn last line (the process killed
mid-write) is dropped; any other unreadable line is an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, TextIO

import attrs

from ._errors import JournalError
from ._runner import Reply

#: the first line of every journal
HEADER: Final = {"microagent_eval_journal": 1}
#: most bytes of a journal read back
MAX_JOURNAL_BYTES: Final = 512 * 1024 * 1024

#: (runner label, configuration fingerprint, item key)
JournalKey = tuple[str, str, str]


def _reply(data: dict[str, object]) -> Reply:
    fields = attrs.fields_dict(Reply)
    return Reply(**{k: v for k, v in data.items() if k in fields})  # type: ignore[arg-type]


def read_journal(path: Path, *, required: bool = False) -> dict[JournalKey, Reply]:
    """The replies recorded in ``path`` (none when it does not exist and not ``required``).

    Raises:
        JournalError: not a journal, too large, a bad line before the last, or a
            ``required`` one that does not exist.
    """
    if not path.exists():
        if required:
            raise JournalError(f"{path}: no such journal")
        return {}
    if path.stat().st_size > MAX_JOURNAL_BYTES:
        raise JournalError(f"{path}: larger than {MAX_JOURNAL_BYTES} bytes")
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    if not lines[0].strip():
        return {}
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError:
        header = None
    if header != HEADER:
        raise JournalError(f"{path}: not a microagent eval journal (its first line)")
    out: dict[JournalKey, Reply] = {}
    last = max(i for i, line in enumerate(lines) if line.strip())
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = (str(row["runner"]), str(row["config"]), str(row["item"]))
            out[key] = _reply(row["reply"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            if number - 1 == last:  # a torn last line: the process died writing it
                break
            raise JournalError(f"{path}: line {number} is not a journal row: {exc}") from None
    return out


@attrs.define
class Journal:
    """An open journal that appends one line per reply, flushed at once."""

    path: Path
    _file: TextIO | None = attrs.field(default=None, init=False)

    def open(self) -> None:
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        if fresh:
            self._file.write(json.dumps(HEADER) + "\n")
        elif not self._ends_with_newline():
            self._file.write("\n")  # after a torn line: start a fresh one
        self._file.flush()

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(-1, 2)
            return f.read(1) == b"\n"

    def append(self, key: JournalKey, config_name: str, reply: Reply) -> None:
        """Record ``reply`` under ``key`` (one write, then flush)."""
        assert self._file is not None, "open() first"
        runner, config, item = key
        row = {
            "runner": runner,
            "config": config,
            "item": item,
            "name": config_name,
            "reply": attrs.asdict(reply),
        }
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
