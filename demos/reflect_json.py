"""Reflect with a JSON-schema validator that repairs malformed structured output.

The drafter writes JSON; a validator tool checks it against a schema; on
failure its error message goes to the critic and the drafter revises — all on
one append-only thread, so every step's prompt is served from the cache.

    python demos/reflect_json.py
"""

from __future__ import annotations

import json
import sys

import anyio
from microagent import EngineBridge, Outcome, VLLMBridge, json_schema_validator, reflect
from microagent.console import open_engines, quiet_engine_logs

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
}
TASK = (
    "Extract the person as JSON with keys name (string), age (integer) and city (string). "
    "Text: Maria Lopez, 34, moved to Valencia last spring."
)


async def extract(
    engine: EngineBridge, *, rounds: int = 3, max_tokens: int = 64, on_event: object = None
) -> Outcome:
    return await reflect(
        engine,
        TASK,
        validator=json_schema_validator(SCHEMA),
        rounds=rounds,
        drafter="Reply with JSON only.",
        max_tokens=max_tokens,
        temperature=0.2,
        on_event=on_event,
    )


def show(event: object) -> None:
    kind = getattr(event, "type", "")
    data = getattr(event, "data", {})
    if kind == "validation":
        verdict = "valid" if data["ok"] else f"invalid: {data['message']}"
        print(f"  round {data['round']}: {verdict}", flush=True)


async def main() -> int:
    quiet_engine_logs("--verbose" in sys.argv)  # vLLM's and torch's logs go to a file
    engine = VLLMBridge("default")
    async with open_engines([engine]):
        outcome = await extract(engine, on_event=show)
    print(f"\nfinal answer: {outcome.answer}")
    print(f"valid: {outcome.details.get('valid')}  rounds: {outcome.rounds}")
    for step in outcome.details.get("history", []):
        print(json.dumps(step)[:200])
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
