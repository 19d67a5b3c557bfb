"""Planning: a chat request parsed once into a typed plan that the later stages trust.

``plan_request`` checks every field of a ``ChatCompletionRequest`` (each 400
names the field at fault), composes its conversation on the engine, sizes its
worst case and decides what its session keeps, and returns a
``CompletionPlan`` (a plain completion) or a ``CollaborationPlan`` (agents and
a collaboration). Admission, running and rendering read the plan; none of them
checks a field again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import attrs

from ..collab import (
    DEFAULT_MAX_TOOL_STEPS,
    AgentSpec,
    InvalidCollaboration,
    PreparedCollaboration,
    Tool,
    agent_tool_plan,
    code_policy,
    prepare_collaboration,
    unknown_agent_tool,
)
from ..engine_bridge import (
    EngineBridge,
    EngineUnavailable,
    KVHandle,
    RequestRefused,
    Sampling,
    ToolPlan,
    UnknownAdapter,
    with_tool_instructions,
)
from ._code_gate import server_code_policy
from ._engine_errors import engine_error
from ._errors import bad_request, invalid_collaboration
from ._messages import check_length, compose, context_limit, conversation
from ._params import check_parameters, check_sampling, max_tokens_of, sampling_fields, stops_of
from ._presets import Preset
from ._render import Stamp
from ._schemas import ChatCompletionRequest
from ._sessions import SessionPlan
from ._state import ServerState, engine_for
from ._tokens import unknown_token
from ._tool_prompt import templated_prompt
from ._tools import tool_plan

DEFAULT_MAX_TOKENS = 512
"""Completion budget of a plain completion that gives no ``max_tokens``."""

DEFAULT_CONTEXT = 4096
"""The context the default per-request budget assumes for a model that states none (the
ScriptedEngine, a remote model): ``serve --max-model-len``'s default."""


@attrs.frozen(kw_only=True)
class CompletionPlan:
    """A plain completion, checked and composed.

    Attributes:
        body: the request as parsed (read for what it echoes: ``n``, ``stream``, options).
        bridge: the engine that serves it.
        tenant: its API key's id (quota account, cache salt, session scope).
        tools: its function-calling plan (None without ``tools``).
        prompt: the composed prompt, the generation cue included.
        sampling: the engine's sampling parameters, tool constraints applied.
        session: what the turn keeps for the session's next one.
        stamp: the response's id, time and model.
    """

    body: ChatCompletionRequest
    bridge: EngineBridge
    tenant: str
    tools: ToolPlan | None
    prompt: KVHandle
    sampling: Sampling
    session: SessionPlan
    stamp: Stamp

    @property
    def worst_tokens(self) -> int:
        """Prompt and completion tokens it may use at most (its quota admission)."""
        return (len(self.prompt) + self.sampling.max_tokens) * self.body.n


@attrs.frozen(kw_only=True)
class CollaborationPlan:
    """A collaboration, validated and composed.

    Attributes:
        body: the request as parsed.
        bridge: the default engine (agents without a ``model`` run here).
        engines: every served engine, by served name and by model name.
        bridges: the engines its agents use (their queues are checked on admission).
        tenant: its API key's id.
        prepared: the validated mode, config and agents.
        tools: the server tools its agents may call.
        tool_choice: ``collaboration.tool_choice``.
        conversation: the messages as the session re-sends them (generated ids spliced).
        context: what the agents start from: the composed handle, or the messages
            when tools are given (``collaborate`` then puts their description first).
        session: what the turn keeps for the session's next one (None with tools).
        question: the last user message's text (what ``compute`` reads for numbers).
        worst_tokens: prompt and completion tokens it may use at most.
        token_budget: what it may use as it runs (prompt and completion tokens): the
            server's per-request budget, or the key's tokens per minute when lower.
        stamp: the response's id, time and model.
        trace_headers: the caller's W3C ``traceparent``/``tracestate`` (its trace continues).
    """

    body: ChatCompletionRequest
    bridge: EngineBridge
    engines: Mapping[str, EngineBridge]
    bridges: tuple[EngineBridge, ...]
    tenant: str
    prepared: PreparedCollaboration
    tools: tuple[Tool, ...]
    tool_choice: Literal["auto", "required"]
    conversation: Sequence[Mapping[str, str | KVHandle]]
    context: KVHandle | list[dict[str, str]]
    session: SessionPlan | None
    question: str
    worst_tokens: int
    token_budget: int
    stamp: Stamp
    trace_headers: Mapping[str, str] = attrs.field(factory=dict)


