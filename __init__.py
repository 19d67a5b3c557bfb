"""microagent: multi-agent LLM collaboration inside the inference engine.

Roles are actors with mailboxes that pass KV handles (token sequences already
in the engine's prefix cache) instead of text; every actor generates on one
in-process vLLM engine through an engine bridge.

    async with VLLMBridge("default") as engine:
        outcome = await vote(engine, "Is 17 prime?", voters=5, choices=["yes", "no"])

Layers, each importing only those below it: ``mailbox`` and ``engine_bridge``
→ ``actors`` (the runtime) → ``collab`` (the collaboration layer) → ``server``.
``microagent.testing`` holds the test double and helpers for your own tests.
"""

from .actors import Actor as Actor
from .actors import ActorError as ActorError
from .actors import ActorFailed as ActorFailed
from .actors import ActorRef as ActorRef
from .actors import ActorScope as ActorScope
from .actors import ActorStopped as ActorStopped
from .actors import AskTimeout as AskTimeout
from .actors import EscalationError as EscalationError
from .actors import OneForAll as OneForAll
from .actors import OneForOne as OneForOne
from .actors import RestartKind as RestartKind
from .actors import Runtime as Runtime
from .actors import Terminated as Terminated
from .actors import handles as handles
from .collab import AgentRecord as AgentRecord
from .collab import AgentSpec as AgentSpec
from .collab import AnswerSpec as AnswerSpec
from .collab import CollaborationContext as CollaborationContext
from .collab import CollaborationError as CollaborationError
from .collab import CollaborationEvent as CollaborationEvent
from .collab import CollaborationFailed as CollaborationFailed
from .collab import CollaborationOp as CollaborationOp
from .collab import Graph as Graph
from .collab import InvalidCollaboration as InvalidCollaboration
from .collab import InvalidGraph as InvalidGraph
from .collab import InvalidRole as InvalidRole
from .collab import ModeConfig as ModeConfig
from .collab import ModeRegistry as ModeRegistry
from .collab import ModeResult as ModeResult
from .collab import Outcome as Outcome
from .collab import Role as Role
from .collab import RoleDefinition as RoleDefinition
from .collab import SandboxLimits as SandboxLimits
from .collab import SandboxResult as SandboxResult
from .collab import SandboxUnavailable as SandboxUnavailable
from .collab import TraceRecorder as TraceRecorder
from .collab import Turn as Turn
from .collab import TurnDone as TurnDone
from .collab import Usage as Usage
from .collab import Verdict as Verdict
from .collab import aggregate as aggregate
from .collab import cascade as cascade
from .collab import collaborate as collaborate
from .collab import collaboration_modes as collaboration_modes
from .collab import debate as debate
from .collab import json_schema_validator as json_schema_validator
from .collab import load_roles as load_roles
from .collab import plot_timeline as plot_timeline
from .collab import prepare_collaboration as prepare_collaboration
from .collab import python_tests_validator as python_tests_validator
from .collab import reflect as reflect
from .collab import register_mode as register_mode
from .collab import run_sandboxed as run_sandboxed
from .collab import run_validator as run_validator
from .collab import sandbox_unavailable as sandbox_unavailable
from .collab import unregister_mode as unregister_mode
from .collab import vote as vote
from .collab import write_trace as write_trace
from .engine_bridge import AdapterRef as AdapterRef
from .engine_bridge import EngineBridge as EngineBridge
from .engine_bridge import EngineBridgeError as EngineBridgeError
from .engine_bridge import EngineDied as EngineDied
from .engine_bridge import EngineStats as EngineStats
from .engine_bridge import EngineUnavailable as EngineUnavailable
from .engine_bridge import GenerationResult as GenerationResult
from .engine_bridge import HandleMismatch as HandleMismatch
from .engine_bridge import KVHandle as KVHandle
from .engine_bridge import ModelPreparationError as ModelPreparationError
from .engine_bridge import RemoteBridge as RemoteBridge
from .engine_bridge import RemoteError as RemoteError
from .engine_bridge import RequestRefused as RequestRefused
from .engine_bridge import Retain as Retain
from .engine_bridge import RetentionStats as RetentionStats
from .engine_bridge import Sampling as Sampling
from .engine_bridge import ScriptedEngine as ScriptedEngine
from .engine_bridge import UnknownAdapter as UnknownAdapter
from .engine_bridge import VLLMBridge as VLLMBridge
from .engine_bridge import prepare_model as prepare_model
from .engine_bridge import resolve_model as resolve_model
from .mailbox import DeadLetter as DeadLetter
from .mailbox import DeadLetterReason as DeadLetterReason
from .mailbox import DeadLetters as DeadLetters
from .mailbox import MailboxError as MailboxError
from .mailbox import MailboxFull as MailboxFull
from .mailbox import OverflowPolicy as OverflowPolicy

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorError",
    "ActorFailed",
    "ActorRef",
    "ActorScope",
    "ActorStopped",
    "AdapterRef",
    "AgentRecord",
    "AgentSpec",
    "AnswerSpec",
    "AskTimeout",
    "CollaborationContext",
    "CollaborationError",
    "CollaborationEvent",
    "CollaborationFailed",
    "CollaborationOp",
    "DeadLetter",
    "DeadLetterReason",
    "DeadLetters",
    "EngineBridge",
    "EngineBridgeError",
    "EngineDied",
    "EngineStats",
    "EngineUnavailable",
    "EscalationError",
    "GenerationResult",
    "Graph",
    "HandleMismatch",
    "InvalidCollaboration",
    "InvalidGraph",
    "InvalidRole",
    "KVHandle",
    "MailboxError",
    "MailboxFull",
    "ModeConfig",
    "ModeRegistry",
    "ModeResult",
    "ModelPreparationError",
    "OneForAll",
    "OneForOne",
    "Outcome",
    "OverflowPolicy",
    "RemoteBridge",
    "RemoteError",
    "RequestRefused",
    "RestartKind",
    "Retain",
    "RetentionStats",
    "Role",
    "RoleDefinition",
    "Runtime",
    "Sampling",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "ScriptedEngine",
    "Terminated",
    "TraceRecorder",
    "Turn",
    "TurnDone",
    "UnknownAdapter",
    "Usage",
    "VLLMBridge",
    "Verdict",
    "aggregate",
    "cascade",
    "collaborate",
    "collaboration_modes",
    "debate",
    "handles",
    "json_schema_validator",
    "load_roles",
    "plot_timeline",
    "prepare_collaboration",
    "prepare_model",
    "python_tests_validator",
    "reflect",
    "register_mode",
    "resolve_model",
    "run_sandboxed",
    "run_validator",
    "sandbox_unavailable",
    "unregister_mode",
    "vote",
    "write_trace",
]
