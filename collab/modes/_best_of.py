"""best_of: verifier-guided best-of-N — N candidates, each scored, the best one chosen.

Every agent answers once from the shared context (sampled, so candidates
differ; constrained to ``answer`` when it is set). Candidates are ranked by:

1. a validator tool (``validator``, as reflect's: a callable, or ``json``,
   ``json_schema``, ``python_tests`` over HTTP): passing ranks above failing;
2. the model's own judgement (``judge: self``): the candidate's own thread is
   continued with ``judge_instructions`` ("Is the answer above correct? …"),
   the judge step is constrained to ``yes``/``no`` and the candidate's score is
   ``P(yes)`` renormalised over yes/no, read from the judge step's first-token
   logprobs (``_soft.read_ballot``: the sampled word when the engine reported
   neither). The thread is a cached prefix: only the question is computed.
   Candidates with the same answer (normalised when answers are constrained,
   else the exact text) are judged once, on the first of them to finish; with
   a validator only the passing candidates are judged (all when none passes).

3. the model's likelihood of each candidate (``judge: likelihood``): the
   geometric mean of its tokens' probabilities, read from the candidate step's
   own logprobs (no judge request, no extra tokens), summed over the candidates
   with the same answer (soft self-consistency, Wang et al. 2024): an answer
   sampled twice at 0.6 outranks one sampled once at 0.9. Answers are grouped
   as a vote groups them (``ctx.normalize``: the normalised text, the choice,
   or what ``answer.extract`` reads). With a validator only the passing
   candidates are scored.

The best is the highest (passes, score); among equals the first to finish.
``judge: auto`` judges when there is no validator and not otherwise. With a
validator and no judge, ``early_stop`` ends the mode at the first candidate
that passes (nothing can outrank it: later ones lose the tie); the others are
pruned and their requests aborted.

Waves and adaptive stop: ``wave`` > 0 starts candidates k at a time, in the
order the agents are listed. With ``judge: likelihood``, ``adaptive`` stops
after a wave once the leading answer cannot be overtaken: its summed
probability exceeds the runner-up's by more than the candidates not yet
started could add (at most 1 each). The later candidates are never started,
and the answer is the one all of them would have given (under the same waves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import attrs

from ...engine_bridge import GenerationResult, TokenLogprob
from .._agent import Role, Turn
from .._config import ModeConfig, boolean, int_in, one_of
from .._context import CollaborationContext
from .._errors import InvalidCollaboration
from .._mode import CollaborationOp, ModeResult
from .._soft import SOFT_TOP_LOGPROBS, SharedFirstToken, first_tokens, read_ballot
from .._spec import AgentSpec
from .._validators import Validator, Verdict, run_validator, validator_from_spec

JUDGE_PROMPT = "Is the answer above correct? Answer yes or no."
JUDGE_WORDS = ("yes", "no")
JUDGE_MODES = ("auto", "self", "likelihood", "off")
#: budget of a judge step (one word, constrained)
JUDGE_TOKENS = 4
#: candidates per wave of an adaptive best-of whose ``wave`` is 0
ADAPTIVE_WAVE = 2


def _validator(value: Any) -> Validator | None:
    return None if value is None else validator_from_spec(value)


def _judge(value: object) -> object:
    """``true``/``false`` are accepted for ``self``/``off``."""
    if value is True:
        return "self"
    if value is False:
        return "off"
    return value


def _instructions(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > 2000:
        raise InvalidCollaboration(
            attribute.name, "must be a non-empty string of 2000 chars at most"
        )


@attrs.frozen(kw_only=True)
class BestOfConfig(ModeConfig):
    """best_of options.

    Attributes:
        validator: a callable, or an HTTP spec (``{"type": "json_schema", "schema": …}``).
        judge: ``self`` (or ``true``): score candidates by the model's P(yes) to
            ``judge_instructions``; ``likelihood``: by the model's mean token
            probability of each candidate, summed per answer (no extra requests);
            ``off`` (or ``false``): only the validator; ``auto`` (default): ``self``
            without a validator, ``off`` with one.
        judge_instructions: the yes/no question the judge step answers.
        answer_tokens: budget of a constrained candidate (with ``answer``).
        wave: start candidates k at a time, in agent order (0 = all at once; an
            adaptive best-of's default is ``ADAPTIVE_WAVE``).
        adaptive: with ``judge: likelihood``: stop starting candidates once the
            leading answer's probability cannot be overtaken by those left.
    """

    validator: Validator | None = attrs.field(default=None, converter=_validator)
    judge: str = attrs.field(default="auto", converter=_judge, validator=one_of(JUDGE_MODES))
    judge_instructions: str = attrs.field(default=JUDGE_PROMPT, validator=_instructions)
    answer_tokens: int = attrs.field(default=16, validator=int_in(1, 256))
    wave: int = attrs.field(default=0, validator=int_in(0, 64))
    adaptive: bool = attrs.field(default=False, validator=boolean)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.judge == "off" and self.validator is None:
            raise InvalidCollaboration("judge", "off needs a validator (nothing else scores)")
        if self.adaptive and self.judge != "likelihood":
            raise InvalidCollaboration(
                "adaptive", "needs judge: likelihood (its scores bound what later candidates add)"
            )

    @property
    def judged(self) -> bool:
        """Whether candidates get the model's own judgement."""
        return self.judge == "self" or (self.judge == "auto" and self.validator is None)

    @property
    def by_likelihood(self) -> bool:
        """Whether candidates are scored by their own tokens' probabilities."""
        return self.judge == "likelihood"


@attrs.define(eq=False)
class _Candidate:
    role: Role
    result: GenerationResult
    finished: int  # finish order, 0-based
    verdict: Verdict | None = None
    score: float | None = None

    @property
    def text(self) -> str:
        return self.result.content.strip()

    @property
    def passes(self) -> bool:
        """Whether it passed the validator (true without one)."""
        return self.verdict is None or self.verdict.ok

    def rank(self) -> tuple[bool, float, int]:
        """Larger is better: passes the validator, judge score, earlier finish."""
        return (self.passes, self.score if self.score is not None else 0.0, -self.finished)


class BestOf(CollaborationOp[BestOfConfig]):
    """Best-of-N: candidates scored by a validator tool and/or the model's own P(yes)."""

    name = "best_of"
    Config = BestOfConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("candidate", count=5),)

    def max_turns(self, config: BestOfConfig, agents: Sequence[AgentSpec]) -> int:
        return 2 * sum(a.count for a in agents)  # each candidate, then its judgement

    async def run(self, ctx: CollaborationContext[BestOfConfig]) -> ModeResult:
        config = ctx.config
        if config.by_likelihood:
            ctx.require_logprobs(
                "collaboration.judge", "likelihood (use self or a validator) reads logprobs"
            )
        roles = await ctx.spawn_all(role="candidate")
        finished: list[_Candidate] = []
        stopped = False
        stop_at_first_pass = (
            config.validator is not None
            and not (config.judged or config.by_likelihood)
            and config.early_stop
        )

        async def generate(role: Role) -> None:
            nonlocal stopped
            constrained = config.answer is not None
            sampling = ctx.sampling(
                role.spec,
                max_tokens=config.answer_tokens if constrained else None,
                constrained=constrained,
            )
            if config.by_likelihood:  # the sampled tokens' own logprobs, no alternatives
                sampling = attrs.evolve(sampling, logprobs=0)
            done = await ctx.turn(
                role, Turn(ctx.prompt(role.spec), sampling, label="candidate", keep=config.judged)
            )
            result = done.result
            if result is None or result.finish_reason not in ("stop", "length"):
                return
            candidate = _Candidate(role, result, len(finished))
            finished.append(candidate)
            role.record.answer = await _answer(ctx, candidate.text)
            if config.validator is None:
                return
            candidate.verdict = await run_validator(config.validator, candidate.text)
            await ctx.emit(
                "validation",
                role.agent,
                ok=candidate.verdict.ok,
                message=candidate.verdict.message,
                by="validator",
            )
            if candidate.verdict.ok and stop_at_first_pass and not stopped:
                stopped = True
                for other in roles:
                    if other is not role and other.record.answer is None:
                        await ctx.prune(other, "early_stop")

        wave = config.wave or (ADAPTIVE_WAVE if config.adaptive else len(roles))
        decided = False
        for start in range(0, len(roles), wave):
            async with anyio.create_task_group() as tg:
                for role in roles[start : start + wave]:
                    tg.start_soon(generate, role)
            left = roles[start + wave :]
            if stopped or not left:
                break
            if config.adaptive and await _decided(ctx, finished, len(left)):
                decided = stopped = True
                for role in left:  # never started
                    await ctx.prune(role, "early_stop")
                break
        if not finished:
            raise ctx.failure("no candidate produced an answer")
        judged = await self._judge_all(ctx, finished) if config.judged else 0
        if config.by_likelihood:
            await _score_by_likelihood(ctx, finished)
        best = max(finished, key=_Candidate.rank)
        scored_by = "+".join(
            name
            for name, used in (
                ("validator", config.validator is not None),
                ("self", judged > 0),
                ("likelihood", config.by_likelihood),
            )
            if used
        )
        details: dict[str, Any] = {
            "chosen": best.role.agent,
            "scored_by": scored_by,
            "samples": len(finished),
            "judged": judged,
            "candidates": [_report(c) for c in finished],
        }
        if best.verdict is not None:
            details["valid"] = best.verdict.ok
        if decided:
            details["stopped_by"] = "adaptive"
        return ModeResult(
            answer=await _answer(ctx, best.text), early_stopped=stopped, details=details
        )

    async def _judge_all(
        self, ctx: CollaborationContext[BestOfConfig], candidates: list[_Candidate]
    ) -> int:
        """Score the candidates by the model's P(yes); return the judge requests made."""
        pool = _scored_pool(candidates)
        firsts: dict[str, _Candidate] = {}
        for c in pool:
            firsts.setdefault(await _key(ctx, c.text), c)

        async with anyio.create_task_group() as tg:
            for c in firsts.values():
                tg.start_soon(self._judge, ctx, c)
        for c in pool:
            c.score = firsts[await _key(ctx, c.text)].score
        return len(firsts)

    async def _judge(self, ctx: CollaborationContext[BestOfConfig], candidate: _Candidate) -> None:
        role = candidate.role
        try:
            tokens = first_tokens(JUDGE_WORDS, role.bridge.tokenize)
        except SharedFirstToken as exc:
            raise InvalidCollaboration("collaboration.judge", str(exc)) from None
        chat = role.bridge.chat
        prompt = ctx.prompt(
            role.spec,
            base=chat.close_turn(candidate.result.handle),
            instructions=ctx.config.judge_instructions,
        )
        sampling = attrs.evolve(
            ctx.sampling(role.spec, max_tokens=JUDGE_TOKENS, temperature=0.0),
            choices=JUDGE_WORDS,
            # a remote model reports no logprobs: its judgement is the word it says
            logprobs=None if role.bridge.remote else SOFT_TOP_LOGPROBS,
        )
        done = await ctx.turn(role, Turn(prompt, sampling, label="judge", priority=-1, keep=False))
        word = done.content.strip().lower()
        sampled = JUDGE_WORDS.index(word) if word in JUDGE_WORDS else None
        logprobs = done.result.logprobs if done.result is not None else None
        ballot = read_ballot(logprobs[0] if logprobs else None, tokens, (0, 1), sampled)
        candidate.score = 0.0 if ballot is None else ballot.probs[0]
        await ctx.emit(
            "validation", role.agent, ok=candidate.score >= 0.5, score=candidate.score, by="self"
        )


