"""The workload floor: the prefill a collaboration needs, from the workload alone.

Issue 12, "Prefill at the workload floor": the shared context once, each
generated message once, each role's own instruction once, each in whole
128-token blocks, plus the one last token vLLM recomputes per request. It is
computed from what the workload *is* (the context and instruction texts as
the model's chat template renders them, the messages the run generated, how
many requests it made), never from the token ids a system sent, so every
system of a run is measured against the same yardstick.

Choices the definition leaves open, fixed here:

- the context is the shared messages as rendered (the template's default
  system turn included), an instruction is its user turn plus the header that
  opens the reply; a role without an instruction of its own (aggregate's
  proposers answer the context itself) adds nothing;
- an instruction shared by several agents of one role (n voters, 3 debaters)
  counts once: the same text at the same place is one prefix;
- a message counts when a later request reads it (a voter's reasoning read by
  its answer step, round-1 answers read in round 2, proposals read by the
  aggregator, every turn of a reflect thread but the last); a constrained
  answer nobody reads needs no prefill.

Rounding every item up to whole blocks makes the floor generous for short
items: a system can compute less than the floor (ratio below 1) when its
partial-block recomputes cost less than the rounding gives away.

Standard library only (the peers' environment imports the bench's pure
modules); the token counts come from any tokenizer with ``apply_chat_template``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import _collab_prompts as P
from _collab_tasks import BLOCK, ceil_blocks

Message = dict[str, Any]


def workload_floor(
    context: int,
    messages: Sequence[int],
    instructions: Sequence[int],
    requests: int,
    block: int = BLOCK,
) -> int:
    """Prompt tokens the workload needs at least: every item in whole blocks, +1 per request.

    Args:
        context: tokens of the shared context.
        messages: tokens of each generated message that a later request reads.
        instructions: tokens of each role's own instruction (each distinct one once).
        requests: engine requests of the run (vLLM recomputes each prompt's last token).
        block: the KV block size.
    """
    items = [context, *messages, *instructions]
    return sum(ceil_blocks(n, block) for n in items if n > 0) + requests


def voters_started(answers: Sequence[str], requests: int, n: int, wave: int) -> int:
    """How many voters of a reason-then-answer vote started (made their reasoning request).

    All at once (``wave`` 0) every voter starts. In waves, a wave is started
    whole; the count is the first whole number of waves that reaches the last
    voter with an answer and leaves between (answers given) and (voters
    started) answer steps in ``requests``.

    Raises:
        ValueError: when no count of waves fits the run's numbers.
    """
    if wave <= 0:
        return n
    answered = [i for i, a in enumerate(answers) if a]
    last = answered[-1] + 1 if answered else 0
    for started in range(max(wave, math.ceil(last / wave) * wave), n + wave, wave):
        started = min(started, n)
        steps = requests - started
        if len(answered) <= steps <= started:
            return started
    raise ValueError(f"no wave count fits {requests} requests and answers {list(answers)}")


def plan(
    workload: Mapping[str, Any], requests: int, started: int | None = None
) -> tuple[list[str], int]:
    """(the instruction steps that ran, how many messages later requests read) of one run.

    ``started`` is the number of voters that made their first request (only
    for reason-then-answer votes; every voter when omitted).
    """
    kind = workload["kind"]
    if kind == "vote":
        if workload["style"] == "direct":
            return ["vote"], 0
        reasoned = workload["n"] if started is None else started
        answer_steps = max(0, requests - reasoned)
        return (["vote", "answer_cue"] if answer_steps else ["vote"]), answer_steps
    if kind == "debate":
        agents = workload["agents"]
        later = max(0, requests - agents)  # requests after round 1 (rounds >= 2)
        read = min(later, agents * (workload["rounds"] - 1))  # every round but the last
        if not later:
            return ["debate_first"], read
        # a result file without a layout predates the transcript: its debates ran threads
        if P.debate_layout(agents, workload.get("layout", "threads")) == "transcript":
            return ["debate_first", *(f"debate_own:{n}" for n in debater_names(agents))], read
        return ["debate_first", "debate_next"], read
    if kind == "aggregate":
        proposals = min(requests, workload["proposers"])
        aggregated = requests > workload["proposers"]
        return (["aggregate"] if aggregated else []), proposals if aggregated else 0
    if kind == "reflect":
        steps = ["reflect_draft", "reflect_critic", "reflect_revise"][: min(requests, 3)]
        return steps, max(0, requests - 1)
    raise ValueError(f"unknown workload kind {kind!r}")


def debater_names(agents: int) -> list[str]:
    """The names microagent gives a debate's agents (``AgentSpec("debater", count=n)``)."""
    return [f"debater-{i}" for i in range(1, agents + 1)]


def instruction_texts(workload: Mapping[str, Any], choices: Sequence[str]) -> dict[str, str]:
    """The text of each instruction step :func:`plan` names, as the roles send them.

    A transcript-layout debate's own turn names its agent, so each agent's is its own.
    """
    own = {
        f"debate_own:{n}": "\n" + P.TRANSCRIPT_PROMPT.format(agent=n)
        for n in debater_names(workload.get("agents", 0))
    }
    return own | {
        "vote": P.vote_instructions(list(choices), workload.get("style", "direct")),
        "answer_cue": P.answer_cue(list(choices)),
        "debate_first": P.FIRST_PROMPT,
        "debate_next": P.DEBATE_PROMPT,
        "aggregate": P.AGGREGATE_PROMPT,
        "reflect_draft": P.FIRST_PROMPT,
        # the validator's format message (its other one also fits one block)
        "reflect_critic": (
            "A validator rejected the answer: the last line must be 'Answer: <your answer>'\n"
            + P.CRITIC_PROMPT
        ),
        "reflect_revise": P.REVISE_PROMPT,
    }


class TurnCounter:
    """Token counts of chat pieces as a tokenizer's chat template renders them.

    ``render(messages, add_generation_prompt)`` returns the token ids; with a
    Hugging Face tokenizer it is ``apply_chat_template(..., tokenize=True)``.
    """

    def __init__(self, render: Callable[[list[Message], bool], Sequence[int]]) -> None:
        self._render = render

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TurnCounter:
        def render(messages: list[Message], generation: bool) -> Sequence[int]:
            ids = tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=generation
            )
            return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

        return cls(render)

    def context(self, messages: list[Message]) -> int:
        """Tokens of the shared context (no reply header)."""
        return len(self._render(messages, False))

    def turn(self, base: list[Message], text: str) -> int:
        """Tokens a user turn of ``text`` after ``base`` adds, with the reply header."""
        full = self._render([*base, P.user(text)], True)
        return len(full) - len(self._render(base, False))

    def reply(self, base: list[Message], bound: int) -> int:
        """Tokens of a reply turn of at most ``bound`` generated tokens, markers included."""
        closed = self._render([*base, P.assistant("x")], False)
        return bound + len(closed) - len(self._render(base, False)) - 1


def floor_inputs(
    counter: TurnCounter,
    workload: Mapping[str, Any],
    context: list[Message],
    choices: Sequence[str],
    requests: int,
    started: int | None = None,
) -> dict[str, Any]:
    """Everything the floor of one run needs, and the floor itself (JSON-ready).

    Each read message is counted at its bound (``max_tokens`` plus the turn's
    markers): with that bound within one block, a message of any length from 1
    token up takes exactly one block, so the rounded floor is exact without
    per-message lengths (older result files do not have them).

    Raises:
        ValueError: when a message could exceed one block (record per-message lengths then).
    """
    steps, read = plan(workload, requests, started)
    texts = instruction_texts(workload, choices)
    instructions = {s: counter.turn(context, texts[s]) for s in steps}
    bound = counter.reply(context, workload["max_tokens"])
    if read and bound > BLOCK:
        raise ValueError(f"a message may take {bound} tokens: more than one block")
    ctx = counter.context(context)
    messages = [bound] * read
    return {
        "context": ctx,
        "instructions": instructions,
        "messages_read": read,
        "message_bound": bound,
        "requests": requests,
        "floor": workload_floor(ctx, messages, list(instructions.values()), requests),
    }
