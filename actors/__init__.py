"""Actors: behaviours with mailboxes, supervision and structured lifetimes.

Erlang/OTP and Akka Typed semantics on anyio (asyncio, uvloop, trio): one task
per actor, one message at a time, bounded mailboxes, ``tell``/``ask``,
one-for-one / one-for-all supervision with restart intensity, death watch,
and scopes whose cancellation stops every actor in them (engine requests
included). See ``actors/README.md``.
"""

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

# --- collaboration ------------------------------------------------------------------
from . import _ops_aggregate as _ops_aggregate  # noqa: E402  (registers the built-in modes)
from . import _ops_cascade as _ops_cascade  # noqa: E402
from . import _ops_debate as _ops_debate  # noqa: E402
from . import _ops_reflect as _ops_reflect  # noqa: E402
from . import _ops_vote as _ops_vote  # noqa: E402
from ._answers import Tally as Tally  # noqa: E402
from ._answers import majority as majority  # noqa: E402
from ._answers import normalize_answer as normalize_answer  # noqa: E402
from ._collab import CollaborationContext as CollaborationContext  # noqa: E402
from ._collab import CollaborationOp as CollaborationOp  # noqa: E402
from ._collab import PreparedCollaboration as PreparedCollaboration  # noqa: E402
from ._collab import collaborate as collaborate  # noqa: E402
from ._collab import collaboration_modes as collaboration_modes  # noqa: E402
from ._collab import get_mode as get_mode  # noqa: E402
from ._collab import prepare_collaboration as prepare_collaboration  # noqa: E402
from ._collab import register_mode as register_mode  # noqa: E402
from ._collab import unregister_mode as unregister_mode  # noqa: E402
from ._collab_api import aggregate as aggregate  # noqa: E402
from ._collab_api import cascade as cascade  # noqa: E402
from ._collab_api import debate as debate  # noqa: E402
from ._collab_api import reflect as reflect  # noqa: E402
from ._collab_api import run_mode as run_mode  # noqa: E402
from ._collab_api import vote as vote  # noqa: E402
from ._collab_config import ModeConfig as ModeConfig  # noqa: E402
from ._collab_roles import Role as Role  # noqa: E402
from ._collab_roles import RoleActor as RoleActor  # noqa: E402
from ._collab_roles import Turn as Turn  # noqa: E402
from ._collab_roles import TurnDone as TurnDone  # noqa: E402
from ._collab_types import AgentRecord as AgentRecord  # noqa: E402
from ._collab_types import AgentSpec as AgentSpec  # noqa: E402
from ._collab_types import AnswerSpec as AnswerSpec  # noqa: E402
from ._collab_types import CollaborationEvent as CollaborationEvent  # noqa: E402
from ._collab_types import CollaborationFailed as CollaborationFailed  # noqa: E402
from ._collab_types import InvalidCollaboration as InvalidCollaboration  # noqa: E402
from ._collab_types import Outcome as Outcome  # noqa: E402
from ._collab_types import Usage as Usage  # noqa: E402
from ._validators import Verdict as Verdict  # noqa: E402
from ._validators import json_schema_validator as json_schema_validator  # noqa: E402
from ._validators import python_tests_validator as python_tests_validator  # noqa: E402
from ._validators import run_validator as run_validator  # noqa: E402
