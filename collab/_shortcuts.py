"""Python entry points that read naturally: ``await vote(runtime, context, voters=5, …)``.

Each takes a ``Runtime`` (its engine is used, roles spawn in it) or an engine
bridge directly (a runtime is made for the call), and returns an ``Outcome``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..actors import Runtime
from ..engine_bridge import EngineBridge
from ._context import EventCallback
from ._outcome import Outcome
from ._run import ContextInput, collaborate, prepare_collaboration
from ._spec import AgentInput, AgentSpec
from ._validators import Validator

#: Where a collaboration runs: a Runtime (its engine; roles spawn in it) or a bare bridge.
Target = Runtime | EngineBridge


def _target(target: Target) -> tuple[EngineBridge, Runtime | None]:
    if isinstance(target, EngineBridge):
        return target, None
    if isinstance(target, Runtime) and isinstance(target.engine, EngineBridge):
        return target.engine, target
    raise TypeError("pass a Runtime that has an engine, or an EngineBridge")


async def run_mode(
    target: Target,
    mode: str,
    context: ContextInput,
    agents: Sequence[AgentInput] | None = None,
    *,
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
) -> Outcome:
    """``collaborate`` on a Runtime or a bridge (the generic form of the helpers below)."""
    return await _run(target, mode, context, agents, engines, on_event, options)


async def _run(
    target: Target,
    mode: str,
    context: ContextInput,
    agents: Sequence[AgentInput] | None,
    engines: Mapping[str, EngineBridge] | None,
    on_event: EventCallback | None,
    options: Mapping[str, object],
) -> Outcome:
    engine, runtime = _target(target)
    prepared = prepare_collaboration(mode, agents, options)
    return await collaborate(
        engine, prepared, context, engines=engines, on_event=on_event, runtime=runtime
    )


async def vote(
    target: Target,
    context: ContextInput,
    *,
    voters: int = 5,
    choices: Sequence[str] | None = None,
    regex: str | None = None,
    instructions: str = "",
    style: str = "auto",
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
) -> Outcome:
    """Self-consistency vote with exact early stop (see ``Vote``); defaults as over HTTP."""
    answer = {"choices": list(choices)} if choices else ({"regex": regex} if regex else None)
    agents = [AgentSpec("voter", count=voters, instructions=instructions, role="voter")]
    return await _run(
        target,
        "vote",
        context,
        agents,
        engines,
        on_event,
        {"answer": answer, "style": style, **options},
    )


async def debate(
    target: Target,
    context: ContextInput,
    *,
    agents: int | Sequence[AgentInput] = 3,
    rounds: int = 2,
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
) -> Outcome:
    """Multi-agent debate, stopping when all agree (see ``Debate``)."""
    specs = [AgentSpec("debater", count=agents)] if isinstance(agents, int) else agents
    return await _run(
        target, "debate", context, specs, engines, on_event, {"rounds": rounds, **options}
    )


async def reflect(
    target: Target,
    context: ContextInput,
    *,
    validator: Validator | Mapping[str, Any] | None = None,
    rounds: int = 2,
    drafter: str = "",
    critic: str = "",
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
) -> Outcome:
    """Draft, critique, revise until a validator passes or the critic approves."""
    specs = [AgentSpec("drafter", instructions=drafter)]
    specs.append(AgentSpec("critic", instructions=critic) if critic else AgentSpec("critic"))
    return await _run(
        target,
        "reflect",
        context,
        specs,
        engines,
        on_event,
        {"validator": validator, "rounds": rounds, **options},
    )


async def aggregate(
    target: Target,
    context: ContextInput,
    *,
    proposers: int | Sequence[str | AgentSpec] = 3,
    aggregator: str = "",
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
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
    return await _run(target, "aggregate", context, specs, engines, on_event, options)


async def cascade(
    target: Target,
    context: ContextInput,
    *,
    verifier_model: str | None = None,
    drafters: int = 2,
    draft_model: str | None = None,
    verify: str = "on_disagreement",
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    **options: object,
) -> Outcome:
    """Small model drafts, a larger model verifies only when needed."""
    specs = [
        AgentSpec("drafter", count=drafters, model=draft_model),
        AgentSpec("verifier", model=verifier_model, role="verifier"),
    ]
    return await _run(
        target, "cascade", context, specs, engines, on_event, {"verify": verify, **options}
    )
