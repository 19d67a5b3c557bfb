"""Python entry points that read naturally: ``await vote(runtime, context, voters=5, …)``.

Each takes a ``Runtime`` (its engine is used, roles spawn in it) or an engine
bridge directly (a runtime is made for the call), and returns an ``Outcome``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..engine_bridge import EngineBridge
from ._collab import ContextInput, EventCallback, collaborate
from ._collab_types import AgentSpec, Outcome
from ._validators import Validator


def _target(target: Any) -> tuple[EngineBridge, Any]:
    if isinstance(target, EngineBridge):
        return target, None
    engine = getattr(target, "engine", None)
    if not isinstance(engine, EngineBridge):
        raise TypeError("pass a Runtime that has an engine, or an EngineBridge")
    return engine, target


async def run_mode(
    target: Any,
    mode: str,
    context: ContextInput,
    agents: Sequence[AgentSpec | Mapping[str, Any]] | None = None,
    *,
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: Any,
) -> Outcome:
    """``collaborate`` on a Runtime or a bridge (the generic form of the helpers below)."""
    engine, runtime = _target(target)
    return await collaborate(
        engine, mode, context, agents, engines=engines, on_event=on_event, runtime=runtime, **options
    )


async def vote(
    target: Any,
    context: ContextInput,
    *,
    voters: int = 5,
    choices: Sequence[str] | None = None,
    regex: str | None = None,
    instructions: str = "",
    style: str = "auto",
    **options: Any,
) -> Outcome:
    """Self-consistency vote with exact early stop (see ``Vote``); defaults as over HTTP."""
    answer = {"choices": list(choices)} if choices else ({"regex": regex} if regex else None)
    agents = [AgentSpec("voter", count=voters, instructions=instructions, role="voter")]
    return await run_mode(target, "vote", context, agents, answer=answer, style=style, **options)


async def debate(
    target: Any,
    context: ContextInput,
    *,
    agents: int | Sequence[AgentSpec | Mapping[str, Any]] = 3,
    rounds: int = 2,
    **options: Any,
) -> Outcome:
    """Multi-agent debate, stopping when all agree (see ``Debate``)."""
    specs = [AgentSpec("debater", count=agents)] if isinstance(agents, int) else agents
    return await run_mode(target, "debate", context, specs, rounds=rounds, **options)


async def reflect(
    target: Any,
    context: ContextInput,
    *,
    validator: Validator | Mapping[str, Any] | None = None,
    rounds: int = 2,
    drafter: str = "",
    critic: str = "",
    **options: Any,
) -> Outcome:
    """Draft, critique, revise until a validator passes or the critic approves."""
    specs = [AgentSpec("drafter", instructions=drafter)]
    specs.append(AgentSpec("critic", instructions=critic) if critic else AgentSpec("critic"))
    return await run_mode(target, "reflect", context, specs, validator=validator, rounds=rounds, **options)


async def aggregate(
    target: Any,
    context: ContextInput,
    *,
    proposers: int | Sequence[str | AgentSpec] = 3,
    aggregator: str = "",
    **options: Any,
) -> Outcome:
    """Mixture of agents: N proposals spliced as handles into one aggregator."""
    if isinstance(proposers, int):
        specs: list[AgentSpec] = [AgentSpec("proposer", count=proposers)]
    else:
        specs = [
            p if isinstance(p, AgentSpec) else AgentSpec(f"proposer-{i}", instructions=p)
            for i, p in enumerate(proposers, 1)
        ]
    specs.append(AgentSpec("aggregator", instructions=aggregator, role="aggregator"))
    return await run_mode(target, "aggregate", context, specs, **options)


async def cascade(
    target: Any,
    context: ContextInput,
    *,
    verifier_model: str | None = None,
    drafters: int = 2,
    draft_model: str | None = None,
    verify: str = "on_disagreement",
    **options: Any,
) -> Outcome:
    """Small model drafts, a larger model verifies only when needed."""
    specs = [
        AgentSpec("drafter", count=drafters, model=draft_model),
        AgentSpec("verifier", model=verifier_model, role="verifier"),
    ]
    return await run_mode(target, "cascade", context, specs, verify=verify, **options)
