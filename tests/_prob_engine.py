"""ScriptedEngines whose answers come with chosen probabilities (soft votes, judges, likelihood).

``probs(request)`` gives, for a request constrained to choices, the probability
of each allowed text; the engine answers the most likely one and reports those
probabilities as the first token's logprobs (``None``: the ScriptedEngine's own
made-up ones). The distribution is given over allowed texts, one token each
with the toy tokenizer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

from microagent.engine_bridge import EngineRequest, TokenLogprob
from microagent.testing import ScriptedEngine

Probs = Callable[[EngineRequest], Mapping[str, float] | None]


class ProbEngine(ScriptedEngine):
    def __init__(self, probs: Probs, free: Callable[[EngineRequest], str | None] | None = None):
        self.probs = probs

        def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
            dist = probs(request) if request.sampling.choices else None
            if dist:
                return max(dist, key=lambda t: dist[t])
            return free(request) if free is not None else None

        super().__init__(script=script, decode_time_per_token=0.01)

    def _logprobs(self, request: EngineRequest, token_id: int, k: int) -> TokenLogprob:
        dist = self.probs(request) if request.sampling.choices else None
        if not dist:
            return super()._logprobs(request, token_id, k)
        top = sorted(
            ((self.tokenize(t)[0], math.log(p)) for t, p in dist.items() if p > 0),
            key=lambda item: -item[1],
        )[:k]
        return TokenLogprob(token_id, dict(top).get(token_id, -math.inf), tuple(top))


class LikelihoodEngine(ScriptedEngine):
    """Candidate ``i`` (its instructions say "candidate number i") replies ``replies[i]``,
    every token of it, the end token included, at probability ``believed[i]``: so its
    geometric-mean probability is exactly ``believed[i]``."""

    CANDIDATE = re.compile(r"candidate number (\d+)")

    def __init__(self, replies: Sequence[str], believed: Sequence[float]) -> None:
        self.believed = believed
        super().__init__(
            script=lambda _, r: replies[self.candidate(r)],
            decode_time_per_token=0.01,
            prefill_time_per_token=0.0001,
        )

    def candidate(self, request: EngineRequest) -> int:
        return int(self.CANDIDATE.findall(request.prompt.text)[0])

    def _logprobs(self, request: EngineRequest, token_id: int, k: int) -> TokenLogprob:
        logprob = math.log(self.believed[self.candidate(request)])
        return TokenLogprob(token_id, logprob, ((token_id, logprob),) if k else ())
