"""``python -m microagent.cli``: the ``microagent`` command line."""

from ._commands import main

if __name__ == "__main__":
    raise SystemExit(main())
