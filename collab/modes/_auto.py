"""auto: pick a strategy from the question's form; ``details`` say which and why.

The rule (the first that matches; ``k`` choices, ``n`` agents):

0. ``calculator: true`` and a question that calls for a calculation
   (``compute.calls_for_calculation``: numeric choices and a number in the
   question; or, free, two numbers, or one and a word such as "total"): the
   ``compute`` mode, program-aided: the agents write arithmetic, the sandboxed
   calculator evaluates it, with ``compute_steps`` and ``compute_verify`` as its
   ``steps`` and ``verify``. Off by default: the calculator runs code on the
   machine (over HTTP, ``serve --calculator`` allows it).
1. ``answer.choices`` (closed choices) whose texts start with distinct tokens
   (the engine's tokenizer): the closed-choice configuration ``bench/quality.py``
   published before issue 30 (its method ``soft2-content``): a **soft vote
   over the answers themselves** (``vote`` with ``style: direct``, ``debias:
   order``, ``soft: true``, ``calibrate: content``, ``answer_tokens: 1``).
   Every voter sees the choices in its own order, and the prior the model
   gives each answer on a content-free question is divided out — except for
   yes/no questions, where that division over-corrects the model's "yes"
   preference (measured: ``capital`` in BENCHMARKS.md), so ``calibrate: off``.
2. closed choices that share a first token: a **soft vote over lettered
   options** (``debias: labels``, ``soft: true``, ``calibrate: position`` when
   ``n >= k``, else ``off``): letters are one token each, so the first-token
   rule applies. More than 26 such choices: a hard vote with ``debias: order``.
3. ``answer.regex`` (a closed form without fixed choices): a plain majority
   vote of the normalised answers (``vote``, ``style: auto``).
4. a ``validator`` (a free answer that can be checked): ``best_of`` scored by
   the validator, stopping at the first candidate that passes.
5. a free answer: ``n == 1``: a single sample; ``n > 1``: ``best_of`` scored by
   the candidates' own likelihood, summed per answer (``judge: likelihood``, soft
   self-consistency). Measured against the model's P(yes) judgement at five
   candidates (``bench/quality.py --out quality_judges``): better on two free
   families, level on the third, with no judge request.

Rules 1, 2 and 5 read the engine's logprobs. When an agent runs on a model
that reports none (a remote chat-completions model), they give way to plain
votes: closed choices get a hard vote with ``debias: order``, free answers
with several agents a majority vote of the normalised answers.

The chosen mode runs with the request's agents and the shared options
(``early_stop``, ``answer``, ``max_tokens``, ``temperature``, ``timeout``).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs

from .._agent import Turn
from .._arith import MAX_STEPS
from .._code_policy import require_code
from .._config import ModeConfig, boolean, int_in, not_none
from .._context import CollaborationContext
from .._debias import LABELS
from .._errors import InvalidCollaboration
from .._mode import AnyOp, CollaborationOp, ModeResult
from .._soft import SharedFirstToken, first_tokens
from .._spec import AgentSpec
from .._validators import Validator, validator_from_spec
from ._best_of import BestOf, BestOfConfig
from ._compute import Compute, ComputeConfig, calls_for_calculation
from ._vote import Vote, VoteConfig, answer_logprob

STRATEGIES = (
    "compute",
    "soft_vote",
    "soft_vote_labels",
    "vote",
    "best_of_validator",
    "best_of_likelihood",
    "single",
)
#: Rule 1's options: ``bench/quality.py``'s ``soft2-content`` (published before issue 30).
PUBLISHED_CLOSED_CHOICE: dict[str, Any] = {
    "style": "direct",
    "debias": "order",
    "soft": True,
    "calibrate": "content",
    "answer_tokens": 1,
}


def _validator(value: Any) -> Validator | None:
    return None if value is None else validator_from_spec(value)


@attrs.frozen(kw_only=True)
class AutoConfig(ModeConfig):
    """auto options.

    Attributes:
        validator: a validator tool for free answers (as reflect's and best_of's).
        calculator: questions that call for a calculation run ``compute`` (rule 0).
        compute_steps: rule 0's ``compute`` option ``steps`` (1: one expression per
            agent; more: a program of at most this many named steps).
        compute_verify: rule 0's ``compute`` option ``verify`` (a value that uses a
            number the question does not state is rejected).
        logprob: a single sample (rule 5, one agent) records ``details.answer_logprob``,
            its answer's summed token log-probability (None: its model reports none).
    """

    validator: Validator | None = attrs.field(default=None, converter=_validator)
    calculator: bool = attrs.field(default=False, validator=boolean)
    compute_steps: int = attrs.field(default=1, validator=[not_none, int_in(1, MAX_STEPS)])
    compute_verify: bool = attrs.field(default=True, validator=boolean)
    logprob: bool = attrs.field(default=False, validator=boolean)


@attrs.frozen
class Plan:
    """What ``auto`` runs: a strategy name, the reason, the mode and its config."""

    strategy: str
    why: str
    op: AnyOp | None
    config: ModeConfig
    options: dict[str, Any]


def distinct_first_tokens(choices: Sequence[str], tokenize: Callable[[str], Sequence[int]]) -> bool:
    """Whether every choice starts with its own token (rule 1's condition)."""
    try:
        first_tokens(choices, tokenize)
    except SharedFirstToken:
        return False
    return True


def plan(
    config: AutoConfig,
    agents: Sequence[AgentSpec],
    *,
    distinct_first: bool = True,
    logprobs: bool = True,
    calculation: bool = False,
) -> Plan:
    """The strategy the rule picks for ``config`` and ``agents`` (see the module docstring).

    ``distinct_first``: whether the choices start with distinct tokens (the
    engine's tokenizer decides; ``distinct_first_tokens``). ``logprobs``: whether
    every agent's model reports logprobs (a remote chat-completions one does not).
    ``calculation``: whether the question calls for one (``calls_for_calculation``).
    """
    n = sum(a.count for a in agents)
    shared: dict[str, Any] = {
        "early_stop": config.early_stop,
        "answer": config.answer,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "timeout": config.timeout,
        "top_p": config.top_p,
        "seed": config.seed,
        "stop": config.stop,
    }
    answer = config.answer
    if config.calculator and calculation:
        why = "the question calls for a calculation: the agents write it, the calculator runs it"
        computed: dict[str, Any] = {
            "steps": config.compute_steps,
            "verify": config.compute_verify,
        }
        return Plan("compute", why, Compute(), ComputeConfig(**shared, **computed), computed)
    if not logprobs and answer is not None and answer.choices:
        options: dict[str, Any] = {"style": "direct", "debias": "order"}
        why = "closed choices, an agent's model reports no logprobs: a debiased hard vote"
        return Plan("vote", why, Vote(), VoteConfig(**shared, **options), options)
    if answer is not None and answer.choices:
        k = len(answer.choices)
        if distinct_first:
            options = dict(PUBLISHED_CLOSED_CHOICE)
            yes_no = {c.strip().lower() for c in answer.choices} == {"yes", "no"}
            if yes_no:
                options["calibrate"] = "off"
            why = f"closed choices ({k}) with distinct first tokens: the published soft vote " + (
                "(each voter in its own order), uncalibrated: a content-free prior over-corrects "
                "the model's yes/no preference"
                if yes_no
                else "(each voter in its own order, the content-free prior divided out)"
            )
            config_ = VoteConfig(**{**shared, **options})
            return Plan("soft_vote", why, Vote(), config_, options)
        if k > len(LABELS):
            options = {"style": "direct", "debias": "order"}
            why = (
                f"closed choices ({k}) sharing first tokens, more than can be lettered: "
                "a debiased vote"
            )
            return Plan("vote", why, Vote(), VoteConfig(**shared, **options), options)
        calibrated = n >= k
        options = {
            "style": "direct",
            "debias": "labels",
            "soft": True,
            "calibrate": "position" if calibrated else "off",
        }
        why = (
            f"closed choices ({k}) sharing first tokens: a soft vote over lettered options, "
            "each voter in its own order, "
            + (
                "the position prior measured across voters and removed"
                if calibrated
                else f"uncalibrated (fewer agents than choices: {n} < {k})"
            )
        )
        return Plan("soft_vote_labels", why, Vote(), VoteConfig(**shared, **options), options)
    if answer is not None and answer.regex:
        why = "a closed answer form (regex) without fixed choices: a majority vote"
        return Plan("vote", why, Vote(), VoteConfig(**shared), {})
    if config.validator is not None:
        options = {"judge": "off"}
        why = "a free answer with a validator: best-of-N, the first candidate that passes"
        best = BestOfConfig(**shared, validator=config.validator, **options)
        return Plan("best_of_validator", why, BestOf(), best, options)
    if n == 1:
        return Plan("single", "a free answer and one agent: a single sample", None, config, {})
    if not logprobs:
        why = f"a free answer, {n} agents, a model without logprobs: a majority vote"
        return Plan("vote", why, Vote(), VoteConfig(**shared), {})
    options = {"judge": "likelihood"}
    why = (
        f"a free answer, {n} agents, no validator: best-of-N scored by the candidates' "
        "own likelihood, summed per answer"
    )
    return Plan("best_of_likelihood", why, BestOf(), BestOfConfig(**shared, **options), options)


def _every_plan(config: AutoConfig, agents: Sequence[AgentSpec]) -> list[Plan]:
    """Every plan ``config`` can run: the tokenizer, the models and the question pick one."""
    return [
        plan(config, agents, distinct_first=d, logprobs=lp, calculation=c)
        for d, lp, c in itertools.product((True, False), repeat=3)
    ]


class Auto(CollaborationOp[AutoConfig]):
    """Pick vote (soft), best-of-N or a single sample from the question's form."""

    name = "auto"
    Config = AutoConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("agent", count=5),)

    def validate(self, config: AutoConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        if config.calculator:
            require_code("calculator", "collaboration.calculator")
        else:  # compute's options without the rule that runs compute: never ignored silently
            fields = attrs.fields(AutoConfig)
            for field in (fields.compute_steps, fields.compute_verify):
                if getattr(config, field.name) != field.default:
                    raise InvalidCollaboration(
                        f"collaboration.{field.name}", "applies only with calculator: true"
                    )
        for chosen in _every_plan(config, agents):
            if chosen.op is not None:
                chosen.op.validate(chosen.config, agents)

    def max_turns(self, config: AutoConfig, agents: Sequence[AgentSpec]) -> int | None:
        turns = [
            1 if chosen.op is None else chosen.op.max_turns(chosen.config, agents)
            for chosen in _every_plan(config, agents)
        ]
        return None if None in turns else max(t for t in turns if t is not None)

    async def run(self, ctx: CollaborationContext[AutoConfig]) -> ModeResult:
        answer = ctx.config.answer
        distinct = (
            answer is None
            or not answer.choices
            or distinct_first_tokens(answer.choices, ctx.engine.tokenize)
        )
        logprobs = ctx.without_logprobs() is None
        calculation = ctx.config.calculator and calls_for_calculation(
            ctx.question, answer.choices if answer is not None else None
        )
        chosen = plan(
            ctx.config,
            ctx.agents,
            distinct_first=distinct,
            logprobs=logprobs,
            calculation=calculation,
        )
        head: dict[str, Any] = {
            "strategy": chosen.strategy,
            "why": chosen.why,
            "options": chosen.options,
        }
        if chosen.op is None:
            return await self._single(ctx, head)
        sub: CollaborationContext[Any] = copy.copy(ctx)  # same scope, records and events
        sub.op = chosen.op
        sub.config = chosen.config
        result = await chosen.op.run(sub)
        return attrs.evolve(result, details={**head, **result.details})

    async def _single(
        self, ctx: CollaborationContext[AutoConfig], head: dict[str, Any]
    ) -> ModeResult:
        spec = ctx.agents[0]
        role = await ctx.spawn(spec.agent_names()[0], spec, "agent")
        sampling = ctx.sampling(spec)
        scored = ctx.config.logprob and ctx.without_logprobs([spec]) is None
        if scored:
            sampling = attrs.evolve(sampling, logprobs=0)
        done = await ctx.turn(role, Turn(ctx.prompt(spec), sampling, label="answer", keep=False))
        if done.result is None:
            raise ctx.failure("the agent produced nothing")
        role.record.answer = done.content
        details = {**head, "samples": 1}
        if ctx.config.logprob:
            logs = done.result.logprobs
            details["answer_logprob"] = answer_logprob(role.bridge, logs) if logs else None
        return ModeResult(answer=done.content, details=details)
