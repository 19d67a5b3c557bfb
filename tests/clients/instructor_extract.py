"""instructor's structured extraction (``instructor.from_openai``) against microagent.

``python instructor_extract.py BASE_URL tools|partial|json_schema|responses`` asks
for a ``Stock`` model, with no validation retries (one request), in one of
instructor's modes: ``tools`` forces a call of the model's function
(``tool_choice`` names it), ``partial`` streams that call as partial objects,
``json_schema`` sends a ``json_schema`` response format, ``responses`` forces the
call on the Responses API. It prints a JSON line: the validated object, how many
partial objects streamed, and the usage of the raw completion (where the mode
returns one).
"""

from __future__ import annotations

import json
import sys

import instructor
from openai import OpenAI
from pydantic import BaseModel

MESSAGES = [{"role": "user", "content": "SKU-1234 has 17 units left. Extract the stock as JSON."}]


class Stock(BaseModel):
    """How many units of an item are in stock."""

    item: str
    units: int


def main(base_url: str, how: str) -> None:
    openai = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    mode = {
        "tools": instructor.Mode.TOOLS,
        "partial": instructor.Mode.TOOLS,
        "json_schema": instructor.Mode.JSON_SCHEMA,
        "responses": instructor.Mode.RESPONSES_TOOLS,
    }[how]
    client = instructor.from_openai(openai, mode=mode)
    common = {"model": "default", "messages": MESSAGES, "max_retries": 0, "temperature": 0}
    partials = 0
    usage: dict[str, int] | None = None
    if how == "partial":
        stream = list(
            client.chat.completions.create_partial(response_model=Stock, max_tokens=64, **common)
        )
        partials = len(stream)
        final = Stock.model_validate(stream[-1].model_dump())  # the last partial is whole
    elif how == "responses":
        final = client.responses.create(response_model=Stock, max_output_tokens=64, **common)
    else:
        final, completion = client.chat.completions.create_with_completion(
            response_model=Stock, max_tokens=64, **common
        )
        usage = {
            "prompt_tokens": completion.usage.prompt_tokens,
            "completion_tokens": completion.usage.completion_tokens,
        }
    print(json.dumps({"stock": final.model_dump(), "partials": partials, "usage": usage}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
