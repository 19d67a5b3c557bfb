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

With ``steps`` > 1 each agent writes a short program instead, one named step a
turn (``price = 3 * 4``, then ``total = price + 5``), each turn held to
``STEP_REGEX`` (the last allowed one to ``ANSWER_STEP_REGEX``: ``answer = …``).
Each step is checked (``_arith.check_step``: a new name, an expression of the
language reading only earlier names) and the program so far is evaluated in a
fresh sandbox (``calculate_program``), and the step's value is shown to the
next turn (``price = 3 * 4  # = 12``). The program ends at ``answer = …`` or at
the bound, or at a step refused or failing (its error recorded); its last good
step's value is the agent's.

With ``verify`` (the default) an agent's expression or program must use only
numbers the question states (``_grounding``: digits or number words, or a
small constant such as 60 or 100): one that invents a number is rejected
(``details`` say which numbers) and counts as no value.

Where there is nothing to compute (``calls_for_calculation``: no number in
the question, or choices that are not all numbers; an ordinal such as "3rd"
is a position, not a quantity) or no expression gives a usable value, the
first agent answers directly at temperature 0, as greedy's single call
(:meth:`Compute._direct`); ``details.path`` says which happened and why. So the
mode never does worse than greedy where the calculator cannot help, and never
refuses a question.

Why compute lost to greedy on free answers (issue 40: 0.417 against 0.475,
7 items lost, 0 won), read from the code, not measured:

1. The direct path is now exactly the greedy call ``microagent eval`` compares
   against: with choices ``vote`` (``style: direct``, one voter: its
   instructions, 16-token budget and normalised answer; the old path gave a
   larger budget and ignored a persona's instructions), on a free answer the
   plain call (``auto``, one agent: no instructions, the reply as written).
   A ScriptedEngine test holds both requests equal. Against a ``vote``-direct
   greedy ("Answer concisely.", a normalised reply) the free path differs by
   design: the plain call is the baseline a user has.
2. The expression path takes every free question with two numbers, or one
   and a cue word ("What is 7 times 8?", single-digit products), even where
   greedy is already right, so there it can only lose: a wrong expression,
   or a value where a word was wanted. ``verify`` sends a program that
   invents a number back to greedy's call, but a wrong use of stated numbers
   or of a small constant (``6 * 2 + 10``) passes it.
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
from .._arith import MAX_EXPRESSION_CHARS, MAX_NAME_CHARS, MAX_STEPS
from .._calculator import (
    ANSWER_STEP_REGEX,
    CALCULATOR,
    EXPRESSION_REGEX,
    STEP_REGEX,
    CalculationError,
    calculate_program,
    calculate_value,
    format_value,
)
from .._code_policy import require_code
from .._config import ModeConfig, boolean, int_in, not_none
from .._context import CollaborationContext
from .._grounding import grounded_expression_regex, grounding_failure
from .._mode import CollaborationOp, ModeResult
from .._spec import AgentSpec
from .._tally import majority
from ._vote import VoteConfig, direct_instructions

EXPRESSION_INSTRUCTIONS = (
    "Do not answer in words. Write only one arithmetic expression whose value is the "
    "answer, such as a * b + c or max(a, b), with the question's numbers in place of "
    "the letters."
)
STEP_INSTRUCTIONS = (
    "Do not answer in words. Solve the question with a short program of named steps, "
    "one step per line, such as cost = a * b and then total = cost + c, with the "
    "question's numbers in place of the letters; each step names a new value and may use "
    "the earlier names. The last step is answer = ..."
)
#: the budget of greedy's constrained answer step (``vote``'s default ``answer_tokens``)
GREEDY_ANSWER_TOKENS: int = VoteConfig().answer_tokens
#: a number in text: digits, an optional decimal part (a thousands comma is not one)
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
#: a quantity in a question: a number that is not an ordinal ("3rd" names a position)
QUANTITY = re.compile(NUMBER.pattern + r"(?!(?:st|nd|rd|th)\b)")
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
        expression_tokens: budget of each expression (or program step) turn.
        steps: 1: one expression per agent; more: a program of at most this many
            named steps, one per turn, each evaluated in the sandbox.
        verify: reject an expression or program that uses a number the question
            does not state (``_grounding``); it counts as no value.
        fallback: answer directly (greedy) when nothing can be computed; off: fail instead.
    """

    expression_tokens: int = attrs.field(default=48, validator=[not_none, int_in(4, 256)])
    steps: int = attrs.field(default=1, validator=[not_none, int_in(1, MAX_STEPS)])
    verify: bool = attrs.field(default=True, validator=boolean)
    fallback: bool = attrs.field(default=True, validator=boolean)


def _is_number(text: str) -> bool:
    return NUMBER.fullmatch(text.strip().replace(",", "")) is not None


def _closed(step: str) -> str:
    """``step`` without the unmatched closing parentheses it ends with (a regex cannot count
    them: a small model pads a step with ``)))``); nothing else is changed."""
    while step.count(")") > step.count("(") and step.endswith(")"):
        step = step[:-1].rstrip()
    return step


def calls_for_calculation(question: str, choices: Sequence[str] | None) -> bool:
    """Whether ``question`` asks for a number the calculator can compute.

    With choices: every choice is a number and the question states one. Without:
    the question states two numbers, or one and a calculation word (``CUES``).
    An ordinal ("the 3rd letter") states no quantity.
    """
    found = len(QUANTITY.findall(question))
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
        # one expression (or program step) each per step, one direct answer
        return sum(a.count for a in agents) * config.steps + 1

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
                solve = self._solve if ctx.config.steps == 1 else self._solve_steps
                tg.start_soon(solve, ctx, role, found, i)
        answers = [entry.get("answer", "") for entry in found]
        votes: dict[str, int] = {}
        for left, (role, answer) in enumerate(zip(roles, answers, strict=True), 1):
            role.record.answer = answer
            if answer:
                votes[answer] = votes.get(answer, 0) + 1
            await ctx.emit(
                "vote", role.agent, answer=answer, votes=dict(votes), remaining=len(roles) - left
            )
        details: dict[str, Any] = {"expressions" if ctx.config.steps == 1 else "programs": found}
        winner = majority([a for a in answers if a], None)
        if winner:
            return ModeResult(answer=winner, votes=votes, details={**details, "path": "computed"})
        if any("rejected" in entry for entry in found) and not any(
            entry.get("answer") for entry in found
        ):
            why = "no program uses only numbers the question states"
        elif choices and any("value" in entry for entry in found):
            why = "no expression's value states one of the choices"
        else:
            why = "no expression could be evaluated"
        if not ctx.config.fallback:
            raise ctx.failure(why)
        return await self._direct(ctx, roles[0], {**details, "path": "direct", "why": why})

    @staticmethod
    def _expression_regex(ctx: CollaborationContext[ComputeConfig]) -> str:
        """The expression turn's language: with ``verify``, only the question's numbers
        (``grounded_expression_regex``), else the calculator's whole language."""
        if ctx.config.verify:
            grounded = grounded_expression_regex(ctx.question)
            if grounded is not None:
                return grounded
        return EXPRESSION_REGEX

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
            # with verify, held to the question's own numbers (the check, at decode time)
            regex=None if role.bridge.remote else self._expression_regex(ctx),
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
            self._settle(ctx, entry, [expression])
        await ctx.emit(
            "tool_result",
            role.agent,
            label="expression",
            name=CALCULATOR,
            ok="value" in entry,
            output=str(entry.get("value", entry.get("error", ""))),
            duration=anyio.current_time() - start,
        )

    def _settle(
        self, ctx: CollaborationContext[ComputeConfig], entry: dict[str, Any], program: list[str]
    ) -> None:
        """``entry``'s answer from its value, unless the check rejects its numbers."""
        value = entry["value"]
        derived = [s["value"] for s in entry.get("steps", ()) if "value" in s]
        verify = ctx.config.verify
        rejected = grounding_failure(ctx.question, program, derived) if verify else None
        if rejected is not None:
            entry["rejected"] = rejected
            entry["answer"] = ""
        elif isinstance(value, bool):
            entry["answer"] = ""  # a comparison states no number
        elif ctx.choices:
            entry["answer"] = choice_for(value, ctx.choices)
        else:
            entry["answer"] = format_value(value)

    async def _solve_steps(
        self,
        ctx: CollaborationContext[ComputeConfig],
        role: Role,
        found: list[dict[str, Any]],
        i: int,
    ) -> None:
        """One agent's program, a step a turn, each evaluated in the sandbox (into ``found[i]``).

        One sandbox call per step, evaluating the program so far: a fresh sandbox
        keeps no state between calls, and the step's value must reach the next turn
        before the model writes it; re-evaluating the earlier steps is cheap. A step
        that is refused or fails ends the program (its error recorded, the step never
        run): the value is the last good step's, none when the first step fails.
        """
        spec = role.spec
        bound = ctx.config.steps
        steps: list[str] = []
        shown: list[str] = []  # the program as the next turn sees it, each value written
        entry: dict[str, Any] = found[i]
        entry.update(agent=role.agent, steps=[])
        instructions = " ".join(filter(None, (spec.instructions, STEP_INSTRUCTIONS)))
        remote = role.bridge.remote
        for k in range(bound):
            last = k == bound - 1
            sampling = attrs.evolve(
                ctx.sampling(spec, max_tokens=ctx.config.expression_tokens),
                regex=None if remote else (ANSWER_STEP_REGEX if last else STEP_REGEX),
            )
            if remote:  # a chat model's reply cannot be continued: the steps go in its question
                seen = "\n".join(["Steps so far:", *shown, "Write only the next step."])
                prompt = ctx.prompt(
                    spec, instructions=f"{instructions}\n{seen}" if shown else instructions
                )
            else:  # the program so far, values written, opens the agent's own reply
                prompt = ctx.prompt(spec, instructions=instructions)
                if shown:
                    prompt = role.bridge.chat.continue_with(prompt, "\n".join(shown) + "\n")
            done = await ctx.turn(role, Turn(prompt, sampling, label="step", keep=False))
            lines = done.content.strip().strip("`").strip().splitlines()
            step = _closed(
                (lines[0].strip() if lines else "")[: MAX_NAME_CHARS + 3 + MAX_EXPRESSION_CHARS]
            )
            if done.result is None or not step:
                entry["error"] = f"step {k + 1}: no step written"
                break
            program = [*steps, step]
            await ctx.emit(
                "tool_call",
                role.agent,
                label="step",
                name=CALCULATOR,
                arguments=json.dumps({"steps": program}),
            )
            start = anyio.current_time()
            try:
                values = await calculate_program(program)
            except CalculationError as exc:
                entry["steps"].append({"step": step, "seen": list(shown)})
                entry["error"] = str(exc)
                values = []
            else:
                entry["steps"].append({"step": step, "value": values[-1], "seen": list(shown)})
            await ctx.emit(
                "tool_result",
                role.agent,
                label="step",
                name=CALCULATOR,
                ok=bool(values),
                output=str(values[-1] if values else entry.get("error", "")),
                duration=anyio.current_time() - start,
            )
            if not values:
                break
            steps = program
            shown.append(f"{step}  # = {format_value(values[-1])}")
            if step.partition("=")[0].strip() == "answer":
                break
        if not steps:  # not one step ran: no value
            return
        entry["value"] = next(s["value"] for s in reversed(entry["steps"]) if "value" in s)
        self._settle(ctx, entry, steps)

    async def _direct(
        self, ctx: CollaborationContext[ComputeConfig], role: Role, details: dict[str, Any]
    ) -> ModeResult:
        """Greedy's single call, byte for byte, as ``microagent eval`` sends greedy.

        With choices: ``vote`` with ``style: direct`` and one voter (the agent's own
        instructions, else ``direct_instructions``; held to the choices within
        ``GREEDY_ANSWER_TOKENS``; the normalised answer). A free answer: the plain call
        (``auto`` with one agent at temperature 0: the agent's own prompt, the request's
        ``max_tokens``, the reply as written). Instructions a plain call does not send
        ("Answer concisely.") change a small model's answers, so greedy's right answers
        would not survive the fallback.
        """
        choices = ctx.choices
        spec = role.spec
        if not choices:
            sampling = ctx.sampling(spec, temperature=0.0)
            done = await ctx.turn(
                role, Turn(ctx.prompt(spec), sampling, label="answer", keep=False)
            )
            if done.result is None:
                raise ctx.failure("the agent produced nothing")
            role.record.answer = done.content
            return ModeResult(answer=done.content, details=details)
        prompt = ctx.prompt(spec, instructions=spec.instructions or direct_instructions(choices))
        sampling = ctx.sampling(
            spec, max_tokens=GREEDY_ANSWER_TOKENS, temperature=0.0, constrained=True
        )
        done = await ctx.turn(role, Turn(prompt, sampling, label="answer", keep=False))
        if done.result is None:
            raise ctx.failure("the agent produced nothing")
        answer = await ctx.normalize(done.content)
        role.record.answer = answer
        return ModeResult(answer=answer, details=details)
