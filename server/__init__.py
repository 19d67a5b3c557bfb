"""The OpenAI-compatible HTTP server.

``create_app(engines)`` builds the FastAPI app over already-built engine
bridges (with the browser view at ``/ui``). ``served_app`` builds what
``microagent serve``'s options (``serve_options``) describe without starting
it: the ``microagent serve`` command (``microagent.cli``) runs it on uvloop, and
``microagent.cluster`` runs one per Ray Serve replica. The terminal display
(``quiet_engine_logs``, ``open_engines``, ``LiveView``) lives in
``microagent.console``.
"""

from .._public import publish as _publish
from ._admit import USAGE_REPORT as USAGE_REPORT
from ._app import create_app as create_app
from ._errors import ApiError as ApiError
from ._guard import Guard as Guard
from ._metrics import ServerMetrics as ServerMetrics
from ._quota import Admission as Admission
from ._quota import KeyQuota as KeyQuota
from ._quota import Quotas as Quotas
from ._quota import key_id as key_id
from ._render import collaboration_response as collaboration_response
from ._response_store import StoreSettings as StoreSettings
from ._schemas import ChatCompletionRequest as ChatCompletionRequest
from ._schemas import CollaborationModel as CollaborationModel
from ._serve_options import serve_keys as serve_keys
from ._serve_options import serve_options as serve_options
from ._served import CliError as CliError
from ._served import ServedApp as ServedApp
from ._served import served_app as served_app
from ._sessions import SessionSettings as SessionSettings
from ._sse import EventBuffer as EventBuffer
from ._sse import sse_error_ending as sse_error_ending
from ._state import ServerLimits as ServerLimits

__all__ = [
    "USAGE_REPORT",
    "Admission",
    "ApiError",
    "ChatCompletionRequest",
    "CliError",
    "CollaborationModel",
    "EventBuffer",
    "Guard",
    "KeyQuota",
    "Quotas",
    "ServedApp",
    "ServerLimits",
    "ServerMetrics",
    "SessionSettings",
    "StoreSettings",
    "collaboration_response",
    "create_app",
    "key_id",
    "serve_keys",
    "serve_options",
    "served_app",
    "sse_error_ending",
]

_publish(globals(), __name__)
