"""microagent: multi-agent LLM collaboration inside the inference engine.

Roles are actors with mailboxes that pass KV handles (token sequences already
in the engine's prefix cache) instead of text; every actor generates on one
in-process vLLM engine through an engine bridge.

    async with VLLMBridge("default") as engine:
        outcome = await vote(engine, "Is 17 prime?", voters=5, choices=["yes", "no"])

Layers, each importing only those below it: ``mailbox`` and ``engine_bridge``
→ ``actors`` (the runtime) → ``collab`` (the collaboration layer) → ``server``.
``microagent.testing`` holds the test double and helpers for your own tests.

This namespace is the documented core (``__all__``); every subpackage keeps its
own public API.
"""

from __future__ import annotations

from .actors import Actor as Actor
from .actors import ActorError as ActorError
from .actors import Runtime as Runtime
from .actors import handles as handles
from .collab import AgentSpec as AgentSpec
from .collab import AnswerSpec as AnswerSpec
from .collab import CollaborationContext as CollaborationContext
from .collab import CollaborationError as CollaborationError
from .collab import CollaborationEvent as CollaborationEvent
from .collab import CollaborationFailed as CollaborationFailed
from .collab import CollaborationOp as CollaborationOp
from .collab import Graph as Graph
from .collab import InvalidCollaboration as InvalidCollaboration
from .collab import ModeConfig as ModeConfig
from .collab import ModeResult as ModeResult
from .collab import Outcome as Outcome
from .collab import Turn as Turn
from .collab import aggregate as aggregate
from .collab import cascade as cascade
from .collab import collaborate as collaborate
from .collab import collaboration_modes as collaboration_modes
from .collab import debate as debate
from .collab import json_schema_validator as json_schema_validator
from .collab import load_roles as load_roles
from .collab import prepare_collaboration as prepare_collaboration
from .collab import reflect as reflect
from .collab import register_mode as register_mode
from .collab import vote as vote
from .engine_bridge import EngineBridge as EngineBridge
from .engine_bridge import EngineBridgeError as EngineBridgeError
from .engine_bridge import EngineDied as EngineDied
from .engine_bridge import GenerationResult as GenerationResult
from .engine_bridge import KVHandle as KVHandle
from .engine_bridge import RemoteBridge as RemoteBridge
from .engine_bridge import RemoteError as RemoteError
from .engine_bridge import Retain as Retain
from .engine_bridge import Sampling as Sampling
from .engine_bridge import VLLMBridge as VLLMBridge
from .engine_bridge import resolve_model as resolve_model
from .mailbox import MailboxError as MailboxError

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorError",
    "AgentSpec",
    "AnswerSpec",
    "CollaborationContext",
    "CollaborationError",
    "CollaborationEvent",
    "CollaborationFailed",
    "CollaborationOp",
    "EngineBridge",
    "EngineBridgeError",
    "EngineDied",
    "GenerationResult",
    "Graph",
    "InvalidCollaboration",
    "KVHandle",
    "MailboxError",
    "ModeConfig",
    "ModeResult",
    "Outcome",
    "RemoteBridge",
    "RemoteError",
    "Retain",
    "Runtime",
    "Sampling",
    "Turn",
    "VLLMBridge",
    "aggregate",
    "cascade",
    "collaborate",
    "collaboration_modes",
    "debate",
    "handles",
    "json_schema_validator",
    "load_roles",
    "prepare_collaboration",
    "reflect",
    "register_mode",
    "resolve_model",
    "vote",
]