Plan = CompletionPlan | CollaborationPlan
#: The sampling fields a ``response_format`` sets.
JSON_FORMATS = ("json_schema", "json_object")


async def plan_request(
    state: ServerState,
    body: ChatCompletionRequest,
    tenant: str,
    trace_headers: Mapping[str, str] | None = None,
) -> Plan:
    """The request's plan: a collaboration when it has ``agents`` or ``collaboration``, or
    when its ``model`` names a preset (whose stamp then names the preset)."""
    preset = state.presets.get(body.model) if body.model is not None else None
    if preset is not None:
        plan = await _plan_collaboration(state, preset.apply(body), tenant)
        return attrs.evolve(
            plan,
            trace_headers=dict(trace_headers or {}),
            stamp=attrs.evolve(plan.stamp, model=preset.name),
        )
    if body.agents is not None or body.collaboration is not None:
        plan = await _plan_collaboration(state, body, tenant)
        return attrs.evolve(plan, trace_headers=dict(trace_headers or {}))
    return await _plan_completion(state, body, tenant)


async def _plan_completion(
    state: ServerState, body: ChatCompletionRequest, tenant: str
) -> CompletionPlan:
    bridge = engine_for(state, body.model)
    check_parameters(body, collaboration=False)
    check_sampling(body, state.limits.max_n)
    call_format = bridge.tool_format
    tools = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls, call_format)
    fields = sampling_fields(body)
    if tools is not None and tools.active and any(k in fields for k in JSON_FORMATS):
        if not tools.whole_reply:
            raise bad_request(
                "response_format json and tools cannot both shape one reply", "response_format"
            )
        # a forced call is the whole reply: the format shapes text the reply has none of
        # (instructor's Responses mode sends both, the format the call's own schema)
        fields = {k: v for k, v in fields.items() if k not in JSON_FORMATS}
    # the model's template places tools and calls itself where it has a tool format
    prompt = await templated_prompt(bridge, body, tools)
    if prompt is None:
        turns = conversation(body, tools, call_format)
        context = await compose(bridge, state.sessions.splice(tenant, bridge, turns))
        prompt = bridge.chat.generation_prompt(context)
    return _completion_plan(state, body, tenant, bridge, prompt, tools, fields)


async def plan_prompt(
    state: ServerState,
    body: ChatCompletionRequest,
    prompt: str | Sequence[int],
    tenant: str,
) -> CompletionPlan:
    """A plain completion of a raw ``prompt`` (text, or token ids as sent): no chat
    template, no tools; ``body`` carries its sampling fields (``/v1/completions``)."""
    bridge = engine_for(state, body.model)
    check_parameters(body, collaboration=False)
    check_sampling(body, state.limits.max_n)
    fields = sampling_fields(body)
    ids = await bridge.atokenize(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise bad_request("prompt must not be empty", "prompt")
    at = None if isinstance(prompt, str) else unknown_token(bridge, ids)
    if at is not None:  # the engine would fail the request: refused here, named
        raise bad_request(
            f"prompt: token {ids[at]} (at {at}) is not in model {bridge.model!r}'s vocabulary",
            "prompt",
        )
    handle = bridge.handle(ids)
    return _completion_plan(state, body, tenant, bridge, handle, None, fields, text=True)


def _completion_plan(
    state: ServerState,
    body: ChatCompletionRequest,
    tenant: str,
    bridge: EngineBridge,
    prompt: KVHandle,
    tools: ToolPlan | None,
    fields: Mapping[str, Any],
    *,
    text: bool = False,
) -> CompletionPlan:
    """The plan of ``prompt`` on ``bridge``: its budget checked, its sampling built
    (``text``: a ``/v1/completions`` response's stamp)."""
    limit = context_limit(bridge)
    max_tokens = max_tokens_of(body)
    if max_tokens is None:
        max_tokens = (
            DEFAULT_MAX_TOKENS
            if limit is None
            else max(1, min(DEFAULT_MAX_TOKENS, limit - len(prompt)))
        )
    check_length(bridge, len(prompt), max_tokens)
    check_budget((len(prompt) + max_tokens) * body.n, request_budget(state, bridge), "max_tokens")
    try:
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            stop=stops_of(body),  # type: ignore[arg-type]
            **fields,
        )
        if tools is not None:
            sampling = tools.constrain(sampling)
        for _ in range(body.n):  # refuse before anything starts
            bridge.check_request(prompt, sampling)
    except (RequestRefused, UnknownAdapter, EngineUnavailable) as exc:
        raise engine_error(exc) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    session = session_plan(
        state, tenant, bridge, prompt, body, tools=tools is not None and tools.active
    )
    if body.n > 1:  # n forks of one prompt: none of them is the session's next turn
        session = attrs.evolve(session, retain=None)
    return CompletionPlan(
        body=body,
        bridge=bridge,
        tenant=tenant,
        tools=tools,
        prompt=prompt,
        sampling=sampling,
        session=session,
        stamp=Stamp.new(bridge.model, text=text),
    )


