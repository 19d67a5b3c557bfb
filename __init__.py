"""microagent: multi-agent LLM collaboration inside the inference engine.

Roles are actors with mailboxes that pass KV handles (token sequences already
in the engine's prefix cache) instead of text; every actor generates on one
in-process vLLM engine through an engine bridge.
"""

from .engine_bridge import AdapterRef as AdapterRef
from .engine_bridge import EngineBridge as EngineBridge
from .engine_bridge import EngineDied as EngineDied
from .engine_bridge import GenerationResult as GenerationResult
from .engine_bridge import KVHandle as KVHandle
from .engine_bridge import RequestRefused as RequestRefused
from .engine_bridge import Sampling as Sampling

__version__ = "0.1.0"
