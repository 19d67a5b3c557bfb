"""The remote room: ``RemoteBridge`` over an OpenAI-compatible HTTP endpoint (a hosted
model, another team's vLLM server). Text crosses this boundary, never KV: a remote
handle carries the chat messages it stands for, sent as composed; see
``docs/remote.md``.
"""

from ._bridge import RemoteBridge as RemoteBridge

__all__ = ["RemoteBridge"]
