"""Collaboration traces: record the events, export trace-event JSON, draw the timeline."""

from ..._public import publish as _publish
from ._recorder import GLOBAL_EVENTS as GLOBAL_EVENTS
from ._recorder import PHASES as PHASES
from ._recorder import TraceRecorder as TraceRecorder
from ._recorder import write_trace as write_trace
from ._timeline import plot_timeline as plot_timeline

__all__ = ["GLOBAL_EVENTS", "PHASES", "TraceRecorder", "plot_timeline", "write_trace"]

_publish(globals(), __name__)
