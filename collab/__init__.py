"""The collaboration layer: modes that run teams of role actors on one engine.

A collaboration is a mode (``CollaborationOp``) run over agent specs and a
task context. Every role is a spawned actor in the collaboration's scope;
roles exchange KV handles through their mailboxes; the mode returns a typed
``ModeResult`` that ``collaborate`` turns into an ``Outcome``.

    outcome = await vote(engine, "Is 17 prime?", voters=5, choices=["yes", "no"])
"""

from .._public import publish as _publish
from ._agent import Role as Role
from ._agent import RoleActor as RoleActor
from ._agent import Turn as Turn
from ._agent import TurnDone as TurnDone
from ._budget import TokenBudgetExceeded as TokenBudgetExceeded
from ._budget import TokenMeter as TokenMeter
from ._budget import largest_turn as largest_turn
from ._budget import worst_case_tokens as worst_case_tokens
from ._calculator import CALCULATOR as CALCULATOR
from ._calculator import EXPRESSION_REGEX as EXPRESSION_REGEX
from ._calculator import CalculationError as CalculationError
from ._calculator import calculate as calculate
from ._calculator import calculator_tool as calculator_tool
from ._code_policy import CodePolicy as CodePolicy
from ._code_policy import code_policy as code_policy
from ._code_policy import current_code_policy as current_code_policy
from ._code_policy import require_code as require_code
from ._config import ModeConfig as ModeConfig
from ._config import boolean as boolean
from ._config import build_config as build_config
from ._config import int_in as int_in
from ._config import one_of as one_of
from ._context import CollaborationContext as CollaborationContext
from ._context import EventCallback as EventCallback
from ._context import bridge_for_spec as bridge_for_spec
from ._context import find_role as find_role
from ._context import split_final_role as split_final_role
from ._debias import ChoiceView as ChoiceView
from ._errors import CollaborationError as CollaborationError
from ._errors import CollaborationFailed as CollaborationFailed
from ._errors import InvalidCollaboration as InvalidCollaboration
from ._errors import InvalidGraph as InvalidGraph
from ._errors import InvalidRole as InvalidRole
from ._errors import NoAnswer as NoAnswer
from ._json_depth import MAX_SCHEMA_DEPTH as MAX_SCHEMA_DEPTH
from ._json_depth import check_schema_depth as check_schema_depth
from ._mcp import McpConnection as McpConnection
from ._mcp import McpServer as McpServer
from ._mcp import ToolServerError as ToolServerError
from ._mcp import mcp_connection as mcp_connection
from ._mcp import mcp_tools as mcp_tools
from ._mode import CollaborationOp as CollaborationOp
from ._mode import ModeRegistry as ModeRegistry
from ._mode import ModeResult as ModeResult
from ._outcome import BUILTIN_EVENTS as BUILTIN_EVENTS
from ._outcome import AgentFinish as AgentFinish
from ._outcome import AgentRecord as AgentRecord
from ._outcome import CollaborationEvent as CollaborationEvent
from ._outcome import EventType as EventType
from ._outcome import ModelUsage as ModelUsage
from ._outcome import Outcome as Outcome
from ._outcome import Usage as Usage
from ._outcome import event as event
from ._registry import collaboration_modes as collaboration_modes
from ._registry import default_registry as default_registry
from ._registry import get_mode as get_mode
from ._registry import register_mode as register_mode
from ._registry import unregister_mode as unregister_mode
from ._role_files import RoleDefinition as RoleDefinition
from ._role_files import load_role as load_role
from ._role_files import load_roles as load_roles
from ._role_files import match_roles as match_roles
from ._role_files import parse_role as parse_role
from ._run import DEFAULT_MAX_AGENTS as DEFAULT_MAX_AGENTS
from ._run import ContextInput as ContextInput
from ._run import ModeInput as ModeInput
from ._run import PreparedCollaboration as PreparedCollaboration
from ._run import collaborate as collaborate
from ._run import prepare_collaboration as prepare_collaboration
from ._sandbox import SandboxLimits as SandboxLimits
from ._sandbox import SandboxResult as SandboxResult
from ._sandbox import SandboxUnavailable as SandboxUnavailable
from ._sandbox import run_sandboxed as run_sandboxed
from ._sandbox import sandbox_unavailable as sandbox_unavailable
from ._scheduling import LEVEL_SPAN as LEVEL_SPAN
from ._scheduling import ServicePolicy as ServicePolicy
from ._scheduling import arrival_number as arrival_number
from ._scheduling import critical_offset as critical_offset
from ._shortcuts import Target as Target
from ._shortcuts import aggregate as aggregate
from ._shortcuts import cascade as cascade
from ._shortcuts import debate as debate
from ._shortcuts import reflect as reflect
from ._shortcuts import run_mode as run_mode
from ._shortcuts import vote as vote
from ._soft import SoftBallot as SoftBallot
from ._soft import SoftTally as SoftTally
from ._spec import MAX_AGENT_COUNT as MAX_AGENT_COUNT
from ._spec import MAX_AGENT_TOKENS as MAX_AGENT_TOKENS
from ._spec import AgentInput as AgentInput
from ._spec import AgentSpec as AgentSpec
from ._spec import AnswerSpec as AnswerSpec
from ._spec import FieldRule as FieldRule
from ._spec import agent_field_rules as agent_field_rules
from ._spec import agent_json_schema as agent_json_schema
from ._spec import check_agent_field as check_agent_field
from ._tally import StopRule as StopRule
from ._tally import Tally as Tally
from ._tally import all_agree as all_agree
from ._tally import majority as majority
from ._tally import normalize_answer as normalize_answer
from ._tools import DEFAULT_MAX_TOOL_STEPS as DEFAULT_MAX_TOOL_STEPS
from ._tools import Tool as Tool
from ._tools import ToolInput as ToolInput
from ._tools import ToolOutcome as ToolOutcome
from ._tools import agent_tool_plan as agent_tool_plan
from ._tools import unknown_agent_tool as unknown_agent_tool
from ._validators import Validator as Validator
from ._validators import Verdict as Verdict
from ._validators import json_schema_validator as json_schema_validator
from ._validators import python_tests_validator as python_tests_validator
from ._validators import run_validator as run_validator
from ._validators import validator_from_spec as validator_from_spec
from ._validators import validator_json_schema as validator_json_schema
from .graph import Condition as Condition
from .graph import Edge as Edge
from .graph import Graph as Graph
from .graph import Node as Node
from .graph import graph_json_schema as graph_json_schema
from .modes import GraphConfig as GraphConfig
from .modes import GraphMode as GraphMode
from .trace import TraceRecorder as TraceRecorder
from .trace import plot_timeline as plot_timeline
from .trace import write_trace as write_trace

