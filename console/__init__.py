"""The terminal display of scripts that start an engine: quiet logs, progress, live lanes.

A layer of its own just above ``engine_bridge`` (it imports nothing else of the
package, and no web framework), so a demo or a script gets a quiet terminal
without pulling in the HTTP server:

    quiet_engine_logs()                     # before the first engine starts
    async with open_engines([engine]) as started:
        view = LiveView(sys.stdout)         # an ``on_event`` callback for ``collaborate``
        ...
    print(summary_table(outcome, seconds, engine_seconds=started.seconds))

``quiet_engine_logs`` sends vLLM's, torch's and transformers' output to a log
file (``EngineLog`` explains an engine error in one line); ``open_engines``
prepares and starts engines with a spinner (``EngineStart`` times each phase,
``EngineStartFailed`` says which failed); ``showing`` is the same spinner around
any step; ``LiveView`` draws one lane per agent and ``summary_table`` prints
the outcome after it. ``log_level`` reads ``--verbose`` and ``$MICROAGENT_LOG``.
"""

from .._public import publish as _publish
from ._live import LiveView as LiveView
from ._live import summary_table as summary_table
from ._progress import EngineStart as EngineStart
from ._progress import EngineStartFailed as EngineStartFailed
from ._progress import open_engines as open_engines
from ._progress import showing as showing
from ._quiet import EngineLog as EngineLog
from ._quiet import log_level as log_level
from ._quiet import quiet_engine_logs as quiet_engine_logs

__all__ = [
    "EngineLog",
    "EngineStart",
    "EngineStartFailed",
    "LiveView",
    "log_level",
    "open_engines",
    "quiet_engine_logs",
    "showing",
    "summary_table",
]

_publish(globals(), __name__)
