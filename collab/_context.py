"""``CollaborationContext``: what a mode's ``run`` works with.

It holds the shared context handle, spawns role actors in the collaboration's
scope, builds their prompts and sampling, records every agent and emits every
event. Modes read from it and return a ``ModeResult``; they do not write
results into it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic

import anyio
import attrs

from ..actors import Actor, ActorRef, ActorScope, RestartKind
from ..engine_bridge import EngineBridge, KVHandle, Sampling
from ._agent import Role, RoleActor, Turn, TurnDone
from ._budget import TokenMeter
from ._errors import CollaborationFailed, InvalidCollaboration
from ._mode import C, CollaborationOp
from ._outcome import AgentRecord, CollaborationEvent, event
from ._scheduling import ServicePolicy, arrival_number
from ._spec import AgentSpec
from ._tally import normalize_answer
from ._tools import DEFAULT_MAX_TOOL_STEPS, AgentToolChoice, Tool

#: A caller's event sink: a plain or an async function of each event.
EventCallback = Callable[[CollaborationEvent], Awaitable[None] | None]


class CollaborationContext(Generic[C]):
    """What a mode's ``run`` works with: the shared context handle, role actors, events.

    Attributes:
        config: the mode's validated config (of the mode's ``Config`` class).
        agents: the agent specs of the request.
        engine: the default engine bridge; ``engines`` maps model names to bridges.
        context: the task context composed once into a handle (shared prefix of every role).
        question: the user's question as text ("" when the context was a bare handle).
        records: what every spawned agent did, by agent name.
    """

    def __init__(
        self,
        *,
        op: CollaborationOp[C],
        config: C,
        agents: tuple[AgentSpec, ...],
        engine: EngineBridge,
        engines: Mapping[str, EngineBridge],
        context: KVHandle,
        messages: tuple[Mapping[str, Any], ...],
        scope: ActorScope,
        question: str = "",
        on_event: EventCallback | None,
        scheduling: ServicePolicy | None = None,
        tools: Mapping[str, Tool] | None = None,
        max_tool_steps: int = DEFAULT_MAX_TOOL_STEPS,
        tool_choice: AgentToolChoice = "auto",
        token_budget: int | None = None,
    ) -> None:
        self.op = op
        self.meter = TokenMeter(token_budget)
        self.tools = dict(tools or {})
        self.max_tool_steps = max_tool_steps
        self.tool_choice: AgentToolChoice = tool_choice
        self.scheduling = scheduling if scheduling is not None else ServicePolicy()
        self.mode = op.name
        self.config = config
        self.agents = agents
        self.engine = engine
        self.engines = engines
        self.context = context
        self.messages = messages
        self.question = question
        self.records: dict[str, AgentRecord] = {}
        self.roles: dict[str, Role] = {}
        self._scope = scope
        self._on_event = on_event
        self._contexts: dict[str, KVHandle] = {engine.model: context}
        self._t0 = anyio.current_time()
        self._arrival = arrival_number()

    # -- events ----------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the collaboration started (the loop's clock: virtual under a mock one)."""
        return anyio.current_time() - self._t0

    async def emit(self, type: str, agent: str | None = None, **data: Any) -> None:
        """Send an event to the caller (streaming, tracing); ``type``: an ``EventType`` or yours."""
        if self._on_event is None:
            return
        result = self._on_event(event(type, agent, time=self.now(), **data))
        if result is not None:
            await result

    def failure(self, reason: str) -> CollaborationFailed:
        """The error to raise when the mode cannot produce an answer (every record attached)."""
        return CollaborationFailed(reason, tuple(self.records.values()))

    def tools_for(self, spec: AgentSpec) -> dict[str, Tool]:
        """The tools ``spec`` may call: the ones it names, else all of the collaboration's."""
        if spec.tools is None:
            return dict(self.tools)
        return {name: self.tools[name] for name in spec.tools}

    # -- engines and prompts ------------------------------------------------------------
    def bridge_for(self, spec: AgentSpec) -> EngineBridge:
        """The bridge that runs ``spec`` (see ``bridge_for_spec``)."""
        return bridge_for_spec(spec, self.engine, self.engines)

    def without_logprobs(self, specs: Sequence[AgentSpec] | None = None) -> AgentSpec | None:
        """The first agent of ``specs`` (default: all) whose model reports no logprobs
        (a remote chat-completions model), or None."""
        return next(
            (s for s in (self.agents if specs is None else specs) if self.bridge_for(s).remote),
            None,
        )

    def require_logprobs(
        self, field: str, reads: str, specs: Sequence[AgentSpec] | None = None
    ) -> None:
        """Refuse, naming ``field``, when an agent of ``specs`` (default: all) runs on a model
        that reports no logprobs: ``reads`` says what needs them. Called before any
        request, so nothing is half done."""
        spec = self.without_logprobs(specs)
        if spec is not None:
            raise InvalidCollaboration(
                field,
                f"{reads}; agent {spec.name!r} runs on remote model {spec.model!r}, "
                "which reports none",
            )

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
        """``handle`` on another model: same ids if the tokenizers match, else re-tokenized."""
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
        A handle of another model is ``transfer``red first (re-tokenized when the
        tokenizers differ: a remote role, another served model).
        """
        bridge = bridge or self.bridge_for(spec)
        chat = bridge.chat
        handle = base if base is not None else self.context_for(bridge)
        text = spec.instructions if instructions is None else instructions
        moved = [self.transfer(p, bridge) if isinstance(p, KVHandle) else p for p in parts]
        pieces = [*moved, text] if text else moved
        if len(pieces) == 1:
            handle = chat.append(handle, "user", pieces[0])
        elif pieces:
            handle = handle.extend(chat.turn("user", chat.splice(pieces)))
        return chat.generation_prompt(handle)

    def sampling(
        self,
        spec: AgentSpec,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        constrained: bool = False,
    ) -> Sampling:
        """Sampling for one of ``spec``'s turns: the spec's values, else the config's
        (``stop`` and ``seed`` are the config's: ``turn`` gives each agent its own seed)."""
        config = self.config
        answer = config.answer
        temp = spec.temperature if spec.temperature is not None else config.temperature
        if temperature is not None:
            temp = temperature
        top_p = spec.top_p if spec.top_p is not None else config.top_p
        return Sampling(
            max_tokens=max_tokens or spec.max_tokens or config.max_tokens,
            temperature=temp,
            top_p=1.0 if top_p is None else top_p,
            seed=config.seed,
            stop=config.stop,
            choices=answer.choices if (constrained and answer is not None) else None,
            regex=answer.regex if (constrained and answer is not None) else None,
        )

    @property
    def retention_prefix(self) -> str:
        """The prefix of this collaboration's retention keys (all released when it ends)."""
        return f"{self._scope.name}/"

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The fixed answer choices of the collaboration, if it has any."""
        answer = self.config.answer
        return answer.choices if answer is not None else None

    async def normalize(self, text: str) -> str:
        """``text`` as a comparable answer (mapped to a choice when answers are constrained).

        A client's ``answer.extract`` pattern is matched in a worker thread (with its
        timeout), never on the event loop.
        """
        answer = self.config.answer
        extractor = answer.extractor if answer else None
        if extractor is None or self.choices is not None:
            return normalize_answer(text, self.choices)
        return await anyio.to_thread.run_sync(normalize_answer, text, None, extractor)

    # -- roles -----------------------------------------------------------------------
    async def spawn(self, agent: str, spec: AgentSpec, role: str | None = None) -> Role:
        """Spawn one role actor in this collaboration's scope."""
        bridge = self.bridge_for(spec)
        record = AgentRecord(
            name=agent, role=role or spec.role or spec.name, adapter=spec.adapter, model=spec.model
        )
        self.records[agent] = record
        actor = RoleActor(
            agent=agent,
            spec=spec,
            bridge=bridge,
            record=record,
            emit=self.emit,
            clock=self.now,
            retention_key=f"{self.retention_prefix}{agent}",
            group=self.group,
            tools=self.tools_for(spec),
            max_tool_steps=self.max_tool_steps,
            tool_choice=self.tool_choice,
        )
        # temporary: a role that fails is recorded as failed, never silently restarted
        ref = self._scope.spawn(lambda: actor, name=agent, restart=RestartKind.TEMPORARY)
        role_ = Role(agent=agent, spec=spec, ref=ref, actor=actor, record=record, bridge=bridge)
        self.roles[agent] = role_
        return role_

    def spawn_actor(self, behaviour: Callable[[], Actor] | type[Actor], *, name: str) -> ActorRef:
        """Spawn any actor behaviour of yours in this collaboration's scope (a tool, a checker…).

        It lives exactly as long as the collaboration: cancelled and cleaned up with it.
        """
        return self._scope.spawn(behaviour, name=name, restart=RestartKind.TEMPORARY)

    async def spawn_all(
        self, specs: Sequence[AgentSpec] | None = None, role: str | None = None
    ) -> list[Role]:
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
            prompt = self.prompt(role.spec)
            turn = await self.turn(role, Turn(prompt, self.sampling(role.spec), label=label))
            if turn.result is not None and turn.result.finish_reason in ("stop", "length"):
                done[role.agent] = turn

        async with anyio.create_task_group() as tg:
            for role in roles:
                tg.start_soon(answer, role)
        return {role.agent: done[role.agent] for role in roles if role.agent in done}

    async def prune(self, role: Role, reason: str = "early_stop") -> None:
        """Stop a role that is no longer needed: it marks itself pruned, its request is aborted."""
        if role.actor.pruned:
            return
        request = role.actor.prune()
        if request is not None:
            await role.bridge.abort(request)
        await self.emit("pruned", role.agent, reason=reason)

    @property
    def group(self) -> str:
        """This collaboration's identity, carried by every engine request it makes."""
        return self._scope.name

    def attained_service(self) -> int:
        """Engine work this collaboration consumed so far: computed prompt + generated tokens."""
        return sum(
            r.prompt_tokens - r.cached_tokens + r.completion_tokens for r in self.records.values()
        )

    def engine_priority(self, offset: int = 0, now: float | None = None) -> int:
        """The engine priority of this collaboration's request at critical-path ``offset``:
        its service level and arrival (``ServicePolicy``) plus the offset."""
        now = self.now() if now is None else now
        return self.scheduling.priority(self.attained_service(), now, offset, arrival=self._arrival)

    async def warm(self, role: Role, handle: KVHandle, offset: int = 0) -> None:
        """Prefill ``handle`` on ``role``'s engine, as a turn is: at this collaboration's
        priority, its prompt and one generated token counted against the token budget."""
        reserved = len(handle) + 1
        self.meter.reserve(reserved)  # TokenBudgetExceeded: nothing is sent
        used = 0
        try:
            warmed = await role.bridge.warm(
                handle, priority=self.engine_priority(offset), group=self.group
            )
            used = warmed.prompt_tokens + warmed.completion_tokens
        finally:
            self.meter.settle(reserved, used)
        role.record.prompt_tokens += warmed.prompt_tokens
        role.record.cached_tokens += warmed.cached_tokens

    async def turn(self, role: Role, turn: Turn) -> TurnDone:
        """Ask ``role`` to generate ``turn``; a role that fails is recorded, then re-raised.

        ``turn.priority`` is the step's critical-path offset; the request's engine
        priority adds the collaboration's service level (``ServicePolicy``).
        """
        now = self.now()
        priority = self.engine_priority(turn.priority, now)
        if turn.sampling.seed is not None:  # each agent its own stream: seed + its ordinal
            ordinal = list(self.roles).index(role.agent) if role.agent in self.roles else 0
            seed = (turn.sampling.seed + ordinal + 2**63) % 2**64 - 2**63
            turn = attrs.evolve(turn, sampling=attrs.evolve(turn.sampling, seed=seed))
        steps = 1 + self.max_tool_steps if self.tools_for(role.spec) else 1
        reserved = (len(turn.prompt) + turn.sampling.max_tokens) * steps
        self.meter.reserve(reserved)  # TokenBudgetExceeded: the turn is not sent
        record = role.record
        before = record.prompt_tokens + record.completion_tokens
        try:
            return await role.turn(attrs.evolve(turn, sent_at=now, priority=priority))
        except Exception as exc:
            role.record.finish_reason = "error"
            role.record.error = f"{type(exc).__name__}: {getattr(exc, 'cause', exc)}"
            await self.emit(
                "agent_finished", role.agent, finish_reason="error", error=role.record.error
            )
            raise
        finally:
            self.meter.settle(reserved, record.prompt_tokens + record.completion_tokens - before)


def bridge_for_spec(
    spec: AgentSpec, engine: EngineBridge, engines: Mapping[str, EngineBridge]
) -> EngineBridge:
    """The bridge that runs ``spec``: its ``model``'s (default ``engine``), its adapter checked.

    Raises:
        InvalidCollaboration: the model is not served or the adapter not registered there.
    """
    bridge = engine
    if spec.model is not None and spec.model != engine.model:
        found = engines.get(spec.model)
        if found is None:
            raise InvalidCollaboration(
                "agents.model", f"model {spec.model!r} is not served; served: {sorted(engines)}"
            )
        bridge = found
    if spec.adapter is not None and spec.adapter not in bridge.adapters:
        raise InvalidCollaboration(
            "agents.adapter",
            f"unknown adapter {spec.adapter!r}; registered: {sorted(bridge.adapters)}",
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
            raise InvalidCollaboration(
                "agents.count", f"the {role} (the last agent) must have count 1"
            )
    if not others:
        raise InvalidCollaboration("agents", f"needs other agents besides the {role}")
    return others, spec
