"""Where an evaluation's requests run: a ``Runner`` turns one request into a ``Reply``.

``BridgeRunner`` runs a collaboration in process, through ``collaborate()`` (the
function the server calls); ``HTTPRunner`` (``_http_runner``) sends it to an
OpenAI-compatible ``microagent serve`` as a client would. Anything with a
``label`` and an async ``run`` is a runner: tests inject a fake one through
``evaluate(runner=...)``.

A configuration that refuses a request (the server's 400) is a ``refused`` reply;
a collaboration that ran and produced no answer is a ``failed`` one; both count
as wrong. Anything else (the engine lost, the connection gone) is raised: the run
stops, and a rerun resumes where it stopped.
"""

from __future__ import annotations

import time
from typing import Protocol

import attrs

from ..collab import (
    CollaborationFailed,
    InvalidCollaboration,
    TokenBudgetExceeded,
    collaborate,
    prepare_collaboration,
)
from ..engine_bridge import EngineBridge
from ._candidates import EvalRequest


@attrs.frozen
class Reply:
    """What one configuration answered to one question, with its costs.

    Attributes:
        answer: the collaboration's answer (``""`` when refused or failed).
        prompt_tokens: prompt tokens of all its requests.
        completion_tokens: completion tokens of all its requests.
        seconds: wall time of the collaboration.
        refused: why the configuration refused the request (the server's 400), or None.
        abstained: whether it answered "no confident answer" (``details.abstained``).
        failed: why the collaboration produced no answer, or None.
        logprob: the summed token log-probability of its answer (``details.answer_logprob``,
            asked for greedy's requests: greedy's own confidence), or None (not asked, not
            reported, or a journal line written before it was recorded).
    """

    answer: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    refused: str | None = None
    abstained: bool = False
    failed: str | None = None
    logprob: float | None = None

    @property
    def answered(self) -> bool:
        """Whether it gave an answer (not refused, failed or abstained)."""
        return self.refused is None and self.failed is None and not self.abstained


class Runner(Protocol):
    """Runs one request and returns its reply.

    ``label`` names where the requests run (a model, an endpoint): a resumed run
    reuses only replies recorded under the same label.
    """

    @property
    def label(self) -> str: ...

    async def run(self, request: EvalRequest) -> Reply: ...


@attrs.define
class BridgeRunner:
    """Requests through ``collaborate()`` on an open engine bridge, in process."""

    engine: EngineBridge

    @property
    def label(self) -> str:
        return f"in-process:{self.engine.model}"

    async def run(self, request: EvalRequest) -> Reply:
        options = dict(request.collaboration)
        mode = str(options.pop("mode"))
        options.update(temperature=request.temperature, max_tokens=request.max_tokens)
        if request.logprob:
            options["logprob"] = True
        t0 = time.monotonic()
        try:
            prepared = prepare_collaboration(mode, list(request.agents), options)
            out = await collaborate(self.engine, prepared, request.question)
        except (InvalidCollaboration, TokenBudgetExceeded) as exc:
            return Reply(seconds=time.monotonic() - t0, refused=str(exc))
        except (CollaborationFailed, TimeoutError) as exc:
            return Reply(seconds=time.monotonic() - t0, failed=f"{type(exc).__name__}: {exc}")
        return Reply(
            answer=out.answer,
            prompt_tokens=out.usage.prompt_tokens,
            completion_tokens=out.usage.completion_tokens,
            seconds=time.monotonic() - t0,
            abstained=bool(out.details.get("abstained", False)),
            logprob=number_or_none(out.details.get("answer_logprob")),
        )


def number_or_none(value: object) -> float | None:
    """A reported log-probability as a float (None when it is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