async def _plan_collaboration(
    state: ServerState, body: ChatCompletionRequest, tenant: str
) -> CollaborationPlan:
    check_parameters(body, collaboration=True)
    if body.n != 1:
        raise bad_request("n must be 1 for a collaboration", "n")
    bridge = engine_for(state, body.model)
    check_sampling(body, state.limits.max_n)
    specs, bridges = _agents(state, body, bridge)
    options = body.collaboration_options()
    prepared = _prepare(state, body, specs, options)
    tools = _server_tools(state, body)
    names = sorted(t.name for t in tools)
    unknown = unknown_agent_tool(specs, names)
    if unknown is not None:  # refused before anything streams
        i, _, name = unknown
        raise bad_request(
            f"agents[{i}].tools: {name!r} is not among the collaboration's tools ({names})",
            f"agents[{i}].tools",
        )
    messages = conversation(body)
    # re-sent answers as their generated ids (with tools, collaborate composes the context)
    spliced: Sequence[Mapping[str, str | KVHandle]] = (
        messages if tools else state.sessions.splice(tenant, bridge, messages)
    )
    # with tools, collaborate composes the context itself (their description first);
    # the same composition here only measures it for the length check
    measured = (
        with_tool_instructions(messages, agent_tool_plan({t.name: t for t in tools}))
        if tools
        else spliced
    )
    composed = await compose(bridge, measured)
    # a session's turn keeps the conversation and its answer for the next turn (not with
    # tools: their description leads the agents' context, not the conversation's)
    session = None if tools else session_plan(state, tenant, bridge, composed, body, tools=False)
    per_agent = [s.max_tokens for s in specs if s.max_tokens is not None]
    longest = max([int(options.get("max_tokens", 256)), *per_agent])
    check_length(bridge, len(composed) + 16, longest)
    _check_seed(prepared.config.seed, composed, bridges)
    tool_steps = DEFAULT_MAX_TOOL_STEPS if tools else 0
    completion = prepared.worst_case_tokens(tool_steps=tool_steps)
    budget = request_budget(state, bridge)
    worst: int | None = None
    if completion is not None:  # every turn (and tool step) reads at least the context
        turns = prepared.op.max_turns(prepared.config, prepared.agents) or 0
        worst = turns * (1 + tool_steps) * len(composed) + completion
        check_budget(worst, budget, "max_tokens", prepared)
    tpm = state.limits.key_quota.tokens_per_minute if state.quotas is not None else None
    running_budget = budget if tpm is None else min(budget, tpm)
    # a mode with no bound may use what the meter lets it: its budget
    promised = worst if worst is not None else running_budget
    engines = dict(state.engines)
    for b in state.engines.values():
        engines.setdefault(b.model, b)
    collab = body.collaboration
    return CollaborationPlan(
        body=body,
        bridge=bridge,
        engines=engines,
        bridges=tuple(bridges),
        tenant=tenant,
        prepared=prepared,
        tools=tuple(tools),
        tool_choice="auto" if collab is None or collab.tool_choice is None else collab.tool_choice,
        conversation=spliced,
        context=messages if tools else composed,
        session=session,
        question=next((m["content"] for m in reversed(messages) if m["role"] == "user"), ""),
        worst_tokens=promised,
        token_budget=running_budget,
        stamp=Stamp.new(bridge.model),
    )


