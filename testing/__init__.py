"""What you need to test your own actors and modes without a model.

``ScriptedEngine`` is a deterministic engine bridge with vLLM's prefix-cache
rules and scripted replies (``StepCost``: its batched-step cost model, for
simulating load); ``run_virtual`` runs a test in virtual time (the engine's
latencies are anyio sleeps); ``make_random_lora`` writes a tiny random LoRA
adapter for a real model (to test adapter routing).
"""

from .._public import publish as _publish
from ..engine_bridge import EngineRequest as EngineRequest
from ..engine_bridge import ScriptedEngine as ScriptedEngine
from ..engine_bridge import StepCost as StepCost
from ..engine_bridge import ToyTokenizer as ToyTokenizer
from ..engine_bridge import make_random_lora as make_random_lora
from ._virtual import run_virtual as run_virtual

__all__ = [
    "EngineRequest",
    "ScriptedEngine",
    "StepCost",
    "ToyTokenizer",
    "make_random_lora",
    "run_virtual",
]

_publish(globals(), __name__)