__all__ = [
    "BUILTIN_EVENTS",
    "CALCULATOR",
    "DEFAULT_MAX_AGENTS",
    "DEFAULT_MAX_TOOL_STEPS",
    "EXPRESSION_REGEX",
    "LEVEL_SPAN",
    "MAX_AGENT_COUNT",
    "MAX_AGENT_TOKENS",
    "MAX_SCHEMA_DEPTH",
    "AgentFinish",
    "AgentInput",
    "AgentRecord",
    "AgentSpec",
    "AnswerSpec",
    "CalculationError",
    "ChoiceView",
    "CodePolicy",
    "CollaborationContext",
    "CollaborationError",
    "CollaborationEvent",
    "CollaborationFailed",
    "CollaborationOp",
    "Condition",
    "ContextInput",
    "Edge",
    "EventCallback",
    "EventType",
    "FieldRule",
    "Graph",
    "GraphConfig",
    "GraphMode",
    "InvalidCollaboration",
    "InvalidGraph",
    "InvalidRole",
    "McpConnection",
    "McpServer",
    "ModeConfig",
    "ModeInput",
    "ModeRegistry",
    "ModeResult",
    "ModelUsage",
    "NoAnswer",
    "Node",
    "Outcome",
    "PreparedCollaboration",
    "Role",
    "RoleActor",
    "RoleDefinition",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "ServicePolicy",
    "SoftBallot",
    "SoftTally",
    "StopRule",
    "Tally",
    "Target",
    "TokenBudgetExceeded",
    "TokenMeter",
    "Tool",
    "ToolInput",
    "ToolOutcome",
    "ToolServerError",
    "TraceRecorder",
    "Turn",
    "TurnDone",
    "Usage",
    "Validator",
    "Verdict",
    "agent_field_rules",
    "agent_json_schema",
    "agent_tool_plan",
    "aggregate",
    "all_agree",
    "arrival_number",
    "boolean",
    "bridge_for_spec",
    "build_config",
    "calculate",
    "calculator_tool",
    "cascade",
    "check_agent_field",
    "check_schema_depth",
    "code_policy",
    "collaborate",
    "collaboration_modes",
    "critical_offset",
    "current_code_policy",
    "debate",
    "default_registry",
    "event",
    "find_role",
    "get_mode",
    "graph_json_schema",
    "int_in",
    "json_schema_validator",
    "largest_turn",
    "load_role",
    "load_roles",
    "majority",
    "match_roles",
    "mcp_connection",
    "mcp_tools",
    "normalize_answer",
    "one_of",
    "parse_role",
    "plot_timeline",
    "prepare_collaboration",
    "python_tests_validator",
    "reflect",
    "register_mode",
    "require_code",
    "run_mode",
    "run_sandboxed",
    "run_validator",
    "sandbox_unavailable",
    "split_final_role",
    "unknown_agent_tool",
    "unregister_mode",
    "validator_from_spec",
    "validator_json_schema",
    "vote",
    "worst_case_tokens",
    "write_trace",
]

_publish(globals(), __name__)
