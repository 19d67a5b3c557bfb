"""The collaboration layer: modes that run teams of role actors on one engine.

A collaboration is a mode (``CollaborationOp``) run over agent specs and a
task context. Every role is a spawned actor in the collaboration's scope;
roles exchange KV handles through their mailboxes; the mode returns a typed
``ModeResult`` that ``collaborate`` turns into an ``Outcome``.

    outcome = await vote(engine, "Is 17 prime?", voters=5, choices=["yes", "no"])

This namespace exports what users need (``collab/README.md`` lists each name):
the modes and ``collaborate``, the agent specs, the outcomes and events, tools
and validators, the op API for your own modes, and the policies the server
hands in. Graph building blocks are in ``microagent.collab.graph``, the built-in
mode classes in ``.modes``, traces and timelines in ``.trace``.
"""

from .._public import publish as _publish
from ._agent import Role as Role
from ._agent import Turn as Turn
from ._agent import TurnDone as TurnDone
from ._budget import TokenBudgetExceeded as TokenBudgetExceeded
from ._calculator import calculator_tool as calculator_tool
from ._code_policy import CodePolicy as CodePolicy
from ._code_policy import code_policy as code_policy
from ._config import ModeConfig as ModeConfig
from ._context import CollaborationContext as CollaborationContext
from ._context import EventCallback as EventCallback
from ._errors import CollaborationError as CollaborationError
from ._errors import CollaborationFailed as CollaborationFailed
from ._errors import InvalidCollaboration as InvalidCollaboration
from ._errors import InvalidGraph as InvalidGraph
from ._errors import InvalidRole as InvalidRole
from ._errors import NoAnswer as NoAnswer
from ._json_depth import check_schema_depth as check_schema_depth
from ._mcp import McpServer as McpServer
from ._mcp import ToolServerError as ToolServerError
from ._mcp import mcp_connection as mcp_connection
from ._mcp import mcp_tools as mcp_tools
from ._mode import CollaborationOp as CollaborationOp
from ._mode import ModeRegistry as ModeRegistry
from ._mode import ModeResult as ModeResult
from ._outcome import AgentRecord as AgentRecord
from ._outcome import CollaborationEvent as CollaborationEvent
from ._outcome import Outcome as Outcome
from ._outcome import Usage as Usage
from ._outcome import event as event
from ._registry import collaboration_modes as collaboration_modes
from ._registry import get_mode as get_mode
from ._registry import register_mode as register_mode
from ._registry import unregister_mode as unregister_mode
from ._role_files import RoleDefinition as RoleDefinition
from ._role_files import load_roles as load_roles
from ._run import PreparedCollaboration as PreparedCollaboration
from ._run import collaborate as collaborate
from ._run import prepare_collaboration as prepare_collaboration
from ._sandbox import sandbox_unavailable as sandbox_unavailable
from ._scheduling import ServicePolicy as ServicePolicy
from ._scheduling import arrival_priority as arrival_priority
from ._shortcuts import aggregate as aggregate
from ._shortcuts import cascade as cascade
from ._shortcuts import debate as debate
from ._shortcuts import reflect as reflect
from ._shortcuts import vote as vote
from ._spec import AgentSpec as AgentSpec
from ._spec import AnswerSpec as AnswerSpec
from ._spec import FieldRule as FieldRule
from ._tally import normalize_answer as normalize_answer
from ._tools import DEFAULT_MAX_TOOL_STEPS as DEFAULT_MAX_TOOL_STEPS
from ._tools import Tool as Tool
from ._tools import agent_tool_plan as agent_tool_plan
from ._tools import unknown_agent_tool as unknown_agent_tool
from ._validators import Validator as Validator
from ._validators import Verdict as Verdict
from ._validators import json_schema_validator as json_schema_validator
from ._validators import python_tests_validator as python_tests_validator
from ._validators import validator_json_schema as validator_json_schema
from .graph import Graph as Graph

__all__ = [
    "DEFAULT_MAX_TOOL_STEPS",
    "AgentRecord",
    "AgentSpec",
    "AnswerSpec",
    "CodePolicy",
    "CollaborationContext",
    "CollaborationError",
    "CollaborationEvent",
    "CollaborationFailed",
    "CollaborationOp",
    "EventCallback",
    "FieldRule",
    "Graph",
    "InvalidCollaboration",
    "InvalidGraph",
    "InvalidRole",
    "McpServer",
    "ModeConfig",
    "ModeRegistry",
    "ModeResult",
    "NoAnswer",
    "Outcome",
    "PreparedCollaboration",
    "Role",
    "RoleDefinition",
    "ServicePolicy",
    "TokenBudgetExceeded",
    "Tool",
    "ToolServerError",
    "Turn",
    "TurnDone",
    "Usage",
    "Validator",
    "Verdict",
    "agent_tool_plan",
    "aggregate",
    "arrival_priority",
    "calculator_tool",
    "cascade",
    "check_schema_depth",
    "code_policy",
    "collaborate",
    "collaboration_modes",
    "debate",
    "event",
    "get_mode",
    "json_schema_validator",
    "load_roles",
    "mcp_connection",
    "mcp_tools",
    "normalize_answer",
    "prepare_collaboration",
    "python_tests_validator",
    "reflect",
    "register_mode",
    "sandbox_unavailable",
    "unknown_agent_tool",
    "unregister_mode",
    "validator_json_schema",
    "vote",
]

_publish(globals(), __name__)