def _agents(
    state: ServerState, body: ChatCompletionRequest, bridge: EngineBridge
) -> tuple[list[AgentSpec], list[EngineBridge]]:
    """The request's agent specs (a remote ``model`` resolved) and the engines they use."""
    limits = state.limits
    specs: list[AgentSpec] = []
    total = 0
    bridges = [bridge]
    for i, raw in enumerate(body.agents or ()):
        where = f"agents[{i}]"
        try:  # the agent's own rules (types, bounds) are AgentSpec's: one definition
            spec = AgentSpec.from_dict(raw)
        except InvalidCollaboration as exc:
            field = exc.field.replace("agents", where, 1)
            raise bad_request(f"{field}: {exc.reason}", field) from None
        if spec.count > limits.max_agents_per_spec:  # this server's own, tighter cap
            raise bad_request(
                f"{where}.count must be in 1..{limits.max_agents_per_spec}, got {spec.count}",
                f"{where}.count",
            )
        total += spec.count
        if total > limits.max_total_agents:
            raise bad_request(
                f"too many agents: at most {limits.max_total_agents} in total",
                "agents",
                "too_many_agents",
            )
        target = bridge if spec.model is None else engine_for(state, spec.model, f"{where}.model")
        bridges.append(target)
        if spec.adapter is not None and spec.adapter not in target.adapters:
            raise bad_request(
                f"{where}.adapter: unknown adapter {spec.adapter!r} for model {target.model!r}; "
                f"registered: {sorted(target.adapters)}",
                f"{where}.adapter",
                "adapter_not_found",
            )
        specs.append(spec if spec.model is None else attrs.evolve(spec, model=target.model))
    return specs, bridges


def _prepare(
    state: ServerState,
    body: ChatCompletionRequest,
    specs: list[AgentSpec],
    options: Mapping[str, Any],
) -> PreparedCollaboration:
    """The mode, its config and the agents, validated (a 400 naming the field)."""
    limits = state.limits
    mode = body.collaboration.mode if body.collaboration is not None else "vote"
    timeout = options.get("timeout")
    if isinstance(timeout, int | float) and timeout > limits.request_timeout:
        raise bad_request(
            f"collaboration.timeout: at most {limits.request_timeout:g} seconds on this server, "
            f"got {timeout:g}",
            "collaboration.timeout",
            "timeout_too_long",
        )
    if options.get("timeout") is None:  # every collaboration ends: the server's wall clock
        options = {**options, "timeout": limits.request_timeout}
    try:
        # collab's one gate refuses client code this server does not allow, wherever it is
        with code_policy(server_code_policy(limits)):
            prepared = prepare_collaboration(
                mode, specs, options, max_agents=limits.max_total_agents
            )
    except InvalidCollaboration as exc:
        raise invalid_collaboration(exc.field, exc.reason) from None
    # the agents a mode spawns itself (a graph's nodes) are held to this server's own cap
    op = prepared.op
    for spec in op.spawned_specs(prepared.config, prepared.agents):
        if spec.count > limits.max_agents_per_spec:
            field = f"{op.agents_field}.count"
            raise bad_request(
                f"{field} must be in 1..{limits.max_agents_per_spec}, got {spec.count}", field
            )
    return prepared


def check_preset(state: ServerState, preset: Preset, mcp_servers: Collection[str] = ()) -> None:
    """Hold ``preset`` to what a request carrying its ``agents`` and ``collaboration`` meets:
    its model served, its agents and mode valid within this server's limits, its tools
    this server's (``mcp_servers``: names whose tools are known only once they start).

    Raises:
        ApiError: the 400 (or 404 for its ``model``) such a request would get.
    """
    body = preset.probe()
    bridge = engine_for(state, body.model)
    specs, _ = _agents(state, body, bridge)
    _prepare(state, body, specs, body.collaboration_options())
    names = body.collaboration.tools if body.collaboration is not None else None
    if names and any(name in mcp_servers for name in names):
        for i, name in enumerate(names):  # an MCP server's tools are known once it runs
            if name not in state.tools and name not in mcp_servers:
                raise bad_request(
                    f"collaboration.tools[{i}]: no server tool named {name!r}",
                    f"collaboration.tools[{i}]",
                    "tool_not_found",
                )
        return  # the agents' own tool names are checked per request, once the servers run
    tools = _server_tools(state, body)
    unknown = unknown_agent_tool(specs, sorted(t.name for t in tools))
    if unknown is not None:
        i, _, name = unknown
        raise bad_request(
            f"agents[{i}].tools: {name!r} is not among the collaboration's tools",
            f"agents[{i}].tools",
        )


