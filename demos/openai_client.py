"""An `openai` SDK client talking to `microagent serve`, streaming a collaboration.

Start the server first (`microagent serve --model default --port 8000`), then:

    python demos/openai_client.py [--base-url http://127.0.0.1:8000/v1]

Each role's events arrive live on the stream (`collaboration_event` on every
chunk); the final answer arrives as ordinary `delta.content`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openai import OpenAI


def stream_debate(
    client: OpenAI, model: str, question: str, *, max_tokens: int = 32
) -> tuple[str, list[dict[str, Any]]]:
    """Stream a debate; print every role's events; return the answer and the events."""
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "agents": [{"name": "debater", "count": 3, "temperature": 0.7}],
            "collaboration": {"mode": "debate", "rounds": 2},
        },
    )
    answer: list[str] = []
    events: list[dict[str, Any]] = []
    for chunk in stream:
        extra = chunk.model_extra or {}
        event = extra.get("collaboration_event")
        if event:
            events.append(event)
            if event["type"] != "delta":
                who = event.get("agent") or "-"
                details = {
                    k: v for k, v in event.items() if k not in ("type", "agent", "time", "usage")
                }
                print(f"{event['type']:<15} {who:<12} {details}", flush=True)
        if chunk.choices and chunk.choices[0].delta.content:
            answer.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            print(f"usage: {chunk.usage}")
    return "".join(answer), events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--question", default="What is 6 + 7?")
    args = parser.parse_args(argv)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    answer, _ = stream_debate(client, model, args.question)
    print(f"\nanswer: {answer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
