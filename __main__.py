"""``python -m microagent``: the ``microagent`` command line."""

from .server._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
