"""LiteLLM's ``openai/`` provider running a preset by its model name (no extra fields).

``python litellm_preset.py BASE_URL MODEL`` prints a JSON line: the chat reply's
model, text and usage (and whether the ``collaboration`` object came through),
the streamed text and final usage, and the Responses reply's model, text and usage.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# the provider's price table ships with the package: no download at import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

QUESTION = "Is 7 a prime number? Answer yes or no."


def main(base_url: str, model: str) -> None:
    common: dict[str, Any] = {
        "model": f"openai/{model}",
        "api_base": base_url,
        "api_key": "unused",
    }
    messages = [{"role": "user", "content": QUESTION}]
    reply = litellm.completion(messages=messages, max_tokens=8, **common)
    collaboration = getattr(reply, "collaboration", None)
    text, usage = "", None
    for chunk in litellm.completion(
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        **common,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if getattr(chunk, "usage", None):
            usage = chunk.usage.model_dump()
    response = litellm.responses(input=QUESTION, max_output_tokens=8, **common)
    print(
        json.dumps(
            {
                "model": reply.model,
                "text": reply.choices[0].message.content,
                "usage": reply.usage.model_dump(),
                "collaboration": collaboration if isinstance(collaboration, dict) else None,
                "stream_text": text,
                "stream_usage": usage,
                "responses_model": response.model,
                "responses_text": response.output_text
                if hasattr(response, "output_text")
                else None,
                "responses_usage": response.usage.model_dump() if response.usage else None,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
