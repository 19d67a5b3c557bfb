"""What you need to test your own actors and modes without a model.

``ScriptedEngine`` is a deterministic engine bridge with vLLM's prefix-cache
rules and scripted replies (``StepCost``: its batched-step cost model, for
simulating load); ``run_virtual`` runs a test in virtual time (the engine's
latencies are anyio sleeps); ``make_random_lora`` writes a tiny random LoRA
adapter for a real model (to test adapter routing). With a model, ``VLLMServer``
starts vLLM's own OpenAI server as a real remote (``wait_healthy``,
``fetch_metrics``, ``parse_metrics`` and ``metric_delta`` read it, or any server).
"""

from .._public import publish as _publish
from ..engine_bridge import EngineRequest as EngineRequest
from ..engine_bridge.scripted import ScriptedEngine as ScriptedEngine
from ..engine_bridge.scripted import StepCost as StepCost
from ..engine_bridge.scripted import ToyTokenizer as ToyTokenizer
from ._lora import make_random_lora as make_random_lora
from ._virtual import run_virtual as run_virtual
from ._vllm_server import VLLM_COUNTERS as VLLM_COUNTERS
from ._vllm_server import VLLMServer as VLLMServer
from ._vllm_server import fetch_metrics as fetch_metrics
from ._vllm_server import metric_delta as metric_delta
from ._vllm_server import parse_metrics as parse_metrics
from ._vllm_server import wait_healthy as wait_healthy

__all__ = [
    "VLLM_COUNTERS",
    "EngineRequest",
    "ScriptedEngine",
    "StepCost",
    "ToyTokenizer",
    "VLLMServer",
    "fetch_metrics",
    "make_random_lora",
    "metric_delta",
    "parse_metrics",
    "run_virtual",
    "wait_healthy",
]

_publish(globals(), __name__)
_publish(globals(), __name__, below="microagent.engine_bridge")
