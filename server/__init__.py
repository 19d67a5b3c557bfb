"""The OpenAI-compatible HTTP server and the ``microagent`` command line.

``create_app(engines)`` builds the FastAPI app over already-built engine
bridges; ``microagent serve`` builds vLLM bridges and runs it on uvloop.
"""

from .._public import publish as _publish
from ._app import ServerLimits as ServerLimits
from ._app import collaboration_response as collaboration_response
from ._app import create_app as create_app
from ._cli import LiveView as LiveView
from ._cli import summary_table as summary_table
from ._errors import ApiError as ApiError
from ._metrics import ServerMetrics as ServerMetrics
from ._schemas import ChatCompletionRequest as ChatCompletionRequest
from ._schemas import CollaborationModel as CollaborationModel
from ._sse import EventBuffer as EventBuffer

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "CollaborationModel",
    "EventBuffer",
    "LiveView",
    "ServerLimits",
    "ServerMetrics",
    "collaboration_response",
    "create_app",
    "summary_table",
]

_publish(globals(), __name__)
