"""Actors: behaviours with mailboxes, supervision and structured lifetimes.

Erlang/OTP and Akka Typed semantics on anyio (asyncio, uvloop, trio): one task
per actor, one message at a time, bounded mailboxes, ``tell``/``ask``,
one-for-one / one-for-all supervision with restart intensity, death watch,
and scopes whose cancellation stops every actor in them (engine requests
included). See ``actors/README.md``.
"""

from .._public import publish as _publish
from ._actor import Actor as Actor
from ._actor import Reply as Reply
from ._actor import handles as handles
from ._errors import ActorError as ActorError
from ._errors import ActorFailed as ActorFailed
from ._errors import ActorNameTaken as ActorNameTaken
from ._errors import ActorStopped as ActorStopped
from ._errors import AskTimeout as AskTimeout
from ._errors import EscalationError as EscalationError
from ._errors import RuntimeNotRunning as RuntimeNotRunning
from ._errors import UnhandledMessage as UnhandledMessage
from ._messages import CANCELLED as CANCELLED
from ._messages import NORMAL as NORMAL
from ._messages import RESTART as RESTART
from ._messages import SHUTDOWN as SHUTDOWN
from ._messages import StopReason as StopReason
from ._messages import Terminated as Terminated
from ._messages import is_abnormal as is_abnormal
from ._ref import ActorRef as ActorRef
from ._runtime import ActorScope as ActorScope
from ._runtime import Runtime as Runtime
from ._supervision import CleanupFailure as CleanupFailure
from ._supervision import Directive as Directive
from ._supervision import OneForAll as OneForAll
from ._supervision import OneForOne as OneForOne
from ._supervision import RestartKind as RestartKind
from ._supervision import SupervisionEvent as SupervisionEvent
from ._supervision import SupervisionStrategy as SupervisionStrategy

__all__ = [
    "CANCELLED",
    "NORMAL",
    "RESTART",
    "SHUTDOWN",
    "Actor",
    "ActorError",
    "ActorFailed",
    "ActorNameTaken",
    "ActorRef",
    "ActorScope",
    "ActorStopped",
    "AskTimeout",
    "CleanupFailure",
    "Directive",
    "EscalationError",
    "OneForAll",
    "OneForOne",
    "Reply",
    "RestartKind",
    "Runtime",
    "RuntimeNotRunning",
    "StopReason",
    "SupervisionEvent",
    "SupervisionStrategy",
    "Terminated",
    "UnhandledMessage",
    "handles",
    "is_abnormal",
]

_publish(globals(), __name__)
