"""The role actor: every agent of a collaboration is one, spawned in its scope.

A role actor owns its engine requests. It receives ``Turn`` messages carrying
KV handles (the prompt to continue), generates on the engine bridge, streams
its deltas as events, keeps its own token accounting, and replies with the
output handle — which the operator forwards to other roles' mailboxes.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from ..actors import Actor, ActorRef
from ..engine_bridge import (
    EngineBridge,
    GenerationResult,
    KVHandle,
    Retain,
    Sampling,
    render_tool_result,
)
from ._outcome import AgentRecord
from ._spec import AgentSpec
from ._tools import (
    DEFAULT_MAX_TOOL_STEPS,
    TOOL_TIMES,
    AgentToolChoice,
    Tool,
    agent_tool_plan,
    run_calls,
)


@attrs.frozen
class Turn:
    """Ask a role to generate: continue ``prompt`` with ``sampling`` at ``priority``.

    ``label`` names the step for events ("draft", "critique", "answer"…); ``round``
    is the collaboration round it belongs to. ``keep`` keeps the output's KV
    blocks resident (retained under the agent's key, superseding its previous
    turn) until the collaboration ends: set it False for a last step that
    nothing extends.
    """

    prompt: KVHandle
    sampling: Sampling
    priority: int = 0
    label: str = "turn"
    round: int | None = None
    sent_at: float | None = None
    keep: bool = True


@attrs.frozen
class TurnDone:
    """A role's reply: the engine result (its ``handle`` is prompt + output)."""

    agent: str
    result: GenerationResult | None
    skipped: bool = False

    @property
    def text(self) -> str:
        """The raw generated text."""
        return "" if self.result is None else self.result.text

    @property
    def content(self) -> str:
        """The generated text as content: no end-of-turn marker, no surrounding space."""
        return "" if self.result is None else self.result.content.strip()

    @property
    def finish_reason(self) -> str:
        return "aborted" if self.result is None else self.result.finish_reason


