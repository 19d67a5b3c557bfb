"""The remote room: ``RemoteBridge`` over an OpenAI-compatible HTTP endpoint (a hosted
model, another team's vLLM server). Text crosses this boundary, never KV; see
``docs/remote.md``.
"""

from ._bridge import RemoteBridge as RemoteBridge

__all__ = ["RemoteBridge"]
