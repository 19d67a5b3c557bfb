"""CollaborationOp, the mode registry, the context a mode runs with, and ``collaborate``.

A mode is a ``CollaborationOp`` subclass with a typed config (an attrs class
derived from ``ModeConfig``) and one ``run(ctx)`` method. ``run`` spawns role
actors through the context, sends them KV handles, and returns the final
answer; the context records every agent, every event and the token usage.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

import anyio
import attrs

from ..engine_bridge import EngineBridge, EngineDied, KVHandle, Sampling
from ._answers import normalize_answer
from ._collab_config import ModeConfig, build_config
from ._collab_roles import Role, RoleActor, Turn, TurnDone
from ._collab_types import (
    AgentRecord,
    AgentSpec,
    CollaborationEvent,
    CollaborationFailed,
    InvalidCollaboration,
    Outcome,
    Usage,
    event,
)
from ._supervision import RestartKind

ContextInput = str | Sequence[Mapping[str, Any]] | KVHandle
EventCallback = Callable[[CollaborationEvent], Awaitable[None] | None]

#: Ceiling on agents per collaboration unless a caller sets its own (server limits).
DEFAULT_MAX_AGENTS = 64


class CollaborationOp(abc.ABC):
    """Base class of a collaboration mode.

    Subclasses set ``name`` (the registry key, also the HTTP ``collaboration.mode``),
    optionally ``Config`` (a ``ModeConfig`` subclass) and ``default_agents`` (used
    when a request names no agents), and implement ``run``.
    """

    name: ClassVar[str]
    Config: ClassVar[type[ModeConfig]] = ModeConfig
    default_agents: ClassVar[tuple[AgentSpec, ...]] = (AgentSpec("agent", count=3),)
    min_agents: ClassVar[int] = 1
    #: Whether the mode has rounds (``rounds`` is refused by modes without them).
    uses_rounds: ClassVar[bool] = False

    def validate(self, config: ModeConfig, agents: Sequence[AgentSpec]) -> None:
        """Check mode-specific rules; raise ``InvalidCollaboration`` naming the field."""
        total = sum(a.count for a in agents)
        if total < self.min_agents:
            raise InvalidCollaboration("agents", f"mode {self.name!r} needs at least {self.min_agents} agents, got {total}")

    @abc.abstractmethod
    async def run(self, ctx: CollaborationContext) -> str:
        """Run the collaboration and return the final answer text."""


_MODES: dict[str, type[CollaborationOp]] = {}
_collab_ids = itertools.count(1)


def register_mode(op: type[CollaborationOp]) -> type[CollaborationOp]:
    """Register a mode by its ``name`` (usable as a class decorator).

    A user's mode is then usable from Python (``collaborate(engine, "mine", …)``)
    and from the HTTP API (``collaboration.mode = "mine"``).
    """
    name = getattr(op, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{op.__name__} must set a non-empty class attribute `name`")
    if not (isinstance(op, type) and issubclass(op, CollaborationOp)):
        raise TypeError("a mode must subclass CollaborationOp")
    _MODES[name] = op
    return op


def unregister_mode(name: str) -> None:
    _MODES.pop(name, None)


def collaboration_modes() -> list[str]:
    """Names of the registered modes (built-in and user-registered)."""
    return sorted(_MODES)


def get_mode(name: str) -> type[CollaborationOp]:
    try:
        return _MODES[name]
    except KeyError:
        raise InvalidCollaboration(
            "collaboration.mode", f"unknown mode {name!r}; registered modes: {collaboration_modes()}"
        ) from None


class PreparedCollaboration:
    """A validated collaboration request: the mode, its config and the agent specs."""

    def __init__(self, op: CollaborationOp, config: ModeConfig, agents: tuple[AgentSpec, ...]) -> None:
        self.op = op
        self.config = config
        self.agents = agents

    @property
    def total_agents(self) -> int:
        return sum(a.count for a in self.agents)


def prepare_collaboration(
    mode: str | type[CollaborationOp] | CollaborationOp,
    agents: Sequence[AgentSpec | Mapping[str, Any]] | None,
    options: Mapping[str, Any] | None = None,
    *,
    max_agents: int = DEFAULT_MAX_AGENTS,
) -> PreparedCollaboration:
    """Validate a collaboration without running it (the server answers 400 from this).

    Raises:
        InvalidCollaboration: naming the offending field.
    """
    if isinstance(mode, CollaborationOp):
        op = mode
    elif isinstance(mode, type) and issubclass(mode, CollaborationOp):
        op = mode()
    elif isinstance(mode, str):
        op = get_mode(mode)()
    else:
        raise InvalidCollaboration("collaboration.mode", f"must be a mode name, got {type(mode).__name__}")
    config = build_config(op.Config, dict(options or {}))
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
    if not specs:
        specs = list(op.default_agents)
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
    return PreparedCollaboration(op, config, tuple(specs))


class CollaborationContext:
    """What a mode's ``run`` works with: the shared context handle, role actors, events.

    Attributes:
        config: the mode's validated config.
        agents: the agent specs of the request.
        engine: the default engine bridge; ``engines`` maps model names to bridges.
        context: the task context composed once into a handle (shared prefix of every role).
    """

    def __init__(
        self,
        *,
        op: CollaborationOp,
        config: ModeConfig,
        agents: tuple[AgentSpec, ...],
        engine: EngineBridge,
        engines: Mapping[str, EngineBridge],
        context: KVHandle,
        messages: tuple[Mapping[str, Any], ...],
        scope: Any,
        on_event: EventCallback | None,
    ) -> None:
        self.op = op
        self.mode = op.name
        self.config = config
        self.agents = agents
        self.engine = engine
        self.engines = engines
        self.context = context
        self.messages = messages
        self.records: dict[str, AgentRecord] = {}
        self.roles: dict[str, Role] = {}
        self.votes: dict[str, int] | None = None
        self.rounds = 1
        self.early_stopped = False
        self.extra: dict[str, Any] = {}
        self._scope = scope
        self._on_event = on_event
        self._contexts: dict[str, KVHandle] = {engine.model: context}
        self._t0 = anyio.current_time()

    # -- events ----------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the collaboration started (the event loop's clock: virtual under a mock clock)."""
        return anyio.current_time() - self._t0

    async def emit(self, type: str, agent: str | None = None, **data: Any) -> None:
        """Send an event to the caller (streaming, tracing)."""
        if self._on_event is None:
            return
        result = self._on_event(event(type, agent, time=self.now(), **data))
        if result is not None:
            await result

    # -- engines and prompts ------------------------------------------------------------
    def bridge_for(self, spec: AgentSpec) -> EngineBridge:
        """The bridge that runs ``spec`` (see ``bridge_for_spec``)."""
        return bridge_for_spec(spec, self.engine, self.engines)

    def context_for(self, bridge: EngineBridge) -> KVHandle:
        """The task context on ``bridge``'s model (composed once per model).

        Another model has another tokenizer: composing the messages again with
        its template is the one documented place where text is re-tokenized.
        """
        handle = self._contexts.get(bridge.model)
        if handle is None:
            handle = bridge.chat.context(list(self.messages))
            self._contexts[bridge.model] = handle
        return handle

    def transfer(self, handle: KVHandle, bridge: EngineBridge) -> KVHandle:
        """``handle`` on another model: same token ids when the tokenizers match, else re-tokenized."""
        if handle.model == bridge.model:
            return handle
        source = self.engines.get(handle.model, self.engine)
        if source.tokenizer_fingerprint() == bridge.tokenizer_fingerprint():
            return bridge.handle(handle.token_ids)
        return bridge.handle(bridge.tokenize(handle.text))

    def prompt(
        self,
        spec: AgentSpec,
        *,
        base: KVHandle | None = None,
        instructions: str | None = None,
        parts: Sequence[str | KVHandle] = (),
        bridge: EngineBridge | None = None,
    ) -> KVHandle:
        """``base`` (default: the context) + one user turn + the assistant's opening.

        The user turn holds ``parts`` (text, or handles spliced as token ids) and
        then the role's instructions: shared things first, role-specific last.
        """
        bridge = bridge or self.bridge_for(spec)
        chat = bridge.chat
        handle = base if base is not None else self.context_for(bridge)
        text = spec.instructions if instructions is None else instructions
        pieces = [*parts, text] if text else list(parts)
        if len(pieces) == 1:
            handle = chat.append(handle, "user", pieces[0])
        elif pieces:
            handle = handle.extend(chat.turn("user", splice(bridge, pieces)))
        return chat.generation_prompt(handle)  # type: ignore[no-any-return]

    def sampling(
        self,
        spec: AgentSpec,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        constrained: bool = False,
    ) -> Sampling:
        """Sampling for one of ``spec``'s turns: the spec's values, else the config's."""
        answer = self.config.answer
        temp = spec.temperature if spec.temperature is not None else self.config.temperature
        if temperature is not None:
            temp = temperature
        return Sampling(
            max_tokens=max_tokens or spec.max_tokens or self.config.max_tokens,
            temperature=temp,
            top_p=spec.top_p or 1.0,
            choices=answer.choices if (constrained and answer is not None) else None,
            regex=answer.regex if (constrained and answer is not None) else None,
        )

    def normalize(self, text: str) -> str:
        answer = self.config.answer
        return normalize_answer(text, answer.choices if answer is not None else None)

    # -- roles -----------------------------------------------------------------------
    async def spawn(self, agent: str, spec: AgentSpec, role: str | None = None) -> Role:
        """Spawn one role actor in this collaboration's scope."""
        bridge = self.bridge_for(spec)
        record = AgentRecord(
            name=agent, role=role or spec.role or spec.name, adapter=spec.adapter,
            model=spec.model,
        )
        self.records[agent] = record
        actor = RoleActor(agent=agent, spec=spec, bridge=bridge, record=record, emit=self.emit, clock=self.now)
        # temporary: a role that fails is recorded as failed, never silently restarted
        ref = self._scope.spawn(lambda: actor, name=agent, restart=RestartKind.TEMPORARY)
        role_ = Role(agent=agent, spec=spec, ref=ref, actor=actor, record=record, bridge=bridge)
        self.roles[agent] = role_
        return role_

    def spawn_actor(self, behaviour: Callable[[], Any] | type, *, name: str) -> Any:
        """Spawn any actor behaviour of yours in this collaboration's scope (a tool, a checker…).

        It lives exactly as long as the collaboration: cancelled and cleaned up with it.
        """
        return self._scope.spawn(behaviour, name=name, restart=RestartKind.TEMPORARY)

    async def spawn_all(self, specs: Sequence[AgentSpec] | None = None, role: str | None = None) -> list[Role]:
        """Spawn every agent of ``specs`` (default: all of the request's agents)."""
        out = []
        for spec in self.agents if specs is None else specs:
            for agent in spec.agent_names():
                out.append(await self.spawn(agent, spec, role))
        return out

    async def answer_all(self, roles: Sequence[Role], label: str) -> dict[str, TurnDone]:
        """Every role answers at once from the shared context with its own instructions.

        Returns the turns that finished (``stop`` or ``length``), in ``roles`` order;
        pruned or aborted roles are left out.
        """
        done: dict[str, TurnDone] = {}

        async def answer(role: Role) -> None:
            turn = await self.turn(role, Turn(self.prompt(role.spec), self.sampling(role.spec), label=label))
            if turn.result is not None and turn.result.finish_reason in ("stop", "length"):
                done[role.agent] = turn

        async with anyio.create_task_group() as tg:
            for role in roles:
                tg.start_soon(answer, role)
        return {role.agent: done[role.agent] for role in roles if role.agent in done}

    async def prune(self, role: Role, reason: str = "early_stop") -> None:
        """Stop a role that is no longer needed: abort its engine request, record it as pruned."""
        if role.actor.pruned:
            return
        role.actor.pruned = True
        # pruned unless it already finished a turn and has nothing running now
        if role.record.requests == 0 or role.actor.current_request is not None:
            role.record.finish_reason = "pruned"
        request = role.running_request
        if request is not None:
            await role.bridge.abort(request)
        await self.emit("pruned", role.agent, reason=reason)

    async def turn(self, role: Role, turn: Turn) -> TurnDone:
        """Ask ``role`` to generate ``turn``; a role that fails is recorded, then re-raised."""
        try:
            return await role.turn(attrs.evolve(turn, sent_at=self.now()))
        except Exception as exc:
            role.record.finish_reason = "error"
            role.record.error = f"{type(exc).__name__}: {getattr(exc, 'cause', exc)}"
            await self.emit("agent_finished", role.agent, finish_reason="error", error=role.record.error)
            raise


