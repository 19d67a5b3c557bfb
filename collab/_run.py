"""Running a collaboration: ``prepare_collaboration`` validates it, ``collaborate`` runs it.

``collaborate`` composes the task context once, opens an actor scope for the
collaboration, hands the mode a ``CollaborationContext`` and turns the mode's
``ModeResult`` and the agents' records into an ``Outcome``. Cancelling the
caller cancels the scope: every role actor stops and every engine request
the collaboration started is aborted.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import anyio
import attrs

from ..actors import Runtime
from ..engine_bridge import (
    EngineBridge,
    EngineDied,
    KVHandle,
    find_cause,
    with_tool_instructions,
)
from ._budget import TokenBudgetExceeded, largest_turn, worst_case_tokens
from ._config import ModeConfig, build_config
from ._context import CollaborationContext, EventCallback, bridge_for_spec
from ._errors import CollaborationFailed, InvalidCollaboration
from ._mode import AnyOp, CollaborationOp, ModeRegistry, ModeResult
from ._outcome import AgentRecord, ModelUsage, Outcome, Usage
from ._registry import default_registry
from ._scheduling import ServicePolicy
from ._spec import AgentInput, AgentSpec
from ._tools import (
    DEFAULT_MAX_TOOL_STEPS,
    AgentToolChoice,
    ToolInput,
    agent_tool_plan,
    as_tools,
    unknown_agent_tool,
)

#: The task: one user message, chat messages, or a handle already composed.
ContextInput = str | Sequence[Mapping[str, object]] | KVHandle
#: A mode as callers name it: a registered name, a mode class or an instance.
ModeInput = str | type[AnyOp] | AnyOp

#: Ceiling on agents per collaboration unless a caller sets its own (server limits).
DEFAULT_MAX_AGENTS: Final = 64

_collab_ids = itertools.count(1)


@attrs.frozen
class PreparedCollaboration:
    """A validated collaboration request: the mode, its config and the agent specs."""

    op: AnyOp
    config: ModeConfig
    agents: tuple[AgentSpec, ...]

    def largest_turn(self) -> int:
        """The most completion tokens one turn of this collaboration may ask for."""
        return largest_turn(self)

    def worst_case_tokens(self, *, tool_steps: int = 0) -> int | None:
        """Completion tokens it spends at most; ``None`` when its mode has no bound.

        ``tool_steps``: the agents' ``max_tool_steps`` when they have tools (each step
        of the loop is a generation of its own), else 0.
        """
        return worst_case_tokens(self, tool_steps=tool_steps)


def _mode(mode: ModeInput, registry: ModeRegistry) -> AnyOp:
    if isinstance(mode, CollaborationOp):
        return mode
    if isinstance(mode, type) and issubclass(mode, CollaborationOp):
        return mode()
    if isinstance(mode, str):
        return registry.get(mode)()
    raise InvalidCollaboration(
        "collaboration.mode", f"must be a mode name, got {type(mode).__name__}"
    )


def _specs(agents: Sequence[AgentInput] | None) -> list[AgentSpec]:
    specs: list[AgentSpec] = []
    for i, a in enumerate(agents or ()):
        if isinstance(a, AgentSpec):
            specs.append(a)
        elif isinstance(a, Mapping):
            try:
                specs.append(AgentSpec.from_dict(a))
            except InvalidCollaboration as exc:
                field = exc.field.replace("agents", f"agents[{i}]", 1)
                raise InvalidCollaboration(field, exc.reason) from None
        else:
            raise InvalidCollaboration(f"agents[{i}]", "must be an object")
    return specs


def prepare_collaboration(
    mode: ModeInput,
    agents: Sequence[AgentInput] | None,
    options: Mapping[str, object] | None = None,
    *,
    max_agents: int = DEFAULT_MAX_AGENTS,
    registry: ModeRegistry | None = None,
) -> PreparedCollaboration:
    """Validate a collaboration without running it (the server answers 400 from this).

    Args:
        mode: a mode name (looked up in ``registry``), a mode class or an instance.
        agents: agent specs or their JSON form; the mode's defaults when empty.
        options: the mode's config options.
        max_agents: most agents in total: the request's, and the ones its mode spawns
            (a graph's node instances).
        registry: where mode names are looked up (default: the default registry).

    Raises:
        InvalidCollaboration: naming the offending field.
    """
    op = _mode(mode, default_registry if registry is None else registry)
    config = build_config(op.Config, dict(options or {}))
    specs = _specs(agents) or list(op.default_agents)
    names: set[str] = set()
    for spec in specs:
        for agent in spec.agent_names():
            if agent in names:
                raise InvalidCollaboration("agents.name", f"agent name {agent!r} is used twice")
            names.add(agent)
    total = sum(s.count for s in specs)
    if total > max_agents:
        raise InvalidCollaboration("agents", f"{total} agents in total; the limit is {max_agents}")
    if config.rounds is not None and not op.uses_rounds:
        raise InvalidCollaboration("collaboration.rounds", f"mode {op.name!r} has no rounds")
    op.validate(config, specs)
    spawned = op.spawned_specs(config, specs)
    if spawned is not specs:  # the mode spawns its own (a graph's nodes): they count too
        total = sum(s.count for s in spawned)
        if total > max_agents:
            raise InvalidCollaboration(
                op.agents_field, f"{total} agents in total; the limit is {max_agents}"
            )
    return PreparedCollaboration(op, config, tuple(specs))


def question_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The last user message's text (a spliced handle's text; text parts joined)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, KVHandle):
            return content.text
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        return ""
    return ""


def _messages(context: ContextInput) -> tuple[Mapping[str, Any], ...]:
    if isinstance(context, str):
        if not context.strip():
            raise InvalidCollaboration("messages", "the context is empty")
        return ({"role": "user", "content": context},)
    if isinstance(context, KVHandle):
        return ()
    msgs = tuple(context)
    if not msgs:
        raise InvalidCollaboration("messages", "must hold at least one message")
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidCollaboration(f"messages[{i}]", "must be an object with role and content")
    return msgs


async def collaborate(
    engine: EngineBridge,
    mode: ModeInput | PreparedCollaboration,
    context: ContextInput,
    agents: Sequence[AgentInput] | None = None,
    *,
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    runtime: Runtime | None = None,
    max_agents: int = DEFAULT_MAX_AGENTS,
    registry: ModeRegistry | None = None,
    scheduling: ServicePolicy | None = None,
    tools: Iterable[ToolInput] | None = None,
    max_tool_steps: int = DEFAULT_MAX_TOOL_STEPS,
    tool_choice: AgentToolChoice = "auto",
    token_budget: int | None = None,
    question: str | None = None,
    **options: object,
) -> Outcome:
    """Run one collaboration on ``engine`` and return its outcome.

    Args:
        engine: the default engine bridge (roles run here unless their spec names a model).
        mode: a registered mode name, a ``CollaborationOp`` class/instance, or what
            ``prepare_collaboration`` returned (then ``agents`` and options stay empty).
        context: the task: a string (one user message), chat messages, or a ready handle.
        agents: agent specs (``AgentSpec`` or JSON-like dicts); the mode's default if empty.
        engines: other served models by name (cascade, per-agent ``model``).
        on_event: called with every ``CollaborationEvent`` as it happens.
        runtime: an actor ``Runtime`` to spawn roles in (one is made for the call if None).
        max_agents: most agents in total.
        registry: where a mode name is looked up (default: the default registry).
        scheduling: how its requests are prioritised against other collaborations'
            (default ``ServicePolicy()``: least attained service, critical path, aging).
        tools: functions (or ``Tool``s) every agent may call on its free-text turns;
            each call runs in the loop and its result is appended to the agent's
            thread (see ``collab/_tools.py``). Needs a text or message ``context``.
        max_tool_steps: rounds of tool calls one turn may make before it must answer.
        tool_choice: ``"auto"`` (the model decides) or ``"required"`` (every step of a
            free turn but the last is a call, ``max_tool_steps`` of them: small models
            that never call on their own still do).
        token_budget: the most tokens (prompt and completion, cached prompt tokens
            included, as a quota counts them) the collaboration may use, all agents
            together; a turn whose prompt and ``max_tokens`` could take it past is not
            sent (``TokenBudgetExceeded``). ``worst_case_tokens`` tells the completion
            part before it runs.
        question: the user's question as text, for modes that read it (``compute``
            looks for numbers in it); default: the context's last user message (none
            for a handle context).
        **options: the mode's config (``early_stop``, ``rounds``, ``answer``…).

    Cancelling the calling task cancels every role actor and aborts every
    engine request the collaboration started.

    Raises:
        InvalidCollaboration: the request is invalid (names the field).
        CollaborationFailed: the collaboration could not produce an answer.
        TokenBudgetExceeded: it would have gone past ``token_budget``.
        TimeoutError: ``timeout`` (a config option) expired; everything it started was
            cancelled.
    """
    if isinstance(mode, PreparedCollaboration):
        if agents or options:
            raise TypeError("a PreparedCollaboration already holds its agents and options")
        prepared = mode
    else:
        prepared = prepare_collaboration(
            mode, agents, options, max_agents=max_agents, registry=registry
        )
    all_engines = {engine.model: engine, **dict(engines or {})}
    for spec in prepared.agents:  # unknown models and adapters fail before anything runs
        bridge_for_spec(spec, engine, all_engines)
    toolbox = as_tools(tools)
    unknown = unknown_agent_tool(prepared.agents, toolbox)
    if unknown is not None:  # an agent names only tools the collaboration has
        _, spec, name = unknown
        raise InvalidCollaboration(
            "agents.tools",
            f"agent {spec.name!r} names tool {name!r}, which the collaboration "
            f"does not have (tools: {sorted(toolbox)})",
        )
    if max_tool_steps < 0:
        raise InvalidCollaboration("max_tool_steps", f"must be >= 0, got {max_tool_steps}")
    if tool_choice not in ("auto", "required"):
        raise InvalidCollaboration(
            "tool_choice", f'must be "auto" or "required", got {tool_choice!r}'
        )
    messages = _messages(context)
    if toolbox:
        if isinstance(context, KVHandle):
            raise InvalidCollaboration(
                "tools", "tools need a text or message context (their description goes first)"
            )
        messages = tuple(with_tool_instructions(messages, agent_tool_plan(toolbox)))
    handle = context if isinstance(context, KVHandle) else engine.chat.context(list(messages))

    async def run_in(rt: Runtime) -> Outcome | None:
        name = f"{prepared.op.name}-{next(_collab_ids)}"
        try:
            return await run_scope(rt, name)
        finally:  # its agents' retained KV goes back to the LRU cache, whatever happened
            with anyio.CancelScope(shield=True):
                for bridge in {id(b): b for b in all_engines.values()}.values():
                    with contextlib.suppress(Exception):  # a dead engine holds nothing
                        await bridge.release(prefix=f"{name}/")

    async def run_scope(rt: Runtime, name: str) -> Outcome | None:
        outcome: Outcome | None = None  # stays None if the scope ends the block itself
        async with rt.scope(name) as scope:
            ctx: CollaborationContext[Any] = CollaborationContext(
                op=prepared.op,
                config=prepared.config,
                agents=prepared.agents,
                engine=engine,
                engines=all_engines,
                context=handle,
                messages=messages,
                question=question_of(messages) if question is None else question,
                scope=scope,
                on_event=on_event,
                scheduling=scheduling,
                tools=toolbox,
                max_tool_steps=max_tool_steps,
                tool_choice=tool_choice,
                token_budget=token_budget,
            )
            try:
                result = await prepared.op.run(ctx)
            except (InvalidCollaboration, CollaborationFailed):
                raise
            except EngineDied as exc:
                raise CollaborationFailed(
                    f"the engine died: {exc}", tuple(ctx.records.values()), exc
                ) from exc
            except Exception as exc:  # cancellation is a BaseException: it passes through
                invalid = find_cause(exc, InvalidCollaboration)
                if isinstance(invalid, InvalidCollaboration):  # a client's spec, found as it
                    raise invalid from exc  # ran (a pattern that backtracks): still its 400
                over = find_cause(exc, TokenBudgetExceeded)
                if over is not None:  # raised inside a mode's task group: keep its type
                    raise TokenBudgetExceeded(
                        over.reason, tuple(ctx.records.values()), over
                    ) from exc
                cause = getattr(exc, "cause", None) or exc
                raise CollaborationFailed(
                    f"{ctx.mode} failed: {type(exc).__name__}: {cause}",
                    tuple(ctx.records.values()),
                    exc,
                ) from exc
            for role in ctx.roles.values():  # anything still running is no longer needed
                if role.running_request is not None:
                    await ctx.prune(role, "collaboration_finished")
                role.record.messages = role.ref.mailbox_stats().delivered
            outcome = _outcome(ctx, result, ctx.now())
            await ctx.emit("final", None, answer=result.answer, usage=outcome.usage.to_dict())
        return outcome

    outcome: Outcome | None = None
    failure: BaseException | None = None
    with anyio.fail_after(prepared.config.timeout):  # None: no limit
        if runtime is not None:
            outcome = await run_in(runtime)
            failure = runtime.failure
        else:
            async with Runtime(engine=engine) as rt:
                outcome = await run_in(rt)
            failure = rt.failure
    if outcome is None:  # the runtime ended the block itself (an escalation)
        raise CollaborationFailed("the actor runtime stopped the collaboration", cause=failure)
    return outcome


def _usage_by_model(
    ctx: CollaborationContext[Any], records: tuple[AgentRecord, ...]
) -> dict[str, ModelUsage]:
    """Each model's totals (the default engine's agents under its name), local and remote."""
    out: dict[str, ModelUsage] = {}
    for r in records:
        name = r.model or ctx.engine.model
        bridge = ctx.engines.get(name, ctx.engine)
        u = out.get(name, ModelUsage(remote=bridge.remote))
        out[name] = attrs.evolve(
            u,
            prompt_tokens=u.prompt_tokens + r.prompt_tokens,
            cached_tokens=u.cached_tokens + r.cached_tokens,
            completion_tokens=u.completion_tokens + r.completion_tokens,
            requests=u.requests + r.requests,
        )
    return out


def _outcome(ctx: CollaborationContext[Any], result: ModeResult, wall: float) -> Outcome:
    records = tuple(ctx.records.values())
    done = [r.completion_tokens for r in records if r.finish_reason in ("stop", "length")]
    mean_done = sum(done) / len(done) if done else 0.0
    saved = sum(
        max(0.0, mean_done - r.completion_tokens) for r in records if r.finish_reason == "pruned"
    )
    usage = Usage(
        prompt_tokens=sum(r.prompt_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        saved_completion_tokens=round(saved),
    )
    return Outcome(
        mode=ctx.mode,
        answer=result.answer,
        agents=records,
        usage=usage,
        usage_by_model=_usage_by_model(ctx, records),
        rounds=result.rounds,
        early_stopped=result.early_stopped,
        votes=result.votes,
        wall_time=wall,
        details=dict(result.details),
    )
