"""Hybrid cascade: small local drafters, a remote OpenAI-compatible model verifies on disagreement.

The drafters run in-process on the embedded SmolLM2; the verifier is any
OpenAI-compatible endpoint (another team's vLLM server, a hosted model). It is
called only when the drafts disagree; the drafts cross to it as text. The key
comes from an environment variable, never the command line.

    python -m vllm.entrypoints.openai.api_server --model DIR --port 8001 &   # or any endpoint
    python demos/hybrid_cascade.py --url http://127.0.0.1:8001/v1 --remote-model DIR [--key-env VAR]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio
from microagent import EngineBridge, Outcome, RemoteBridge, VLLMBridge
from microagent.collab import EventCallback, cascade
from microagent.console import open_engines, quiet_engine_logs

QUESTIONS = [
    "Is 17 a prime number? Answer yes or no.",
    "Is the Pacific the smallest ocean on Earth? Answer yes or no.",
]


async def check(
    local: EngineBridge,
    remote: EngineBridge,
    question: str,
    *,
    choices: Sequence[str] = ("yes", "no"),
    drafters: int = 2,
    verify: str = "on_disagreement",
    max_tokens: int = 16,
    on_event: EventCallback | None = None,
) -> Outcome:
    """Local drafts; ``remote`` verifies when they disagree (or always, ``verify="always"``)."""
    return await cascade(
        local,
        question,
        verifier_model=remote.model,
        drafters=drafters,
        engines={remote.model: remote},
        verify=verify,
        answer={"choices": list(choices)},
        max_tokens=max_tokens,
        temperature=0.9,
        on_event=on_event,
    )


def report(outcome: Outcome) -> str:
    """The answer, whether the remote was asked, and each model's tokens."""
    d = outcome.details
    lines = [
        f"  answer: {outcome.answer!r}  escalated: {d.get('escalated')}  "
        f"verdict: {d.get('verdict', '-')}"
    ]
    for name, u in outcome.usage_by_model.items():
        where = "remote" if u.remote else "local"
        lines.append(
            f"  {name} ({where}): {u.requests} requests, prompt {u.prompt_tokens} "
            f"(cached {u.cached_tokens}), generated {u.completion_tokens}"
        )
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the endpoint's base URL (…/v1)")
    parser.add_argument("--remote-model", required=True, help="the model id it serves")
    parser.add_argument("--key-env", default=None, help="environment variable holding its key")
    parser.add_argument("--always", action="store_true", help="verify every answer")
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and torch's logs")
    args = parser.parse_args(argv)
    quiet_engine_logs(args.verbose)
    local = VLLMBridge("default")
    remote = RemoteBridge("verifier", args.url, model=args.remote_model, api_key_env=args.key_env)
    async with open_engines([local, remote]):
        for question in QUESTIONS:
            print(f"\n{question}")
            outcome = await check(
                local, remote, question, verify="always" if args.always else "on_disagreement"
            )
            print(report(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