def bridge_for_spec(spec: AgentSpec, engine: EngineBridge, engines: Mapping[str, EngineBridge]) -> EngineBridge:
    """The bridge that runs ``spec``: its ``model``'s (default ``engine``), with its adapter checked.

    Raises:
        InvalidCollaboration: the model is not served or the adapter not registered there.
    """
    bridge = engine
    if spec.model is not None and spec.model != engine.model:
        found = engines.get(spec.model)
        if found is None:
            raise InvalidCollaboration("agents.model", f"model {spec.model!r} is not served; served: {sorted(engines)}")
        bridge = found
    if spec.adapter is not None and spec.adapter not in bridge.adapters:
        raise InvalidCollaboration(
            "agents.adapter", f"unknown adapter {spec.adapter!r}; registered: {sorted(bridge.adapters)}"
        )
    return bridge


def find_role(agents: Sequence[AgentSpec], role: str) -> tuple[list[AgentSpec], AgentSpec | None]:
    """(the other specs, the one spec whose ``role`` or name is ``role``, or None).

    Raises:
        InvalidCollaboration: that spec has ``count`` > 1 (a single-agent role).
    """
    for i, spec in enumerate(agents):
        if spec.role == role or spec.name == role:
            if spec.count != 1:
                raise InvalidCollaboration("agents.count", f"the {role} must have count 1")
            return [a for j, a in enumerate(agents) if j != i], spec
    return list(agents), None


