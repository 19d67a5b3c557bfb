"""microagent: multi-agent LLM collaboration inside the inference engine.

Roles are actors with mailboxes that pass KV handles (token sequences already
in the engine's prefix cache) instead of text; every actor generates on one
in-process vLLM engine through an engine bridge.

    async with VLLMBridge("default") as engine:
        outcome = await vote(engine, "Is 17 prime?", voters=5, choices=["yes", "no"])
"""

from .actors import Actor as Actor
from .actors import ActorFailed as ActorFailed
from .actors import ActorRef as ActorRef
from .actors import ActorScope as ActorScope
from .actors import ActorStopped as ActorStopped
from .actors import AgentRecord as AgentRecord
from .actors import AgentSpec as AgentSpec
from .actors import AnswerSpec as AnswerSpec
from .actors import AskTimeout as AskTimeout
from .actors import CollaborationContext as CollaborationContext
from .actors import CollaborationEvent as CollaborationEvent
from .actors import CollaborationFailed as CollaborationFailed
from .actors import CollaborationOp as CollaborationOp
from .actors import EscalationError as EscalationError
from .actors import Graph as Graph
from .actors import InvalidCollaboration as InvalidCollaboration
from .actors import InvalidGraph as InvalidGraph
from .actors import ModeConfig as ModeConfig
from .actors import OneForAll as OneForAll
from .actors import OneForOne as OneForOne
from .actors import Outcome as Outcome
from .actors import RestartKind as RestartKind
from .actors import Role as Role
from .actors import RoleDefinition as RoleDefinition
from .actors import Runtime as Runtime
from .actors import Terminated as Terminated
from .actors import TraceRecorder as TraceRecorder
from .actors import Turn as Turn
from .actors import TurnDone as TurnDone
from .actors import Usage as Usage
from .actors import Verdict as Verdict
from .actors import aggregate as aggregate
from .actors import cascade as cascade
from .actors import collaborate as collaborate
from .actors import collaboration_modes as collaboration_modes
from .actors import debate as debate
from .actors import handles as handles
from .actors import json_schema_validator as json_schema_validator
from .actors import load_roles as load_roles
from .actors import plot_timeline as plot_timeline
from .actors import prepare_collaboration as prepare_collaboration
from .actors import python_tests_validator as python_tests_validator
from .actors import reflect as reflect
from .actors import register_mode as register_mode
from .actors import run_validator as run_validator
from .actors import unregister_mode as unregister_mode
from .actors import vote as vote
from .actors import write_trace as write_trace
from .engine_bridge import AdapterRef as AdapterRef
from .engine_bridge import EngineBridge as EngineBridge
from .engine_bridge import EngineDied as EngineDied
from .engine_bridge import EngineStats as EngineStats
from .engine_bridge import EngineUnavailable as EngineUnavailable
from .engine_bridge import GenerationResult as GenerationResult
from .engine_bridge import HandleMismatch as HandleMismatch
from .engine_bridge import KVHandle as KVHandle
from .engine_bridge import ModelPreparationError as ModelPreparationError
from .engine_bridge import RequestRefused as RequestRefused
from .engine_bridge import Sampling as Sampling
from .engine_bridge import ScriptedEngine as ScriptedEngine
from .engine_bridge import UnknownAdapter as UnknownAdapter
from .engine_bridge import VLLMBridge as VLLMBridge
from .engine_bridge import prepare_model as prepare_model
from .engine_bridge import resolve_model as resolve_model
from .mailbox import DeadLetter as DeadLetter
from .mailbox import DeadLetterReason as DeadLetterReason
from .mailbox import DeadLetters as DeadLetters
from .mailbox import MailboxFull as MailboxFull
from .mailbox import OverflowPolicy as OverflowPolicy

__version__ = "0.1.0"
