"""Actors: behaviours with mailboxes, supervision and structured lifetimes.

Erlang/OTP and Akka Typed semantics on anyio (asyncio, uvloop, trio): one task
per actor, one message at a time, bounded mailboxes, ``tell``/``ask``,
one-for-one / one-for-all supervision with restart intensity, death watch,
and scopes whose cancellation stops every actor in them (engine requests
included). See ``actors/README.md``.
"""

# the built-in collaboration modes register themselves on import
from . import _ops_aggregate as _ops_aggregate
from . import _ops_cascade as _ops_cascade
from . import _ops_debate as _ops_debate
from . import _ops_graph as _ops_graph
from . import _ops_reflect as _ops_reflect
from . import _ops_vote as _ops_vote
from ._actor import Actor as Actor
from ._actor import Reply as Reply
from ._actor import handles as handles
from ._answers import Tally as Tally
from ._answers import majority as majority
from ._answers import normalize_answer as normalize_answer
from ._collab import CollaborationContext as CollaborationContext
from ._collab import CollaborationOp as CollaborationOp
from ._collab import PreparedCollaboration as PreparedCollaboration
from ._collab import collaborate as collaborate
from ._collab import collaboration_modes as collaboration_modes
from ._collab import get_mode as get_mode
from ._collab import prepare_collaboration as prepare_collaboration
from ._collab import register_mode as register_mode
from ._collab import unregister_mode as unregister_mode
from ._collab_api import aggregate as aggregate
from ._collab_api import cascade as cascade
from ._collab_api import debate as debate
from ._collab_api import reflect as reflect
from ._collab_api import run_mode as run_mode
from ._collab_api import vote as vote
from ._collab_config import ModeConfig as ModeConfig
from ._collab_roles import Role as Role
from ._collab_roles import RoleActor as RoleActor
from ._collab_roles import Turn as Turn
from ._collab_roles import TurnDone as TurnDone
from ._collab_types import AgentRecord as AgentRecord
from ._collab_types import AgentSpec as AgentSpec
from ._collab_types import AnswerSpec as AnswerSpec
from ._collab_types import CollaborationEvent as CollaborationEvent
from ._collab_types import CollaborationFailed as CollaborationFailed
from ._collab_types import InvalidCollaboration as InvalidCollaboration
from ._collab_types import Outcome as Outcome
from ._collab_types import Usage as Usage
from ._errors import ActorError as ActorError
from ._errors import ActorFailed as ActorFailed
from ._errors import ActorNameTaken as ActorNameTaken
from ._errors import ActorStopped as ActorStopped
from ._errors import AskTimeout as AskTimeout
from ._errors import EscalationError as EscalationError
from ._errors import RuntimeNotRunning as RuntimeNotRunning
from ._errors import UnhandledMessage as UnhandledMessage
from ._graph import Condition as Condition
from ._graph import Edge as Edge
from ._graph import Graph as Graph
from ._graph import InvalidGraph as InvalidGraph
from ._graph import Node as Node
from ._graph import graph_json_schema as graph_json_schema
from ._messages import CANCELLED as CANCELLED
from ._messages import NORMAL as NORMAL
from ._messages import RESTART as RESTART
from ._messages import SHUTDOWN as SHUTDOWN
from ._messages import StopReason as StopReason
from ._messages import Terminated as Terminated
from ._messages import is_abnormal as is_abnormal
from ._ops_graph import GraphConfig as GraphConfig
from ._ops_graph import GraphMode as GraphMode
from ._ref import ActorRef as ActorRef
from ._roles_library import InvalidRole as InvalidRole
from ._roles_library import RoleDefinition as RoleDefinition
from ._roles_library import load_role as load_role
from ._roles_library import load_roles as load_roles
from ._roles_library import match_roles as match_roles
from ._roles_library import parse_role as parse_role
from ._runtime import ActorScope as ActorScope
from ._runtime import Runtime as Runtime
from ._supervision import CleanupFailure as CleanupFailure
from ._supervision import Directive as Directive
from ._supervision import OneForAll as OneForAll
from ._supervision import OneForOne as OneForOne
from ._supervision import RestartKind as RestartKind
from ._supervision import SupervisionEvent as SupervisionEvent
from ._supervision import SupervisionStrategy as SupervisionStrategy
from ._trace import TraceRecorder as TraceRecorder
from ._trace import plot_timeline as plot_timeline
from ._trace import write_trace as write_trace
from ._validators import Verdict as Verdict
from ._validators import json_schema_validator as json_schema_validator
from ._validators import python_tests_validator as python_tests_validator
from ._validators import run_validator as run_validator
