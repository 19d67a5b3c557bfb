"""compute: program-aided answers: agents write arithmetic, the calculator evaluates it.

A small model cannot do arithmetic reliably, but it can copy a question's
numbers into an expression (program-aided language models, Gao et al. 2022,
arXiv 2211.10435). Each agent writes one expression, constrained to the
calculator's language (``EXPRESSION_REGEX``; a remote chat model, which takes
no regex, is asked for it and its reply's first line is read); the built-in sandboxed
calculator (``_calculator``) evaluates it; the values are voted, ties going
to the agent listed first (so a greedy first agent decides unless the others
agree on another value: self-consistency over programs). With
``answer.choices`` a value counts for the choice that states it (``"85"``,
``"85.0"``); a value that states no choice abstains.

Where there is nothing to compute (``calls_for_calculation``: no number in
the question, or choices that are not all numbers) or no expression gives a
usable value, the first agent answers directly at temperature 0, exactly as
a greedy single call (``vote``'s direct instructions, held to the choices);
``details.path`` says which happened and why. So the mode never does worse
than greedy where the calculator cannot help, and never refuses a question.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import attrs

from .._agent import Role, Turn
from .._arith import MAX_EXPRESSION_CHARS
from .._calculator import (
    CALCULATOR,
    EXPRESSION_REGEX,
    CalculationError,
    calculate_value,
    format_value,
)
from .._code_policy import require_code
from .._config import ModeConfig, boolean, int_in, not_none
from .._context import CollaborationContext
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import majority
from ._vote import direct_instructions

EXPRESSION_INSTRUCTIONS = (
    "Do not answer in words. Write only one arithmetic expression whose value is the "
    "answer, such as a * b + c or max(a, b), with the question's numbers in place of "
    "the letters."
)
#: a number in text: digits, an optional decimal part (a thousands comma is not one)
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
#: words that ask for a calculation on one number (a conversion, a fraction)
CUES = re.compile(
    r"\b(?:plus|minus|times|multipl\w*|divid\w*|sum|total|difference|product|percent|"
    r"convert\w*|how many|how much|twice|double|half|triple|per|average|remain\w*|left)\b|"
    r"[-+*/×÷%]",
    re.IGNORECASE,
)


@attrs.frozen(kw_only=True)
class ComputeConfig(ModeConfig):
    """compute options.

    Attributes:
        expression_tokens: budget of each expression turn.
        fallback: answer directly (greedy) when nothing can be computed; off: fail instead.
    """

    expression_tokens: int = attrs.field(default=48, validator=[not_none, int_in(4, 256)])
    fallback: bool = attrs.field(default=True, validator=boolean)


def _is_number(text: str) -> bool:
    return NUMBER.fullmatch(text.strip().replace(",", "")) is not None


def calls_for_calculation(question: str, choices: Sequence[str] | None) -> bool:
    """Whether ``question`` asks for a number the calculator can compute.

    With choices: every choice is a number and the question states one. Without:
    the question states two numbers, or one and a calculation word (``CUES``).
    """
    found = len(NUMBER.findall(question))
    if choices:
        return found >= 1 and all(_is_number(c) for c in choices)
    return found >= 2 or (found == 1 and CUES.search(question) is not None)


def choice_for(value: float, choices: Sequence[str]) -> str:
    """The choice that states ``value`` ("" when none does; a bool states none)."""
    for choice in choices:
        text = choice.strip().replace(",", "")
        if _is_number(text) and math.isclose(float(text), value, rel_tol=1e-9, abs_tol=1e-9):
            return choice
    return ""


class Compute(CollaborationOp[ComputeConfig]):
    """Agents write arithmetic, the sandboxed calculator evaluates it, the values are voted."""

    name = "compute"
    Config = ComputeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("solver", temperature=0.0),)

    def validate(self, config: ComputeConfig, agents: Sequence[AgentSpec]) -> None:
        super().validate(config, agents)
        require_code("calculator", "collaboration.mode")

    def max_turns(self, config: ComputeConfig, agents: Sequence[AgentSpec]) -> int:
        return sum(a.count for a in agents) + 1  # one expression each, one direct answer

    async def run(self, ctx: CollaborationContext[ComputeConfig]) -> ModeResult:
        choices = ctx.choices
        question = ctx.question
        roles = await ctx.spawn_all(role="solver")
        if not calls_for_calculation(question, choices):
            why = (
                "the choices are not all numbers"
                if choices and not all(_is_number(c) for c in choices)
                else "the question states no number to compute with"
            )
            return await self._direct(ctx, roles[0], {"path": "direct", "why": why})
        found: list[dict[str, Any]] = [{} for _ in roles]
        async with anyio.create_task_group() as tg:
            for i, role in enumerate(roles):
                tg.start_soon(self._solve, ctx, role, found, i)
        answers = [entry.get("answer", "") for entry in found]
        votes: dict[str, int] = {}
        for left, (role, answer) in enumerate(zip(roles, answers, strict=True), 1):
            role.record.answer = answer
            if answer:
                votes[answer] = votes.get(answer, 0) + 1
            await ctx.emit(
                "vote", role.agent, answer=answer, votes=dict(votes), remaining=len(roles) - left
            )
        details: dict[str, Any] = {"expressions": found}
        winner = majority([a for a in answers if a], None)
        if winner:
            return ModeResult(answer=winner, votes=votes, details={**details, "path": "computed"})
        why = (
            "no expression's value states one of the choices"
            if choices and any("value" in entry for entry in found)
            else "no expression could be evaluated"
        )
        if not ctx.config.fallback:
            raise ctx.failure(why)
        return await self._direct(ctx, roles[0], {**details, "path": "direct", "why": why})

    async def _solve(
        self,
        ctx: CollaborationContext[ComputeConfig],
        role: Role,
        found: list[dict[str, Any]],
        i: int,
    ) -> None:
        """One agent's expression, its value and the answer it states (into ``found[i]``)."""
        spec = role.spec
        # the role's own instructions (a persona), then what to write
        instructions = " ".join(filter(None, (spec.instructions, EXPRESSION_INSTRUCTIONS)))
        prompt = ctx.prompt(spec, instructions=instructions)
        sampling = attrs.evolve(
            ctx.sampling(spec, max_tokens=ctx.config.expression_tokens),
            # a remote chat model takes no regex: its reply's first line, code marks dropped
            regex=None if role.bridge.remote else EXPRESSION_REGEX,
        )
        done = await ctx.turn(role, Turn(prompt, sampling, label="expression", keep=False))
        lines = done.content.strip().strip("`").strip().splitlines()
        expression = (lines[0].strip() if lines else "")[:MAX_EXPRESSION_CHARS]
        entry: dict[str, Any] = found[i]
        entry.update(agent=role.agent, expression=expression)
        if done.result is None or not expression:
            entry["error"] = "no expression"
            return
        arguments = json.dumps({"expression": expression})
        await ctx.emit(
            "tool_call", role.agent, label="expression", name=CALCULATOR, arguments=arguments
        )
        start = anyio.current_time()
        try:
            value = await calculate_value(expression)
        except CalculationError as exc:
            entry["error"] = str(exc)
        else:
            entry["value"] = value
            if isinstance(value, bool):
                entry["answer"] = ""  # a comparison states no number
            elif ctx.choices:
                entry["answer"] = choice_for(value, ctx.choices)
            else:
                entry["answer"] = format_value(value)
        await ctx.emit(
            "tool_result",
            role.agent,
            label="expression",
            name=CALCULATOR,
            ok="value" in entry,
            output=str(entry.get("value", entry.get("error", ""))),
            duration=anyio.current_time() - start,
        )

    async def _direct(
        self, ctx: CollaborationContext[ComputeConfig], role: Role, details: dict[str, Any]
    ) -> ModeResult:
        """The first agent's direct answer at temperature 0: a greedy single call."""
        choices = ctx.choices
        spec = role.spec
        prompt = ctx.prompt(spec, instructions=direct_instructions(choices) if choices else "")
        budget = None  # a free answer: the agent's or the collaboration's max_tokens
        if choices:  # vote's answer step: 16 tokens, or what the longest choice needs
            budget = max(16, *(len(role.bridge.tokenize(c)) + 1 for c in choices))
        sampling = ctx.sampling(spec, max_tokens=budget, temperature=0.0, constrained=True)
        done = await ctx.turn(role, Turn(prompt, sampling, label="answer", keep=False))
        if done.result is None:
            raise ctx.failure("the agent produced nothing")
        answer = await ctx.normalize(done.content) if choices else done.content
        role.record.answer = answer
        return ModeResult(answer=answer, details=details)
