"""The prompt text of microagent's modes, for the client-side re-implementations.

Copied (a unit test checks they still equal microagent's constants) so that
the client-side and LangGraph code, which run in a virtual environment
without microagent, send the same words in the same chat layout: the shared
context first, each role's own turn after it.
"""

from __future__ import annotations

from typing import Any

ANSWER_CUE = "Therefore, the final answer is"
DEBATE_PROMPT = (
    "These are the answers of the other agents. Considering them, give your updated answer, "
    "briefly. End with a line 'Answer: <your answer>'."
)
FIRST_PROMPT = "Answer the question, briefly. End with a line 'Answer: <your answer>'."
TRANSCRIPT_PROMPT = (
    "These are the answers of all agents so far; yours are those of agent {agent}. "
    "Considering them, give your updated answer, briefly. End with a line 'Answer: <your answer>'."
)
#: from this many agents on, microagent's debate (``layout: auto``) uses the shared transcript
TRANSCRIPT_FROM_AGENTS = 3
AGGREGATE_PROMPT = (
    "Above is one proposal; the other proposals follow. Combine the best parts of all proposals "
    "into one final answer. Reply with the final answer only."
)
APPROVAL = "APPROVED"
CRITIC_PROMPT = (
    "Review the answer above. If it is correct and complete, reply with the single word "
    f"{APPROVAL}. Otherwise, list the problems briefly."
)
REVISE_PROMPT = "Revise your answer to fix these problems. Reply with the revised answer only."

Message = dict[str, Any]


def clean(text: str) -> str:
    """Model text without end-of-turn markers."""
    return text.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip()


def vote_instructions(choices: list[str], style: str) -> str:
    """microagent's default voter instructions (``_ops_vote._default_instructions``)."""
    options = ", ".join(choices)
    if style == "direct":
        return f"Answer with exactly one of: {options}."
    return f"Think step by step, briefly, then give your answer (one of: {options})."


def answer_cue(choices: list[str]) -> str:
    return f"{ANSWER_CUE} one of: {', '.join(choices)}."


#: an explicit system message sent first on every side (``--system-prompt``); None = none
SYSTEM: str | None = None
#: the system prompt SmolLM2's chat template inserts when a conversation has none
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def context(ctx: str) -> list[Message]:
    """The shared context as messages: the optional system message, then the user's task."""
    return ([{"role": "system", "content": SYSTEM}] if SYSTEM else []) + [user(ctx)]


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def spliced(parts: list[tuple[str, str]], instructions: str) -> str:
    """A user turn of labelled outputs then instructions, as microagent splices them.

    Like ``ChatComposer.splice``: text after a spliced output starts on a new line
    (a blank line is put in unless the text starts with a line break).
    """
    body = "".join(f"{label}{clean(text)}" for label, text in parts)
    separator = "\n\n" if parts and not instructions.startswith("\n") else ""
    return body + separator + instructions


def debate_layout(agents: int, layout: str = "auto") -> str:
    """The layout microagent's debate runs for ``agents`` debaters (``DebateConfig.layout``)."""
    if layout != "auto":
        return layout
    return "transcript" if agents >= TRANSCRIPT_FROM_AGENTS else "threads"


def transcript_turn(rounds: list[dict[str, str]], agent: str) -> str:
    """A transcript-layout debate turn: every earlier answer (rounds in order, agents
    sorted), then the agent's own instruction, as microagent's debate lays it out."""
    parts = [
        (f"Round {number}, agent {name}: ", answers[name])
        for number, answers in enumerate(rounds, 1)
        for name in sorted(answers)
    ]
    parts = [(label if i == 0 else "\n" + label, text) for i, (label, text) in enumerate(parts)]
    return spliced(parts, "\n" + TRANSCRIPT_PROMPT.format(agent=agent))