def sequence_probability(logprobs: Sequence[TokenLogprob] | None) -> float:
    """The geometric mean of the sampled tokens' probabilities (``logprobs``), in [0, 1].

    Length-normalised so that a longer phrasing of an answer is not penalised for
    its length; 0 when the engine reported no logprobs.
    """
    if not logprobs:
        return 0.0
    return math.exp(sum(t.logprob for t in logprobs) / len(logprobs))


def _scored_pool(candidates: list[_Candidate]) -> list[_Candidate]:
    """The candidates a judge scores: those that pass the validator, all when none does."""
    return [c for c in candidates if c.passes] or candidates


async def _answer_mass(
    ctx: CollaborationContext[BestOfConfig], candidates: list[_Candidate]
) -> dict[str, float]:
    """Per answer (normalised as a vote normalises it), its candidates' summed probability."""
    mass: dict[str, float] = {}
    for c in candidates:
        key = await ctx.normalize(c.text)
        mass[key] = mass.get(key, 0.0) + sequence_probability(c.result.logprobs)
    return mass


async def _score_by_likelihood(
    ctx: CollaborationContext[BestOfConfig], candidates: list[_Candidate]
) -> None:
    """Each candidate's score: the summed sequence probabilities of its answer's candidates."""
    pool = _scored_pool(candidates)
    mass = await _answer_mass(ctx, pool)
    for c in pool:
        c.score = mass[await ctx.normalize(c.text)]


