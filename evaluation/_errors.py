"""The evaluation layer's errors: one base, each naming what was wrong and where."""

from __future__ import annotations


class EvalError(Exception):
    """Base of ``microagent eval``'s errors: an input or a run it could not accept."""


class BadItem(EvalError):
    """A line of the items file is not a valid item.

    Attributes:
        line: the 1-based line number in the file (0: the file as a whole).
        field: the offending field (``""`` when the line itself is wrong).
        reason: what is wrong with it.
    """

    def __init__(self, line: int, field: str, reason: str) -> None:
        self.line = line
        self.field = field
        self.reason = reason
        where = f"line {line}" if line else "the items file"
        what = f" field {field!r}" if field else ""
        super().__init__(f"{where}{what}: {reason}")


class BadConfig(EvalError):
    """A configuration (file or built-in name) cannot be used.

    Attributes:
        source: the file or name it came from.
        reason: what is wrong with it.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"configuration {source}: {reason}")


class JournalError(EvalError):
    """The resume journal cannot be read back (not ours, or too large)."""


class MissingReply(EvalError):
    """A replay found no recorded reply for one item under one configuration.

    Attributes:
        line: the item's line in the items file.
        config: the configuration's name.
        runner: the runner label the replay read replies under.
    """

    def __init__(self, line: int, config: str, runner: str) -> None:
        self.line = line
        self.config = config
        self.runner = runner
        super().__init__(
            f"the journal has no reply for item line {line} under configuration {config!r} "
            f"(runner {runner}); a replay runs nothing: run without replay to fill it in"
        )
