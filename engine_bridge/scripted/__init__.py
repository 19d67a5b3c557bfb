"""The test double's room: ``ScriptedEngine`` and what only it needs.

A deterministic engine bridge with vLLM's prefix-cache rules (``_engine``), its
batched-step cost model (``_step_cost``: ``StepCost``) and the small JSON
documents it answers constrained requests with (``_json_instance``). Users reach
it through ``microagent.testing`` (as httpx users reach ``MockTransport``); inside
the package, ``serve --engine scripted`` builds it from here.
"""

from .._tokenizer import ToyTokenizer as ToyTokenizer
from ._engine import ScriptedEngine as ScriptedEngine
from ._step_cost import StepCost as StepCost

__all__ = ["ScriptedEngine", "StepCost", "ToyTokenizer"]
