"""Token log probabilities in OpenAI's shape: ``choices[i].logprobs.content[]``.

Each entry is ``{"token", "logprob", "bytes", "top_logprobs": [...]}``. The
end-of-turn token is left out, as it is left out of the message content, so the
entries' tokens concatenate to the content.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..engine_bridge import EngineBridge, TokenLogprob


def _token(bridge: EngineBridge, token_id: int, logprob: float) -> dict[str, Any]:
    text = bridge.detokenize((token_id,))
    # OpenAI's stand-in for "impossible"; JSON has no -Infinity
    value = logprob if math.isfinite(logprob) else -9999.0
    return {"token": text, "logprob": value, "bytes": list(text.encode())}


def logprobs_content(
    bridge: EngineBridge, logprobs: Sequence[TokenLogprob], top: int
) -> list[dict[str, Any]]:
    """The ``content`` entries for ``logprobs``, with ``top`` alternatives each."""
    eot = bridge.chat.template.eot_token_id
    out: list[dict[str, Any]] = []
    for entry in logprobs:
        if entry.token_id == eot:
            continue
        item = _token(bridge, entry.token_id, entry.logprob)
        item["top_logprobs"] = [_token(bridge, t, lp) for t, lp in entry.top[:top]]
        out.append(item)
    return out


def choice_logprobs(
    bridge: EngineBridge, logprobs: Sequence[TokenLogprob] | None, top: int
) -> dict[str, Any] | None:
    """A choice's ``logprobs`` object (``None`` when none were asked for)."""
    if logprobs is None:
        return None
    return {"content": logprobs_content(bridge, logprobs, top), "refusal": None}
