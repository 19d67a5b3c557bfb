"""vote: self-consistency with exact early stopping.

N voters fork from the shared context. ``direct`` voters answer at once,
constrained to the choices (or regex); ``reason`` voters first reason freely,
then their own output handle is extended with an answer cue and a constrained
continuation — the cue's prompt hits the cache on the whole reasoning.

Exact early stop: as soon as the leading answer can no longer be overtaken
(``Tally.decided``), the voters still running are pruned and their engine
requests aborted. The answer is then exactly what the full vote would give on
the same outputs. ``wave`` > 0 samples voters k at a time, so later waves are
never started when the first ones agree.

Adaptive stop (``adaptive``): after each wave, a stated rule (``StopRule``:
Adaptive-Consistency's Beta rule or early-stopping self-consistency's window
rule) may stop sampling although the vote is not yet certain; the answer is
the leader of the votes cast. Debiased voting (``debias``): with fixed choices,
each voter sees them in its own order (``ChoiceView``), and its answer is mapped
back to the canonical choice before the tally. Soft votes (``soft``): each
voter's probability of every choice, read from its answer step's logprobs, is
summed instead of its one sample counted (``_soft.py``: the first-token rule,
renormalisation and the ``position`` calibration).

Agreement gate (``gate``): the leader's share of the votes cast must reach the
gate, or ``below`` decides: ``greedy`` answers with a fresh temperature-0 direct
call of the first voter's spec (the same request as a one-voter direct vote at
temperature 0), ``abstain`` answers ``NO_CONFIDENT_ANSWER`` with
``details.abstained``, ``escalate`` keeps sampling in waves until the gate is
reached (the exact and adaptive stops wait for it) and applies greedy when the
voters are spent. ``details.agreement`` records the share whenever a gate is set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import attrs

from ...engine_bridge import EngineBridge, KVHandle, TokenLogprob
from .._agent import Role, Turn
from .._config import ModeConfig, boolean, int_in, one_of
from .._context import CollaborationContext, find_role
from .._debias import DEBIAS_MODES, LABELS, ChoiceView
from .._errors import InvalidCollaboration
from .._mode import CollaborationOp, ModeResult
from .._soft import (
    CONTENT_FREE,
    SOFT_CALIBRATIONS,
    SOFT_TOP_LOGPROBS,
    SharedFirstToken,
    SoftBallot,
    SoftTally,
    calibrate,
    first_tokens,
    read_ballot,
    rounded,
)
from .._spec import AgentSpec
from .._tally import STOP_RULES, StopRule, Tally

#: waves of an adaptive vote whose ``wave`` is 0
ADAPTIVE_WAVE = 3

ANSWER_CUE = "Therefore, the final answer is"

#: a gated vote's answer content when it abstains (``below: abstain``)
NO_CONFIDENT_ANSWER = "No confident answer."
#: what a gated vote does when the agreement stays below its gate
BELOW_GATE = ("greedy", "abstain", "escalate")


def _style(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("auto", "direct", "reason"):
        raise InvalidCollaboration(attribute.name, f"must be auto, direct or reason, got {value!r}")


def _debias(value: object) -> object:
    """``true``/``false`` are accepted for ``order``/``off``."""
    if value is True:
        return "order"
    if value is False:
        return "off"
    return value


def _gate(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidCollaboration(attribute.name, f"must be a number in (0, 1], got {value!r}")


def _confidence(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.5 < value < 1:
        raise InvalidCollaboration(attribute.name, f"must be a number in (0.5, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class VoteConfig(ModeConfig):
    """vote options.

    Attributes:
        style: ``direct`` (answer at once), ``reason`` (reason, then answer from
            the reasoning's handle) or ``auto`` (reason when answers are constrained
            and max_tokens allows reasoning, direct otherwise).
        wave: start voters k at a time (0 = all at once; an adaptive vote's
            default is ``ADAPTIVE_WAVE``).
        answer_tokens: budget of the constrained answer step. A soft vote may use 1:
            its allowed answers start with different tokens, so the first token names
            the answer (the voter's answer is the choice that token starts).
        debias: with ``answer.choices``: ``order`` (or ``true``): each voter sees
            the choices in its own order; ``labels``: as lettered options in its
            own order, answering with a letter; ``off`` (or ``false``, the default).
        adaptive: stop sampling after a wave once the leader is probably the
            majority: ``beta`` (Adaptive-Consistency: ``P(p > 1/2) >= confidence``
            for ``p ~ Beta(leader + 1, runner-up + 1)``), ``window`` (early-stopping
            self-consistency: every vote of the latest wave agrees) or ``off``.
        confidence: the ``beta`` rule's threshold, in (0.5, 1).
        soft: with ``answer.choices``: sum each voter's probabilities of the choices
            (read from its answer step's logprobs) instead of counting its sample.
        calibrate: a soft vote's calibration across voters: ``off`` (each voter's
            distribution renormalised over the choices), ``position`` (with
            ``debias``: the voters' mean preference per shown position divided out)
            or ``content`` (``style: direct``: each listing's distribution for a
            content-free question divided out, one short request per listing).
        gate: the agreement gate, in (0, 1]: the leader's share of the votes cast must
            reach it (None, the default: no gate).
        below: what a vote whose agreement stays below ``gate`` does: ``greedy`` (a
            fresh temperature-0 direct answer of the first voter), ``abstain`` (the
            answer ``NO_CONFIDENT_ANSWER``, ``details.abstained: true``) or
            ``escalate`` (more waves of voters until the gate is reached, then greedy).
        logprob: record ``details.answer_logprob``: the summed token log-probability
            of the answer step that gave the final answer (the most likely among the
            voters that named it; the greedy call's below the gate). None where the
            model reports no logprobs. A confidence an evaluation ranks answers by.
    """

    style: str = attrs.field(default="auto", validator=_style)
    wave: int = attrs.field(default=0, validator=int_in(0, 64))
    answer_tokens: int = attrs.field(default=16, validator=int_in(1, 256))
    debias: str = attrs.field(default="off", converter=_debias, validator=one_of(DEBIAS_MODES))
    adaptive: str = attrs.field(default="off", validator=one_of(STOP_RULES))
    confidence: float = attrs.field(default=0.95, validator=_confidence)
    soft: bool = attrs.field(default=False, validator=boolean)
    calibrate: str = attrs.field(default="off", validator=one_of(SOFT_CALIBRATIONS))
    gate: float | None = attrs.field(default=None, validator=_gate)
    below: str = attrs.field(default="greedy", validator=one_of(BELOW_GATE))
    logprob: bool = attrs.field(default=False, validator=boolean)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.below != "greedy" and self.gate is None:
            raise InvalidCollaboration("below", "applies to a gated vote: set gate")
        if self.debias != "off" and (self.answer is None or not self.answer.choices):
            raise InvalidCollaboration("debias", "needs answer.choices (fixed choices to reorder)")
        if self.soft and (self.answer is None or not self.answer.choices):
            raise InvalidCollaboration("soft", "needs answer.choices (the choices to score)")
        if self.soft and self.adaptive != "off":
            raise InvalidCollaboration(
                "adaptive", "counts votes; a soft vote stops on its exact rule (early_stop) only"
            )
        if self.calibrate != "off" and not self.soft:
            raise InvalidCollaboration("calibrate", "calibrates soft votes: set soft: true")
        if self.calibrate == "content" and self.style != "direct":
            raise InvalidCollaboration(
                "calibrate", "content asks a direct answer to a content-free question: style direct"
            )
        if self.calibrate == "position" and self.debias == "off":
            raise InvalidCollaboration(
                "calibrate", "position needs debias (voters must see the choices in other orders)"
            )
        if self.adaptive == "window" and self.wave == 1:
            raise InvalidCollaboration("wave", "the window rule needs waves of 2 or more voters")

    @property
    def stop_rule(self) -> StopRule:
        """The adaptive stop rule these options describe."""
        return StopRule(self.adaptive, float(self.confidence))


class Vote(CollaborationOp[VoteConfig]):
    """Self-consistency: N voters, majority answer, exact early stop."""

    name = "vote"
    Config = VoteConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("voter", count=5),)

    def validate(self, config: VoteConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        if config.calibrate == "position" and config.answer and config.answer.choices:
            voters = sum(a.count for a in agents if "aggregator" not in (a.role, a.name))
            k = len(config.answer.choices)
            if voters < k:
                raise InvalidCollaboration(
                    "collaboration.calibrate",
                    f"position needs at least as many voters as choices ({k}), got {voters}",
                )

    def max_turns(self, config: VoteConfig, agents: Sequence[AgentSpec]) -> int:
        turns = 2 * sum(a.count for a in agents)  # a reasoning turn and an answer turn each
        return turns + (1 if config.gate is not None else 0)  # the greedy answer below the gate

    async def run(self, ctx: CollaborationContext[VoteConfig]) -> ModeResult:
        config = ctx.config
        style = config.style
        if style == "auto":
            style = (
                "direct" if (config.answer is not None and config.max_tokens <= 32) else "reason"
            )
        voter_specs, aggregator_spec = find_role(ctx.agents, "aggregator")
        if config.soft:
            ctx.require_logprobs("collaboration.soft", "soft votes read logprobs", voter_specs)
        voters = await ctx.spawn_all(voter_specs, role="voter")
        tally = Tally(total_voters=len(voters), choices=ctx.choices)
        rule = config.stop_rule
        views = _views(config, len(voters))
        soft: _Soft | None = None
        answer_tokens = config.answer_tokens
        fallback: dict[str, str] | None = None
        if config.soft:
            soft, views, answer_tokens, fallback = _start_soft(ctx, voters, views)
        decided = False
        stopped_by: str | None = None
        scores: dict[str, float] = {}  # an answer's best answer-step logprob (``logprob``)
        gate = config.gate
        escalate = config.below == "escalate"

        def agreed() -> bool:
            """Whether a gated vote may stop early: its agreement reached the gate."""
            return gate is None or _agreement(tally) >= gate

        async def cast(i: int, window: list[str]) -> None:
            nonlocal decided, stopped_by
            voter, view = voters[i], views[i]
            if soft is not None and soft.measures(i):  # content calibration: before its vote
                soft.priors[soft.keys[i]] = await self._content_prior(ctx, voter, view, soft, i)
            got = await self._vote(
                ctx, voter, style, view, logprobs=soft is not None, answer_tokens=answer_tokens
            )
            if got is None:
                return
            answer_text, first, score = got
            if soft is not None:  # a first token names its choice (answer_tokens: 1)
                answer_text = soft.complete(i, answer_text, first)
            # a vote that lands after the decision is still counted: it cannot change
            # the winner (that is what "decided" means), and it is real output
            answer = (
                await ctx.normalize(answer_text)
                if view is None
                else await _canonical(ctx, view, answer_text)
            )
            voter.record.answer = answer
            if score is not None:
                scores[answer] = max(score, scores.get(answer, score))
            tally.add(answer)
            window.append(answer)
            extra: dict[str, object] = (
                {} if view is None else {"shown": list(view.shown), "raw": answer_text}
            )
            if soft is not None:
                extra["p"] = soft.add(i, answer, first)
            await ctx.emit(
                "vote",
                voter.agent,
                answer=answer,
                votes=tally.as_dict(),
                remaining=tally.remaining,
                **extra,
            )
            settled = tally.decided() if soft is None else soft.decided()
            if config.early_stop and not decided and tally.remaining > 0 and settled and agreed():
                decided = True
                stopped_by = "exact"
                await self._prune_rest(ctx, voters, voter)

        waves = rule.kind != "off" or escalate
        wave = config.wave or (ADAPTIVE_WAVE if waves else len(voters))
        started = 0
        for start in range(0, len(voters), wave):
            window: list[str] = []
            started += 1
            async with anyio.create_task_group() as tg:
                for i in range(start, min(start + wave, len(voters))):
                    tg.start_soon(cast, i, window)
            if decided:
                break
            if tally.remaining > 0 and escalate and agreed():
                decided = True
                stopped_by = "gate"
                await self._prune_rest(ctx, voters, None)
                break
            if tally.remaining > 0 and rule.stops(tally, window) and agreed():
                decided = True
                stopped_by = rule.kind
                await self._prune_rest(ctx, voters, None)
                break
        winner = tally.leader()
        details: dict[str, object] = {"style": style, "samples": tally.cast}
        if escalate:
            details["waves"] = started
        debias = config.debias if fallback is None or fallback["to"] != "labels" else "labels"
        if debias != "off":
            details["debias"] = debias
        if fallback is not None:
            details["soft_fallback"] = fallback
        if config.adaptive != "off":
            details["adaptive"] = config.adaptive
        if stopped_by is not None:
            details["stopped_by"] = stopped_by
        if soft is not None:
            winner = soft.finish(details) or winner
        answer = winner
        if gate is not None:
            agreement = _agreement(tally)
            details["agreement"] = round(agreement, 4)
            details["abstained"] = False
            if agreement < gate:
                details["below_gate"] = "abstain" if config.below == "abstain" else "greedy"
                if config.below == "abstain":
                    details["abstained"] = True
                    return ModeResult(
                        answer=NO_CONFIDENT_ANSWER,
                        early_stopped=decided,
                        votes=tally.as_dict(),
                        details=details,
                    )
                await ctx.emit(
                    "escalate", None, reason=f"agreement {agreement:.3f} below gate {gate}"
                )
                answer, score = await self._greedy(ctx, voter_specs[0])
                if config.logprob:
                    details["answer_logprob"] = score
                return ModeResult(
                    answer=answer, early_stopped=decided, votes=tally.as_dict(), details=details
                )
        if config.logprob:
            details["answer_logprob"] = scores.get(winner)
        if aggregator_spec is not None:
            details["decision"] = winner
            majority = [v for v in voters if v.record.answer == winner]
            answer = await self._summarize(ctx, aggregator_spec, majority, winner)
        return ModeResult(
            answer=answer, early_stopped=decided, votes=tally.as_dict(), details=details
        )

    async def _greedy(
        self, ctx: CollaborationContext[VoteConfig], spec: AgentSpec
    ) -> tuple[str, float | None]:
        """A fresh temperature-0 direct answer of ``spec`` (a one-voter direct vote's
        request) and its answer step's logprob (``logprob``).

        Raises:
            CollaborationFailed: the call produced nothing.
        """
        one = attrs.evolve(spec, count=1, temperature=0.0)
        name = f"{spec.name}-greedy"
        while name in ctx.roles:
            name += "-"
        role = await ctx.spawn(name, one, "greedy")
        view = _views(ctx.config, 1)[0]
        got = await self._vote(ctx, role, "direct", view)
        if got is None:
            raise ctx.failure("the greedy answer below the gate produced nothing")
        text, _, score = got
        answer = await ctx.normalize(text) if view is None else await _canonical(ctx, view, text)
        role.record.answer = answer
        return answer, score

    async def _prune_rest(
        self, ctx: CollaborationContext[VoteConfig], voters: list[Role], voter: Role | None
    ) -> None:
        """Prune every voter without an answer (running ones aborted, later waves never started)."""
        for other in voters:
            if other.record.answer is None and other is not voter:
                await ctx.prune(other, "early_stop")

    async def _summarize(
        self,
        ctx: CollaborationContext[VoteConfig],
        spec: AgentSpec,
        majority: list[Role],
        winner: str,
    ) -> str:
        """The aggregator writes the final text from the majority voters' reasoning.

        It continues the first majority voter's thread (a cached prefix) and gets
        the other majority voters' reasoning spliced as handles.
        """
        aggregator = await ctx.spawn(spec.agent_names()[0], spec, "aggregator")
        chat = aggregator.bridge.chat
        threads = [v.thread for v in majority if v.thread is not None]
        base = chat.close_turn(threads[0]) if threads else None
        parts: list[str | KVHandle] = []
        for voter in majority[1:]:
            if voter.thread is not None and voter.reasoning is not None:
                parts += [f"\nReviewer {voter.agent}: ", voter.reasoning]
        instructions = "\n".join(
            x
            for x in (f"The majority answer is: {winner}.", spec.instructions or SUMMARY_PROMPT)
            if x
        )
        prompt = ctx.prompt(spec, base=base, parts=parts, instructions=instructions)
        done = await ctx.turn(
            aggregator,
            Turn(
                prompt,
                ctx.sampling(spec, temperature=0.0),
                label="aggregate",
                priority=-2,
                keep=False,
            ),
        )
        return done.content or winner

    async def _vote(
        self,
        ctx: CollaborationContext[VoteConfig],
        voter: Role,
        style: str,
        view: ChoiceView | None = None,
        *,
        logprobs: bool = False,
        answer_tokens: int | None = None,
    ) -> tuple[str, TokenLogprob | None, float | None] | None:
        """One voter's answer text, its first answer token's logprobs when asked, and its
        answer step's summed logprob (``logprob``; else None).

        ``answer_tokens``: the constrained answer step's budget (the config's by default).
        """
        config = ctx.config
        spec = voter.spec
        prompt = ctx.prompt(spec, instructions=_instructions(ctx, spec, style, view))
        budget = config.answer_tokens if answer_tokens is None else answer_tokens
        answer_sampling = ctx.sampling(spec, max_tokens=budget, constrained=True)
        if view is not None:
            answer_sampling = attrs.evolve(answer_sampling, choices=view.allowed)
        if logprobs:
            answer_sampling = attrs.evolve(answer_sampling, logprobs=SOFT_TOP_LOGPROBS)
        elif config.logprob and ctx.without_logprobs([spec]) is None:
            answer_sampling = attrs.evolve(answer_sampling, logprobs=0)
        if style == "direct":
            done = await ctx.turn(
                voter,
                Turn(
                    prompt,
                    answer_sampling,
                    label="answer",
                    keep=False,
                ),
            )
            if done.result is None or done.result.finish_reason == "abort":
                return None
            logs = done.result.logprobs
            return done.content, _first(logs), _summed(voter, logs, config.logprob)
        first = await ctx.turn(voter, Turn(prompt, ctx.sampling(spec), label="reason"))
        if first.result is None or first.result.finish_reason == "abort":
            return None
        voter.thread = first.result.handle
        voter.reasoning = first.result.output
        if config.answer is None:
            return first.content, None, _summed(voter, first.result.logprobs, config.logprob)
        # The answer step continues the voter's own handle: its reasoning is a cached prefix.
        chat = voter.bridge.chat
        base = chat.close_turn(first.result.handle)
        if view is not None and view.labels:
            cue = f"Options: {view.listing()}. {ANSWER_CUE} the letter:"
        elif view is not None:
            cue = f"{ANSWER_CUE} one of: {view.listing()}."
        elif config.answer.choices:
            cue = f"{ANSWER_CUE} one of: {', '.join(config.answer.choices)}."
        else:
            cue = ANSWER_CUE + ":"
        prompt2 = ctx.prompt(spec, base=base, instructions=cue)
        second = await ctx.turn(
            voter,
            Turn(
                prompt2,
                answer_sampling,
                label="answer",
                priority=-1,
                keep=False,  # its reasoning stays retained: the aggregator continues it
            ),
        )
        if second.result is None or second.result.finish_reason == "abort":
            return None
        voter.record.output = f"{first.content}\n{ANSWER_CUE}: {second.content}"
        logs = second.result.logprobs
        return second.content, _first(logs), _summed(voter, logs, config.logprob)

    async def _content_prior(
        self,
        ctx: CollaborationContext[VoteConfig],
        voter: Role,
        view: ChoiceView | None,
        soft: _Soft,
        i: int,
    ) -> tuple[float, ...] | None:
        """The model's distribution over voter ``i``'s shown choices for a content-free question.

        The context's system turns are kept and the conversation replaced by one user
        turn, ``CONTENT_FREE``; the instructions and listing are the voter's own.
        """
        spec = voter.spec
        bridge = ctx.bridge_for(spec)
        system = [m for m in ctx.messages if m.get("role") == "system"]
        base = bridge.chat.context([*system, {"role": "user", "content": CONTENT_FREE}])
        prompt = ctx.prompt(spec, base=base, instructions=_instructions(ctx, spec, "direct", view))
        sampling = ctx.sampling(spec, max_tokens=1, constrained=True)
        if view is not None:
            sampling = attrs.evolve(sampling, choices=view.allowed)
        sampling = attrs.evolve(sampling, logprobs=SOFT_TOP_LOGPROBS)
        done = await ctx.turn(voter, Turn(prompt, sampling, label="calibrate", keep=False))
        if done.result is None or done.result.finish_reason == "abort":
            return None
        ballot = read_ballot(_first(done.result.logprobs), soft.tokens[i], soft.order(i), None)
        return None if ballot is None else ballot.probs


def _instructions(
    ctx: CollaborationContext[VoteConfig], spec: AgentSpec, style: str, view: ChoiceView | None
) -> str:
    """A voter's instructions: its own or the default, then its listing when debiased."""
    instructions = spec.instructions or _default_instructions(ctx, style)
    if view is not None:  # a debiased voter always sees its own listing of the choices
        own = _view_instructions(view, style)
        instructions = f"{spec.instructions}\n{own}" if spec.instructions else own
    return instructions


def _agreement(tally: Tally) -> float:
    """The leader's share of the votes cast (0 when none was)."""
    lead = tally.leader()
    return tally.counts[lead] / tally.cast if lead and tally.cast else 0.0


def answer_logprob(bridge: EngineBridge, logprobs: Sequence[TokenLogprob]) -> float | None:
    """The summed log-probability of an answer's tokens (the end-of-turn token left out,
    as it is left out of the text); None when the engine reported none."""
    eot = bridge.chat.template.eot_token_id
    kept = [t.logprob for t in logprobs if t.token_id != eot]
    return round(sum(kept), 6) if kept else None


def _summed(voter: Role, logprobs: tuple[TokenLogprob, ...] | None, asked: bool) -> float | None:
    return answer_logprob(voter.bridge, logprobs) if asked and logprobs else None


def _first(logprobs: tuple[TokenLogprob, ...] | None) -> TokenLogprob | None:
    return logprobs[0] if logprobs else None


@attrs.define
class _Soft:
    """A soft vote's state: each voter's first tokens and ballot, the running sums."""

    choices: tuple[str, ...]
    calibrate: str
    views: list[ChoiceView | None]
    tokens: list[tuple[int, ...]]
    ballots: list[SoftBallot | None]
    tally: SoftTally
    #: each voter's listing (model, shown choices): voters that share one share a prior
    keys: list[tuple[str, tuple[str, ...]]]
    #: ``content``: the content-free distribution per listing (None: not measured)
    priors: dict[tuple[str, tuple[str, ...]], tuple[float, ...] | None]

    @classmethod
    def start(
        cls,
        ctx: CollaborationContext[VoteConfig],
        voters: list[Role],
        views: list[ChoiceView | None],
    ) -> _Soft:
        """The state for these voters; the first-token rule is checked on each voter's model.

        Raises:
            SharedFirstToken: two allowed answers share their first token (``_start_soft``
                falls back).
        """
        choices = ctx.choices
        assert choices is not None  # VoteConfig checks it
        tokens: list[tuple[int, ...]] = []
        keys: list[tuple[str, tuple[str, ...]]] = []
        cache: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = {}
        for voter, view in zip(voters, views, strict=True):
            allowed = view.allowed if view is not None else choices
            shown = view.shown if view is not None else choices
            keys.append((voter.bridge.model, shown))
            key = (voter.bridge.model, allowed)
            if key not in cache:
                cache[key] = first_tokens(allowed, voter.bridge.tokenize)
            tokens.append(cache[key])
        n = len(voters)
        return cls(
            choices=choices,
            calibrate=ctx.config.calibrate,
            views=views,
            tokens=tokens,
            ballots=[None] * n,
            tally=SoftTally(total_voters=n, choices=choices),
            keys=keys,
            priors={},
        )

    def measures(self, i: int) -> bool:
        """Whether voter ``i`` measures its listing's content-free prior (the first voter of
        each listing, under ``content`` only)."""
        return self.calibrate == "content" and self.keys.index(self.keys[i]) == i

    def complete(self, i: int, text: str, first: TokenLogprob | None) -> str:
        """Voter ``i``'s answer: ``text``, or the allowed answer its first token starts
        when ``text`` is a cut-off prefix (the first tokens are pairwise different)."""
        view = self.views[i]
        allowed = view.allowed if view is not None else self.choices
        if text in allowed or first is None or first.token_id not in self.tokens[i]:
            return text
        return allowed[self.tokens[i].index(first.token_id)]

    def order(self, i: int) -> tuple[int, ...]:
        """Voter ``i``'s permutation of the canonical choices."""
        view = self.views[i]
        return view.order if view is not None else tuple(range(len(self.choices)))

    def add(self, i: int, answer: str, first: TokenLogprob | None) -> dict[str, float]:
        """Record voter ``i``'s ballot; return its canonical distribution (for the event)."""
        view = self.views[i]
        shown = view.shown if view is not None else self.choices
        sampled = shown.index(answer) if answer in shown else None
        ballot = read_ballot(first, self.tokens[i], self.order(i), sampled)
        self.ballots[i] = ballot
        probs = () if ballot is None else ballot.canonical()
        self.tally.add(probs)
        return rounded(dict(zip(self.choices, probs, strict=False)))

    def decided(self) -> bool:
        """The exact early stop on the sums (never when calibrated: that needs every ballot)."""
        return self.calibrate == "off" and self.tally.decided()

    def finish(self, details: dict[str, object]) -> str:
        """The soft winner under the calibration; its distribution goes into ``details``."""
        priors = [self.priors.get(key) for key in self.keys]
        used, prior = calibrate(self.ballots, len(self.choices), self.calibrate, priors)
        final = SoftTally(total_voters=len(used), choices=self.choices)
        for ballot in used:
            final.add(() if ballot is None else ballot.canonical())
        cast = [b for b in self.ballots if b is not None]
        details["soft"] = {
            "calibrate": self.calibrate,
            "distribution": rounded(final.distribution()),
            "sums": rounded(final.sums),
            "position_prior": None if prior is None else [round(q, 4) for q in prior],
            "content_priors": [
                {"shown": list(key[1]), "p": None if q is None else [round(x, 4) for x in q]}
                for key, q in self.priors.items()
            ],
            "mean_mass": round(sum(b.mass for b in cast) / len(cast), 4) if cast else 0.0,
            "fallbacks": sum(b.fallback for b in cast),
        }
        details["ballots"] = [
            {
                "voter": i,
                "shown": list(view.shown if view is not None else self.choices),
                "p": [round(p, 4) for p in b.probs],
                "mass": round(b.mass, 4),
            }
            for i, (b, view) in enumerate(zip(self.ballots, self.views, strict=True))
            if b is not None
        ]
        return final.leader()


def _start_soft(
    ctx: CollaborationContext[VoteConfig], voters: list[Role], views: list[ChoiceView | None]
) -> tuple[_Soft | None, list[ChoiceView | None], int, dict[str, str] | None]:
    """A soft vote's state, its voters' views and answer budget, and the fallback taken.

    A valid question is never refused: when two allowed answers share their first
    token (``"12"`` and ``"14"`` on a digit-wise tokenizer) the first-token rule
    cannot score them, so the vote letters the options (``debias: labels``: each
    voter in its own order, answering with one letter, which the rule scores
    exactly). More choices than letters: a hard vote over the texts, with an
    answer budget that fits the longest choice. The fallback is returned for
    ``details["soft_fallback"]``: ``{"to": "labels" | "hard", "why": ...}``.
    """
    budget = ctx.config.answer_tokens
    try:
        return _Soft.start(ctx, voters, views), views, budget, None
    except SharedFirstToken as exc:
        why = str(exc)
    choices = ctx.choices
    assert choices is not None  # VoteConfig checks it for soft votes
    if len(choices) <= len(LABELS):
        lettered: list[ChoiceView | None] = [
            ChoiceView.for_voter(choices, i, labels=True) for i in range(len(voters))
        ]
        with contextlib.suppress(SharedFirstToken):  # letters share a token: a hard vote
            soft = _Soft.start(ctx, voters, lettered)
            return soft, lettered, budget, {"to": "labels", "why": why}
    longest = max(len(v.bridge.tokenize(c)) for v in voters for c in choices)
    return None, views, max(budget, longest), {"to": "hard", "why": why}


SUMMARY_PROMPT = "Write the final answer for the user, using the reviewers' reasoning. Be concise."


def direct_instructions(choices: Sequence[str] | None) -> str:
    """What a direct voter is told: name one of ``choices``, or answer concisely."""
    if choices:
        return f"Answer with exactly one of: {', '.join(choices)}."
    return "Answer concisely."


def _default_instructions(ctx: CollaborationContext[VoteConfig], style: str) -> str:
    answer = ctx.config.answer
    if style == "direct":
        return direct_instructions(answer.choices if answer is not None else None)
    if answer is not None and answer.choices:
        options = ", ".join(answer.choices)
        return f"Think step by step, briefly, then give your answer (one of: {options})."
    return "Think step by step, briefly. End with a line 'Answer: <your answer>'."


def _views(config: VoteConfig, n: int) -> list[ChoiceView | None]:
    """Each voter's view of the choices (None for all when not debiased)."""
    if config.debias == "off" or config.answer is None or not config.answer.choices:
        return [None] * n
    labels = config.debias == "labels"
    return [ChoiceView.for_voter(config.answer.choices, i, labels=labels) for i in range(n)]


async def _canonical(ctx: CollaborationContext[VoteConfig], view: ChoiceView, text: str) -> str:
    """A debiased voter's answer as the canonical choice ("" when it names none)."""
    return view.to_canonical(text if view.labels else await ctx.normalize(text))


def _view_instructions(view: ChoiceView, style: str) -> str:
    if view.labels:
        if style == "direct":
            return f"Options: {view.listing()}. Answer with the letter of the correct option."
        return (
            f"Options: {view.listing()}. Think step by step, briefly, then give the letter "
            "of the correct option."
        )
    if style == "direct":
        return f"Answer with exactly one of: {view.listing()}."
    return f"Think step by step, briefly, then give your answer (one of: {view.listing()})."