def _server_tools(state: ServerState, body: ChatCompletionRequest) -> list[Tool]:
    """The server tools ``collaboration.tools`` names (a 400 for any this server lacks)."""
    names = body.collaboration.tools if body.collaboration is not None else None
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    for i, name in enumerate(names or ()):
        group = state.tools.get(name)
        if group is None:
            raise bad_request(
                f"collaboration.tools[{i}]: no server tool named {name!r} "
                f"(this server has: {sorted(state.tools)})",
                f"collaboration.tools[{i}]",
                "tool_not_found",
            )
        for tool in group:
            if tool.name in seen and seen[tool.name] != name:
                raise bad_request(
                    f"collaboration.tools[{i}]: {name!r} and {seen[tool.name]!r} both have a "
                    f"tool named {tool.name!r}",
                    f"collaboration.tools[{i}]",
                )
            if tool.name not in seen:
                seen[tool.name] = name
                tools.append(tool)
    if not tools and body.collaboration is not None and body.collaboration.tool_choice:
        raise bad_request(
            "collaboration.tool_choice needs collaboration.tools", "collaboration.tool_choice"
        )
    return tools


def request_budget(state: ServerState, bridge: EngineBridge) -> int:
    """Prompt and completion tokens one request on ``bridge`` may use, all agents together:
    ``--max-request-tokens``, else ``request_tokens_per_context`` (16) times the model's
    ``max_model_len`` (``DEFAULT_CONTEXT`` for a model that states none)."""
    limits = state.limits
    if limits.max_collaboration_tokens is not None:
        return limits.max_collaboration_tokens
    return limits.request_tokens_per_context * (context_limit(bridge) or DEFAULT_CONTEXT)


def check_budget(
    worst: int, budget: int, param: str, prepared: PreparedCollaboration | None = None
) -> None:
    """A 400 naming ``param`` when a request's worst case is over its token ``budget``."""
    if worst <= budget:
        return
    how = ""
    if prepared is not None:
        turns = prepared.op.max_turns(prepared.config, prepared.agents)
        how = (
            f": {turns} turns of up to {prepared.largest_turn()} completion tokens, "
            "each reading the context, tool steps included"
        )
    raise bad_request(
        f"{param}: this request may use up to {worst} tokens (prompt and completion{how}), "
        f"more than this server's budget of {budget} per request; lower max_tokens, the "
        "agents' count or collaboration.rounds",
        param,
        "token_budget_exceeded",
    )


def _check_seed(seed: int | None, composed: KVHandle, bridges: Sequence[EngineBridge]) -> None:
    """A 400 naming ``seed`` where an agent's engine refuses seeded requests, as a plain
    completion gets one (vLLM's CPU backend: ``VLLMBridge.cpu_seed``)."""
    if seed is None:
        return
    for bridge in {id(b): b for b in bridges}.values():
        probe = composed if composed.model == bridge.model else bridge.handle(composed.token_ids)
        try:
            bridge.check_request(probe, Sampling(max_tokens=1, seed=seed))
        except RequestRefused as exc:
            if exc.field == "seed":
                raise bad_request(f"seed: {exc.reason}", "seed") from None
        except (EngineUnavailable, ValueError):
            continue  # other refusals are the run's to report, as without a seed


def session_plan(
    state: ServerState,
    tenant: str,
    bridge: EngineBridge,
    prompt: KVHandle,
    body: ChatCompletionRequest,
    *,
    tools: bool,
) -> SessionPlan:
    """What the request's ``prompt_cache_*`` fields (and a tool call) ask the sessions to keep."""
    options = body.prompt_cache_options
    return state.sessions.plan(
        tenant,
        bridge,
        prompt,
        cache_key=body.prompt_cache_key,
        ttl=options.ttl if options is not None else None,
        retention=body.prompt_cache_retention,
        tools=tools and body.n == 1,
    )
