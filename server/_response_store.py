"""Stored responses: ``store`` keeps a response, ``previous_response_id`` continues it.

OpenAI's Responses API keeps every response unless a request says ``store: false``,
and a client continues a conversation by naming the last response
(``previous_response_id``) instead of re-sending it. This store keeps, per
stored response, the response object as it was sent and the conversation it
ends as input items: every earlier turn's input and output items (messages,
``function_call`` items and their ``function_call_output``s: vllm#43244 drops
the calls) and then its own. Each stored response is self-contained, so a chain
survives the eviction of its older links; the byte cap pays for that.

Bounds (each stored response's size is its JSON's bytes, response and conversation):

* per API key, at most ``StoreSettings.max_per_key`` responses; past it that key's
  oldest goes (one key never evicts another's by count);
* all keys together, at most ``StoreSettings.max_bytes``; past it the oldest
  response of any key goes, and a response larger than the whole cap is not stored;
* each lives ``StoreSettings.ttl`` seconds after it was stored.

A response is found only with the API key that created it: any other key gets
the same answer as for an id that never existed (it cannot tell them apart).
Only finished responses are stored (``completed`` or ``incomplete``): a failed or
cancelled one is not (its id is then unknown here).

The KV of a stored response's turn is kept by the sessions (``_sessions``): a
chain is one session (``prompt_cache_key`` ``resp:<first response id>`` unless the
client names one), so a chained turn reads the previous turns' blocks.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from ._errors import ApiError, bad_request

#: What this server's response ids look like (``ResponseShape``): anything else is refused.
RESPONSE_ID: Final = re.compile(r"^resp_[0-9a-f]{32}$")
#: Defaults: OpenAI keeps responses for 30 days; this store is in memory, so a day.
DEFAULT_TTL: Final = 86400.0
DEFAULT_MAX_PER_KEY: Final = 1000
DEFAULT_MAX_BYTES: Final = 256 * 2**20


@attrs.frozen
class StoreSettings:
    """How many responses the server keeps, and for how long.

    Attributes:
        ttl: seconds a stored response lives (retrievable and chainable).
        max_per_key: stored responses one API key may have; past it its oldest goes.
        max_bytes: the bytes (JSON) all stored responses may take together; past it
            the oldest of any key goes.
    """

    ttl: float = attrs.field(default=DEFAULT_TTL)
    max_per_key: int = attrs.field(default=DEFAULT_MAX_PER_KEY)
    max_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES)

    @ttl.validator
    def _positive_ttl(self, _: attrs.Attribute[float], value: float) -> None:
        if not value > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {value}")

    @max_per_key.validator
    @max_bytes.validator
    def _positive(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < 1:
            raise ValueError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class StoredResponse:
    """One stored response.

    Attributes:
        id: the response's id.
        tenant: the API key id that created it (the only one that finds it).
        response: the ``response`` object as the client received it.
        conversation: the input items the conversation is through this response (every
            earlier turn's input and output, then its own), what a chained turn continues.
        chain: the id of the conversation's first response (its session's name).
        size: its bytes, as counted against ``StoreSettings.max_bytes``.
        stored: when it was stored (the store's clock).
    """

    id: str
    tenant: str
    response: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]
    chain: str
    size: int
    stored: float


@attrs.define(eq=False)
class ResponseStore:
    """Stored responses of every API key, oldest first, bounded by count, bytes and age."""

    settings: StoreSettings = attrs.field(factory=StoreSettings)
    #: seconds, monotonic (tests pass a fake clock)
    clock: Callable[[], float] = time.monotonic
    _items: OrderedDict[str, StoredResponse] = attrs.field(factory=OrderedDict, init=False)
    _by_key: dict[str, OrderedDict[str, None]] = attrs.field(factory=dict, init=False)
    _bytes: int = attrs.field(default=0, init=False)

    def put(
        self,
        tenant: str,
        response: dict[str, Any],
        conversation: Sequence[dict[str, Any]],
        chain: str,
    ) -> bool:
        """Store ``response`` (False: it is larger than the whole byte cap, not stored)."""
        self._expire()
        rid = response["id"]
        size = len(json.dumps([response, list(conversation)], separators=(",", ":")).encode())
        if size > self.settings.max_bytes:
            return False
        self._drop(rid)
        stored = StoredResponse(
            rid, tenant, response, tuple(conversation), chain, size, self.clock()
        )
        self._items[rid] = stored
        mine = self._by_key.setdefault(tenant, OrderedDict())
        mine[rid] = None
        self._bytes += size
        while len(mine) > self.settings.max_per_key:
            self._drop(next(iter(mine)))
        while self._bytes > self.settings.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    def get(self, tenant: str, rid: str) -> StoredResponse | None:
        """``tenant``'s live stored response ``rid`` (None: unknown, expired or another key's)."""
        self._expire()
        found = self._items.get(rid)
        return found if found is not None and found.tenant == tenant else None

    def delete(self, tenant: str, rid: str) -> bool:
        """Forget ``tenant``'s stored response ``rid`` (False: it had none by that id)."""
        if self.get(tenant, rid) is None:
            return False
        self._drop(rid)
        return True

    @property
    def bytes(self) -> int:
        """The bytes all stored responses take (at most ``settings.max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self) -> None:
        """Drop the responses older than the TTL (the oldest are first)."""
        oldest = self.clock() - self.settings.ttl
        while self._items:
            first = next(iter(self._items.values()))
            if first.stored > oldest:
                break
            self._drop(first.id)

    def _drop(self, rid: str) -> None:
        gone = self._items.pop(rid, None)
        if gone is None:
            return
        self._bytes -= gone.size
        mine = self._by_key.get(gone.tenant)
        if mine is not None:
            mine.pop(rid, None)
            if not mine:
                del self._by_key[gone.tenant]


def checked_id(value: str, param: str) -> str:
    """``value`` if it is a response id of this server's form; a 400 naming ``param``."""
    if not RESPONSE_ID.match(value):
        shown = value if len(value) <= 64 else value[:64] + "..."
        raise bad_request(
            f"Invalid '{param}': {shown!r}. Expected an ID that begins with 'resp_' "
            "followed by 32 hexadecimal digits.",
            param,
            "invalid_value",
        )
    return value


def previous_response(store: ResponseStore, tenant: str, rid: str) -> StoredResponse:
    """The stored response a chained request continues.

    Unknown, expired, another key's, or never stored (``store: false``): a 400
    ``previous_response_not_found`` naming ``previous_response_id``, as OpenAI answers.
    """
    found = store.get(tenant, checked_id(rid, "previous_response_id"))
    if found is None:
        raise bad_request(
            f"Previous response with id '{rid}' not found.",
            "previous_response_id",
            "previous_response_not_found",
        )
    return found


def stored_response(store: ResponseStore, tenant: str, rid: str) -> StoredResponse:
    """``GET``/``DELETE /v1/responses/{id}``'s response: a 404 naming ``response_id`` when
    it is unknown, expired, another key's or was never stored."""
    found = store.get(tenant, checked_id(rid, "response_id"))
    if found is None:
        raise ApiError(
            404,
            f"Response with id '{rid}' not found.",
            param="response_id",
            code="not_found",
        )
    return found


def continued(
    store: ResponseStore, tenant: str, previous_id: str | None
) -> tuple[tuple[dict[str, Any], ...], str | None]:
    """The conversation a request continues and its chain's first id (``((), None)``:
    it names no ``previous_response_id``)."""
    if previous_id is None:
        return (), None
    found = previous_response(store, tenant, previous_id)
    return found.conversation, found.chain