class RoleActor(Actor):
    """The behaviour of one agent: generate each ``Turn`` it receives, one at a time."""

    def __init__(
        self,
        *,
        agent: str,
        spec: AgentSpec,
        bridge: EngineBridge,
        record: AgentRecord,
        emit: Callable[..., Awaitable[None]],
        clock: Callable[[], float],
        delta_events: bool = True,
        retention_key: str | None = None,
        group: str | None = None,
        tools: Mapping[str, Tool] | None = None,
        max_tool_steps: int = DEFAULT_MAX_TOOL_STEPS,
        tool_choice: AgentToolChoice = "auto",
    ) -> None:
        super().__init__()
        self.tools = dict(tools or {})
        self.max_tool_steps = max_tool_steps
        # "required": every step but the last is a call (then the model answers)
        self._plan = agent_tool_plan(self.tools, tool_choice) if self.tools else None
        self.agent = agent
        self.spec = spec
        self.bridge = bridge
        self.record = record
        self._emit = emit
        self._delta_events = delta_events
        self._clock = clock
        self.current_request: str | None = None
        self.retention_key = retention_key
        self.group = group
        self._pruned = False

    @property
    def pruned(self) -> bool:
        """Whether the collaboration no longer needs this agent (its turns are skipped)."""
        return self._pruned

    def prune(self) -> str | None:
        """Mark this agent pruned; return its running engine request (to abort), if any.

        It is recorded as pruned unless it already finished a turn and runs none now.
        """
        self._pruned = True
        if self.record.requests == 0 or self.current_request is not None:
            self.record.finish_reason = "pruned"
        return self.current_request

    def revive(self) -> None:
        """Make a pruned agent runnable again (a graph loop sent the flow back to it)."""
        self._pruned = False

    async def receive(self, message: object) -> object:
        if isinstance(message, Turn):
            return await self._turn(message)
        return await super().receive(message)

    async def _turn(self, turn: Turn) -> TurnDone:
        record = self.record
        if self.pruned:  # pruned before its prefill: never reaches the engine
            record.finish_reason = "pruned"
            return TurnDone(self.agent, None, skipped=True)
        if record.started is None:
            record.started = self.bridge.clock()
        handler_start = self._clock()
        await self._emit(
            "agent_started",
            self.agent,
            role=record.role,
            label=turn.label,
            round=turn.round,
            sent_at=turn.sent_at if turn.sent_at is not None else handler_start,
        )
        if self.pruned:  # no checkpoint between this test and the request's registration
            record.finish_reason = "pruned"
            return TurnDone(self.agent, None, skipped=True)
        plan = self._plan if not turn.sampling.constrained else None
        if plan is None:  # constrained steps (answers) make no tool calls
            return await self._generate(turn, turn.prompt, turn.sampling, keep=turn.keep)
        prompt = turn.prompt
        for step in range(self.max_tool_steps + 1):
            last = step == self.max_tool_steps
            sampling = turn.sampling if last else plan.constrain(turn.sampling)
            done = await self._generate(
                turn, prompt, sampling, keep=turn.keep or not last, tool_step=not last
            )
            result = done.result
            if last or result is None or result.finish_reason != "stop" or self.pruned:
                return done
            _, calls = plan.parse(result.content)
            if not calls:
                return done
            prompt = await self._call_tools(turn, result.handle, calls)
            # each step is its own engine request: its own span in traces and views
            now = self._clock()
            await self._emit(
                "agent_started",
                self.agent,
                role=self.record.role,
                label=turn.label,
                round=turn.round,
                sent_at=now,
                step=step + 1,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _call_tools(
        self, turn: Turn, handle: KVHandle, calls: Sequence[Mapping[str, Any]]
    ) -> KVHandle:
        """Run the calls and return the thread with their results and a new assistant opening.

        The thread's KV stays retained (the step that made the calls kept it), so
        the next step computes only the results' tokens.
        """
        for call in calls:
            fn = call["function"]
            await self._emit(
                "tool_call",
                self.agent,
                label=turn.label,
                round=turn.round,
                call_id=call["id"],
                name=fn["name"],
                arguments=fn["arguments"],
            )
        outcomes = await run_calls(self.tools, calls)
        self.record.tool_calls += len(calls)
        chat = self.bridge.chat
        thread = chat.close_turn(handle)
        role = "tool" if "tool" in chat.template.roles else "user"
        for call, outcome in zip(calls, outcomes, strict=True):
            await self._emit(
                "tool_result",
                self.agent,
                label=turn.label,
                round=turn.round,
                call_id=call["id"],
                name=call["function"]["name"],
                ok=outcome.ok,
                output=outcome.text[:500],
                duration=outcome.duration,
            )
            thread = chat.append(thread, role, render_tool_result(outcome.text))
        return chat.generation_prompt(thread)

    async def _generate(
        self,
        turn: Turn,
        prompt: KVHandle,
        sampling: Sampling,
        *,
        keep: bool,
        tool_step: bool = False,
    ) -> TurnDone:
        record = self.record
        submitted = self._clock()
        first_token: float | None = None
        retain = None
        if keep and self.retention_key:
            # a step that may call tools comes back after them: their usual duration
            next_use = TOOL_TIMES.expected(self.tools) if tool_step else None
            retain = Retain(self.retention_key, next_use=next_use)
        async with self.bridge.stream(
            prompt,
            sampling,
            adapter=self.spec.adapter,
            priority=turn.priority,
            retain=retain,
            group=self.group,
        ) as gen:
            self.current_request = gen.request_id
            try:
                async for delta in gen:
                    if first_token is None:
                        first_token = self._clock()
                    if self._delta_events and delta.text:
                        await self._emit("delta", self.agent, text=delta.text, label=turn.label)
            finally:
                self.current_request = None
            result = gen.result
        assert result is not None
        record.requests += 1
        record.prompt_tokens += result.prompt_tokens
        record.cached_tokens += result.cached_tokens
        record.completion_tokens += result.completion_tokens
        record.finished = self.bridge.clock()
        record.round = turn.round
        record.output = result.content.strip()
        if result.finish_reason == "abort":
            record.finish_reason = "pruned" if self.pruned else "aborted"
        elif result.finish_reason in ("stop", "length"):
            record.finish_reason = result.finish_reason
        await self._emit(
            "agent_finished",
            self.agent,
            label=turn.label,
            round=turn.round,
            finish_reason=record.finish_reason,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            completion_tokens=result.completion_tokens,
            cache_miss=result.cache_miss,
            expected_cached_tokens=result.expected_cached_tokens,
            request_id=result.request_id,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            submitted=submitted,
            first_token=first_token,
            finished=self._clock(),
        )
        return TurnDone(self.agent, result)


@attrs.define(eq=False)
class Role:
    """The operator's view of one agent: its actor reference and its record."""

    agent: str
    spec: AgentSpec
    ref: ActorRef
    actor: RoleActor
    record: AgentRecord
    bridge: EngineBridge
    thread: KVHandle | None = None  # the agent's own append-only context, when it has one
    reasoning: KVHandle | None = None  # its last free-text output, as a handle segment

    async def turn(self, turn: Turn, *, timeout: float | None = None) -> TurnDone:
        """Ask the role to generate (through its mailbox) and wait for its reply."""
        # no ask deadline of its own: a generation takes as long as it takes; the
        # collaboration's timeout (a cancel scope around it) bounds the whole thing
        reply = await self.ref.ask(turn, timeout=math.inf if timeout is None else timeout)
        assert isinstance(reply, TurnDone)
        return reply

    @property
    def running_request(self) -> str | None:
        return self.actor.current_request
