"""HTTP sessions: a finished turn's KV stays resident for the client's next turn.

An agent loop over HTTP (the openai SDK, LangGraph, the Agents SDK) sends
each turn as a new request that re-sends the whole conversation. OpenAI's own
fields say what it wants kept, and the server keeps it:

* ``prompt_cache_options.ttl`` (a minimum lifetime) and the deprecated
  ``prompt_cache_retention`` (``"in_memory"``: the server's default TTL;
  ``"24h"``: 24 hours) retain the request's prompt + output blocks for that
  long, clamped to the server's ceiling (``serve --session-ttl``/
  ``--session-ttl-max``). ``prompt_cache_key`` groups the requests whose gaps
  predict the next one (it is a hint, not a thread id).
* A lifetime nobody asked for comes from the gaps: with ``prompt_cache_key``
  alone, or for a reply that ends in ``tool_calls`` (Continuum's trigger: it
  will come back with the tool's result, so frameworks that never set the
  fields benefit too), a turn is kept for ``GAP_TTL_FACTOR`` times the 95th
  percentile of the gaps this API key's turns of that kind have shown
  (``learned_ttl``), and the server's default until ``MIN_GAPS`` were seen. A
  client never says that its program ended; without this, each finished
  program's last turn would hold its blocks, ahead of newer programs, for the
  whole default lifetime (measured: an HTTP agent loop then computed more than
  a plain client on vLLM's server).
* A retention is keyed by request and scoped by API key: parallel requests of
  one cache key never release each other's; a turn is superseded only by the
  retention of a request that extends it (``Retain.scope``).
* Each turn of a session is served at its program's first-come-first-served
  priority, so under pressure a returning session goes before a new program,
  and a new program may not evict a session that is about to come back (the
  engine's admission rule, ``engine_bridge.Retain``).
* A client re-sends generated text, and re-tokenizing it need not give the ids
  that were generated: an assistant message whose text is one this server
  generated for the same API key is spliced back as the generated ids.

Retention is a best effort with a priority, not a guarantee: under pressure
the engine's policy may still release a turn (its next use is then recomputed).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from statistics import median
from typing import Final

import attrs

from ..collab import arrival_priority
from ..engine_bridge import EngineBridge, KVHandle, Retain
from ._errors import bad_request

#: ``prompt_cache_retention`` values and the lifetime each maps to (None: the server's default).
RETENTION_VALUES: Final[dict[str, float | None]] = {"in_memory": None, "24h": 86400.0}
_TTL = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: Gaps remembered per label (the median predicts the next one).
_GAPS = 32
#: Gaps of one kind of turn (keyed sessions, tool calls) remembered per API key for
#: ``learned_ttl``, and how many it needs before it replaces the server's default.
_KIND_GAPS = 256
MIN_GAPS: Final = 8
#: A learned lifetime is this many times the gaps' 95th percentile (a later turn is rare:
#: its recompute costs less than holding every finished program's last turn that long).
GAP_TTL_FACTOR: Final = 1.5
#: ... and never shorter than this (seconds): a burst of quick turns teaches nothing.
MIN_LEARNED_TTL: Final = 5.0
#: With several API keys, the fraction of the retention budget one key may hold by default.
DEFAULT_KEY_RETENTION_SHARE: Final = 0.5
#: Generated texts remembered for splicing, per server.
_SPLICES = 4096
#: Gap series (one per label: each ``prompt_cache_key`` names one) remembered per API key;
#: past it that key's least recently observed goes (a client inventing cache keys would
#: otherwise grow the server without bound, and evicts only its own key's series).
MAX_GAP_SERIES: Final = 1024


def parse_ttl(value: str) -> float:
    """``"30m"``, ``"90s"``, ``"2h"``, ``"1d"`` in seconds; a 400 naming the field otherwise."""
    match = _TTL.match(value)
    if match is None:
        raise bad_request(
            f"prompt_cache_options.ttl must be a duration like '30m', '90s' or '2h', got {value!r}",
            "prompt_cache_options.ttl",
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


@attrs.frozen
class SessionSettings:
    """How the server keeps sessions.

    Attributes:
        default_ttl: seconds a turn is retained when the request asks for caching
            without a lifetime (OpenAI's default is 30 minutes).
        max_ttl: the ceiling of any requested lifetime.
        tool_call_ttl: seconds a reply ending in ``tool_calls`` is retained when the
            request names no session (until the tool's result comes back).
        max_per_key: live retained turns of one API key; past it its oldest goes.
        shared_cache: with several API keys, share one prefix cache between them
            (faster for common prompts; any key can then tell from ``cached_tokens``
            whether another key sent a text). Off: each key's cache is salted apart.
        key_retention_share: with several API keys, the fraction of an engine's
            retention budget one key's retained turns may hold together (``Retain.share``):
            one key's warm sessions never hold the whole budget against the others.
    """

    default_ttl: float = 1800.0
    max_ttl: float = 86400.0
    tool_call_ttl: float = 120.0
    max_per_key: int = 256
    shared_cache: bool = False
    key_retention_share: float = attrs.field(default=DEFAULT_KEY_RETENTION_SHARE)

    @key_retention_share.validator
    def _share(self, _: attrs.Attribute[float], value: float) -> None:
        if not 0 < value <= 1:
            raise ValueError(f"key_retention_share must be in (0, 1], got {value}")


@attrs.frozen
class SessionPlan:
    """What one request does with the session machinery."""

    retain: Retain | None
    priority: int
    #: the retention is only for a reply that ends in tool calls (released otherwise)
    only_tool_calls: bool
    label: str


@attrs.define(eq=False)
class _Turn:
    key: str
    #: the engine that retains it (its release goes there, whichever request ends it)
    bridge: EngineBridge
    tokens: tuple[int, ...]
    finished: float
    priority: int
    label: str


@attrs.define(eq=False)
class Sessions:
    """Per-API-key retained turns, their gaps, and the generated ids to splice back."""

    settings: SessionSettings = attrs.field(factory=SessionSettings)
    #: each API key's retained turns hold at most ``settings.key_retention_share`` of an
    #: engine's retention budget (set by the app when it has several keys)
    per_key_share: bool = False
    _turns: dict[str, OrderedDict[str, _Turn]] = attrs.field(factory=dict, init=False)
    #: per API key: its gap series, least recently observed first (``MAX_GAP_SERIES``)
    _gaps: dict[str, OrderedDict[str, deque[float]]] = attrs.field(factory=dict, init=False)
    _generated: OrderedDict[tuple[str, str, str], tuple[int, ...]] = attrs.field(
        factory=OrderedDict, init=False
    )

    # -- planning ---------------------------------------------------------------------------
    def plan(
        self,
        tenant: str,
        bridge: EngineBridge,
        prompt: KVHandle,
        *,
        cache_key: str | None,
        ttl: str | None,
        retention: str | None,
        tools: bool,
    ) -> SessionPlan:
        """The retention and priority of a request of ``tenant`` whose prompt is ``prompt``."""
        label = f"key:{cache_key}" if cache_key is not None else "tools" if tools else "plain"
        previous = self._extended(tenant, bridge.model, prompt, bridge.block_size)
        now = time.monotonic()
        if previous is not None:
            self._observe(tenant, previous.label, now - previous.finished)
            priority = previous.priority  # the program's place: first come, first served
        else:
            priority = arrival_priority()
        asked = cache_key is not None or ttl is not None or retention is not None
        if not bridge.retention_enabled or not (asked or tools):
            return SessionPlan(None, priority, False, label)
        if ttl is not None:  # an explicit minimum lifetime
            seconds = parse_ttl(ttl)
        elif retention is not None:
            seconds = RETENTION_VALUES.get(retention) or self.settings.default_ttl
        else:  # nobody named a lifetime: the gaps this key's turns of this kind have shown
            kind = "key" if asked else "tools"
            default = self.settings.default_ttl if asked else self.settings.tool_call_ttl
            seconds = min(default, self.learned_ttl(tenant, kind) or default)
        seconds = min(seconds, self.settings.max_ttl)
        retain = Retain(
            f"http/{tenant}/{bridge.model}/{uuid.uuid4().hex}",
            ttl=seconds,
            next_use=self.expected_gap(tenant, label),
            scope=f"http/{tenant}/{bridge.model}",
            account=tenant if self.per_key_share else None,
            share=self.settings.key_retention_share,
        )
        return SessionPlan(retain, priority, tools and not asked, label)

    def expected_gap(self, tenant: str, label: str) -> float | None:
        """The median gap observed between a turn and the next one (None: none seen yet)."""
        gaps = self._series(tenant, label)
        return median(gaps) if gaps else None

    def learned_ttl(self, tenant: str, kind: str) -> float | None:
        """``GAP_TTL_FACTOR`` times the 95th percentile of the gaps ``tenant``'s turns of
        ``kind`` (``"key"``: keyed sessions, ``"tools"``: tool calls) have shown, at least
        ``MIN_LEARNED_TTL``; None before ``MIN_GAPS`` gaps."""
        gaps = self._series(tenant, f"kind:{kind}")
        if gaps is None or len(gaps) < MIN_GAPS:
            return None
        ordered = sorted(gaps)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
        return max(MIN_LEARNED_TTL, GAP_TTL_FACTOR * p95)

    # -- after a reply ---------------------------------------------------------------------
    async def finished(
        self,
        tenant: str,
        bridge: EngineBridge,
        plan: SessionPlan,
        handle: KVHandle,
        *,
        tool_calls: bool,
        ok: bool,
    ) -> None:
        """Record a finished turn (or release its retention when nothing will extend it)."""
        retain = plan.retain
        if retain is None:
            return
        if not ok or (plan.only_tool_calls and not tool_calls):
            await bridge.release(retain.key)
            return
        turns = self._turns.setdefault(tenant, OrderedDict())
        turns[retain.key] = _Turn(
            retain.key, bridge, handle.token_ids, time.monotonic(), plan.priority, plan.label
        )
        stale = [
            k
            for k, t in turns.items()
            if t.bridge is bridge and handle.token_ids[: len(t.tokens)] == t.tokens
        ]
        for key in stale[:-1]:  # the engine superseded them (this turn covers theirs)
            del turns[key]
        while len(turns) > self.settings.max_per_key:
            _, oldest = turns.popitem(last=False)
            await oldest.bridge.release(oldest.key)  # on its own engine, not this request's

    def remember_generated(
        self, tenant: str, model: str, text: str, output_ids: Sequence[int]
    ) -> None:
        """``text`` (an assistant message as the client will send it back) was ``output_ids``."""
        if not text or not output_ids:
            return
        key = (tenant, model, text)
        self._generated[key] = tuple(output_ids)
        self._generated.move_to_end(key)
        while len(self._generated) > _SPLICES:
            self._generated.popitem(last=False)

    def splice(
        self, tenant: str, bridge: EngineBridge, messages: list[dict[str, str]]
    ) -> list[dict[str, str | KVHandle]]:
        """``messages`` with each assistant text this server generated as its generated ids."""
        out: list[dict[str, str | KVHandle]] = []
        for message in messages:
            ids = None
            if message["role"] == "assistant":
                ids = self._generated.get((tenant, bridge.model, message["content"]))
            content: str | KVHandle = message["content"] if ids is None else bridge.handle(ids)
            out.append({"role": message["role"], "content": content})
        return out

    # -- helpers ------------------------------------------------------------------------------
    def _extended(self, tenant: str, model: str, prompt: KVHandle, block: int) -> _Turn | None:
        """The longest retained turn of ``tenant`` that ``prompt`` extends (whole blocks)."""
        turns = self._turns.get(tenant)
        if not turns:
            return None
        ids = prompt.token_ids
        best: _Turn | None = None
        for turn in turns.values():
            n = len(turn.tokens) // block * block
            same = turn.bridge.model == model
            extends = same and n and len(ids) > n and ids[:n] == turn.tokens[:n]
            if extends and (best is None or len(turn.tokens) > len(best.tokens)):
                best = turn
        return best

    def _series(self, tenant: str, name: str) -> deque[float] | None:
        mine = self._gaps.get(tenant)
        return None if mine is None else mine.get(name)

    def _observe(self, tenant: str, label: str, gap: float) -> None:
        gap = max(0.0, gap)
        kind = "key" if label.startswith("key:") else label
        mine = self._gaps.setdefault(tenant, OrderedDict())
        for name, size in ((label, _GAPS), (f"kind:{kind}", _KIND_GAPS)):
            series = mine.get(name)
            if series is None:
                series = mine[name] = deque(maxlen=size)
            mine.move_to_end(name)
            series.append(gap)
        while len(mine) > MAX_GAP_SERIES:  # the least recently observed goes
            mine.popitem(last=False)

    def turns_by_model(self) -> dict[str, int]:
        """Retained turns tracked for the clients' next turns, per served model (``/metrics``)."""
        counts: dict[str, int] = {}
        for turns in self._turns.values():
            for turn in turns.values():
                counts[turn.bridge.model] = counts.get(turn.bridge.model, 0) + 1
        return counts

    def gap_series(self, tenant: str) -> int:
        """Gap series remembered for ``tenant`` (at most ``MAX_GAP_SERIES``)."""
        return len(self._gaps.get(tenant, ()))
