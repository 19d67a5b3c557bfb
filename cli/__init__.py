"""The ``microagent`` command line: ``serve``, ``run``, ``prepare`` and ``eval``.

The top layer: it may import every other layer, and only ``python -m
microagent`` (``microagent/__main__.py``) and the ``microagent`` console script
import it. ``main(argv)`` runs a command and returns its exit status;
``build_parser()`` is its argument parser (the tests read its options and
``--help``). What the server builds from ``serve``'s options (``served_app``,
``serve_options``) is ``microagent.server``'s, which ``microagent.cluster`` shares.
"""

from .._public import publish as _publish
from ._commands import main as main
from ._parser import build_parser as build_parser

__all__ = ["build_parser", "main"]

_publish(globals(), __name__)