def split_final_role(agents: Sequence[AgentSpec], role: str) -> tuple[list[AgentSpec], AgentSpec]:
    """(the other specs, the spec playing ``role``: the one named so, else the last one).

    For modes whose last step is one agent (aggregator, verifier).
    """
    others, spec = find_role(agents, role)
    if spec is None:
        if not agents:
            raise InvalidCollaboration("agents", f"needs a {role}")
        others, spec = list(agents[:-1]), agents[-1]
        if spec.count != 1:
            raise InvalidCollaboration("agents.count", f"the {role} (the last agent) must have count 1")
    if not others:
        raise InvalidCollaboration("agents", f"needs other agents besides the {role}")
    return others, spec


def splice(bridge: EngineBridge, pieces: Sequence[str | KVHandle]) -> tuple[int, ...]:
    """Token ids of mixed content: text is tokenized, handles are spliced as they are.

    A handle spliced mid-turn drops its trailing end-of-turn token (a generation
    that stopped ends with one), so a turn never holds a stray end-of-turn.
    """
    eot_id = bridge.chat.template.eot_token_id
    ids: list[int] = []
    for piece in pieces:
        if isinstance(piece, KVHandle):
            if piece.model != bridge.model:
                raise ValueError(f"a {piece.model!r} handle cannot be spliced into a {bridge.model!r} prompt")
            tokens = piece.token_ids
            if tokens and tokens[-1] == eot_id:
                tokens = tokens[:-1]
            ids.extend(tokens)
        elif piece:
            ids.extend(bridge.tokenize(piece))
    return tuple(ids)


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
    mode: str | type[CollaborationOp] | CollaborationOp | PreparedCollaboration,
    context: ContextInput,
    agents: Sequence[AgentSpec | Mapping[str, Any]] | None = None,
    *,
    engines: Mapping[str, EngineBridge] | None = None,
    on_event: EventCallback | None = None,
    runtime: Any = None,
    max_agents: int = DEFAULT_MAX_AGENTS,
    **options: Any,
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
        **options: the mode's config (``early_stop``, ``rounds``, ``answer``…).

    Cancelling the calling task cancels every role actor and aborts every
    engine request the collaboration started.

    Raises:
        InvalidCollaboration: the request is invalid (names the field).
        CollaborationFailed: the collaboration could not produce an answer.
    """
    if isinstance(mode, PreparedCollaboration):
        if agents or options:
            raise TypeError("a PreparedCollaboration already holds its agents and options")
        prepared = mode
    else:
        prepared = prepare_collaboration(mode, agents, options, max_agents=max_agents)
    all_engines = {engine.model: engine, **dict(engines or {})}
    for spec in prepared.agents:  # unknown models and adapters fail before anything runs
        bridge_for_spec(spec, engine, all_engines)
    messages = _messages(context)
    handle = context if isinstance(context, KVHandle) else engine.chat.context(list(messages))
    config = prepared.config

    async def run_in(rt: Any) -> Outcome:
        async with rt.scope(f"{prepared.op.name}-{next(_collab_ids)}") as scope:
            ctx = CollaborationContext(
                op=prepared.op, config=config, agents=prepared.agents, engine=engine,
                engines=all_engines, context=handle, messages=messages, scope=scope,
                on_event=on_event,
            )
            try:
                answer = await prepared.op.run(ctx)
            except (InvalidCollaboration, CollaborationFailed):
                raise
            except EngineDied as exc:
                raise CollaborationFailed(f"the engine died: {exc}", tuple(ctx.records.values()), exc) from exc
            except Exception as exc:  # cancellation is a BaseException: it passes through
                raise CollaborationFailed(
                    f"{ctx.mode} failed: {type(exc).__name__}: {getattr(exc, 'cause', None) or exc}",
                    tuple(ctx.records.values()), exc,
                ) from exc
            for role in ctx.roles.values():  # anything still running is no longer needed
                if role.running_request is not None:
                    await ctx.prune(role, "collaboration_finished")
                role.record.messages = role.ref.mailbox_stats().delivered
            outcome = _outcome(ctx, answer, ctx.now())
            await ctx.emit("final", None, answer=answer, usage=outcome.usage.to_dict())
            return outcome

    with anyio.fail_after(config.timeout):  # None: no limit
        return await _with_runtime(runtime, engine, run_in)


async def _with_runtime(runtime: Any, engine: EngineBridge, body: Callable[[Any], Awaitable[Outcome]]) -> Outcome:
    if runtime is not None:
        return await body(runtime)
    from ._runtime import Runtime

    outcome: Outcome | None = None
    async with Runtime(engine=engine) as rt:
        outcome = await body(rt)
    if outcome is None:  # the runtime ended the block itself (an escalation)
        raise CollaborationFailed("the actor runtime stopped the collaboration", cause=rt.failure)
    return outcome


def _outcome(ctx: CollaborationContext, answer: str, wall: float) -> Outcome:
    records = tuple(ctx.records.values())
    done = [r.completion_tokens for r in records if r.finish_reason in ("stop", "length")]
    mean_done = sum(done) / len(done) if done else 0.0
    saved = sum(max(0.0, mean_done - r.completion_tokens) for r in records if r.finish_reason == "pruned")
    usage = Usage(
        prompt_tokens=sum(r.prompt_tokens for r in records),
        cached_tokens=sum(r.cached_tokens for r in records),
        completion_tokens=sum(r.completion_tokens for r in records),
        saved_completion_tokens=round(saved),
    )
    return Outcome(
        mode=ctx.mode, answer=answer, agents=records, usage=usage, rounds=ctx.rounds,
        early_stopped=ctx.early_stopped, votes=ctx.votes, wall_time=wall, extra=dict(ctx.extra),
    )
