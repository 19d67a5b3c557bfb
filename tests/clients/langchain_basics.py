"""langchain-openai's streaming and structured output against microagent.

``python langchain_basics.py BASE_URL`` prints a JSON line: how many chunks a
stream gave and their text, and the parsed structured answer.
"""

from __future__ import annotations

import json
import sys

from langchain_openai import ChatOpenAI
from pydantic import BaseModel


class Answer(BaseModel):
    """A yes/no answer with a short reason."""

    answer: str
    reason: str


def main(base_url: str) -> None:
    llm = ChatOpenAI(
        model="default", base_url=base_url, api_key="unused", temperature=0, max_tokens=32
    )
    chunks = [c.content for c in llm.stream("Name a colour.")]
    structured = llm.with_structured_output(Answer, method="json_schema")
    parsed = structured.invoke("Is water wet? Answer yes or no, with a reason.")
    print(
        json.dumps(
            {
                "chunks": len(chunks),
                "text": "".join(str(c) for c in chunks),
                "structured": parsed.model_dump() if isinstance(parsed, Answer) else None,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
