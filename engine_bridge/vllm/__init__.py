"""The vLLM room: ``VLLMBridge`` over one in-process ``AsyncLLM``, and everything that
touches vLLM's internals (``_compat``: versions, platforms, request translation;
``_retention``: the retaining scheduler that runs inside the EngineCore; ``_models``:
the models it loads, found or converted into a local checkpoint).

Only this package imports vLLM (``tests/test_layout.py`` checks it); the rest of the
engine layer speaks the ``EngineBridge`` contract of ``engine_bridge._bridge``.
"""

from .._tier_stats import TierStats as TierStats
from ._bridge import VLLMBridge as VLLMBridge
from ._models import prepare_model as prepare_model
from ._models import resolve_model as resolve_model
from ._tool_parsers import vllm_tool_parsers as vllm_tool_parsers

__all__ = ["TierStats", "VLLMBridge", "prepare_model", "resolve_model", "vllm_tool_parsers"]