async def _decided(
    ctx: CollaborationContext[BestOfConfig], candidates: list[_Candidate], left: int
) -> bool:
    """Whether ``left`` more candidates cannot change the likelihood winner.

    Each adds at most 1 (a geometric-mean probability) to one answer, so the
    leader is safe when its mass exceeds the runner-up's by more than ``left``.
    With a validator only passing candidates count; none passing is undecided.
    """
    passing = [c for c in candidates if c.passes]
    if not passing:
        return False
    ranked = sorted((await _answer_mass(ctx, passing)).values(), reverse=True)
    runner_up = ranked[1] if len(ranked) > 1 else 0.0
    return ranked[0] > runner_up + left


async def _answer(ctx: CollaborationContext[BestOfConfig], text: str) -> str:
    """A candidate's answer: the canonical choice with fixed choices, else its text."""
    return await ctx.normalize(text) if ctx.config.answer is not None else text


async def _key(ctx: CollaborationContext[BestOfConfig], text: str) -> str:
    """Candidates with equal keys get one judgement."""
    return await ctx.normalize(text) if ctx.config.answer is not None else text


def _report(c: _Candidate) -> dict[str, Any]:
    entry: dict[str, Any] = {"agent": c.role.agent, "answer": c.text[:2000]}
    if c.verdict is not None:
        entry["valid"] = c.verdict.ok
        if c.verdict.message:
            entry["validator_message"] = c.verdict.message
    if c.score is not None:
        entry["score"] = round(c.score, 4)
    return entry
