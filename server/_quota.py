"""Per-API-key quotas: requests in flight and tokens per minute, refused with 429.

Each key (or every client together, when the server has no key) gets its own
account. A request is admitted against its worst case (prompt tokens plus the
most completion tokens it may generate) and settled with what it really used;
the tokens-per-minute window is sliding (the last 60 s of settled use plus what
is promised to requests still running). A refusal says when to come back:
``Retry-After`` is the time until enough of the window's use expires.
"""

from __future__ import annotations

import collections
import hashlib
import math
import time
from collections.abc import Callable

import attrs

from ._errors import ApiError, bad_request

WINDOW_SECONDS = 60.0


@attrs.frozen(kw_only=True)
class KeyQuota:
    """What one API key may use (``None``: no limit).

    Attributes:
        max_concurrent: its requests in flight at once.
        tokens_per_minute: prompt + completion tokens over a sliding minute; a
            request whose worst case alone exceeds it is refused with 400.
    """

    max_concurrent: int | None = attrs.field(default=None)
    tokens_per_minute: int | None = attrs.field(default=None)

    @max_concurrent.validator
    @tokens_per_minute.validator
    def _positive(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")

    @property
    def limited(self) -> bool:
        return self.max_concurrent is not None or self.tokens_per_minute is not None


def key_id(key: str | None) -> str:
    """A key's name in accounts and metrics: a short digest, never the key itself."""
    if key is None:
        return "anonymous"
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@attrs.define
class _Account:
    running: int = 0
    promised: int = 0
    used: collections.deque[tuple[float, int]] = attrs.Factory(collections.deque)

    def window_use(self, now: float) -> int:
        while self.used and self.used[0][0] <= now - WINDOW_SECONDS:
            self.used.popleft()
        return sum(tokens for _, tokens in self.used)


@attrs.define
class Admission:
    """A request's place in its key's account; ``settle`` it exactly once when it ends."""

    _quotas: Quotas
    _account: _Account
    _promised: int
    _settled: bool = False

    @property
    def promised(self) -> int:
        """The worst case it was admitted with."""
        return self._promised

    def settle(self, used_tokens: int) -> None:
        """The request ended having used ``used_tokens`` (0 when it failed before the engine)."""
        if self._settled:
            return
        self._settled = True
        self._account.running -= 1
        self._account.promised -= self._promised
        if used_tokens > 0:
            self._account.used.append((self._quotas.clock(), used_tokens))


class Quotas:
    """The accounts of every API key under one ``KeyQuota``."""

    def __init__(
        self,
        quota: KeyQuota,
        *,
        retry_after: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quota = quota
        self.retry_after = retry_after
        self.clock = clock
        self._accounts: dict[str, _Account] = {}

    def admit(self, key: str, worst_case_tokens: int) -> Admission:
        """Admit a request of ``key`` that may use up to ``worst_case_tokens``.

        Raises:
            ApiError: 429 with ``Retry-After`` when the key is at its limit now; 400
                naming ``max_tokens`` when the worst case alone exceeds its minute.
        """
        quota = self.quota
        account = self._accounts.setdefault(key, _Account())
        if quota.max_concurrent is not None and account.running >= quota.max_concurrent:
            raise self._refuse(
                f"this API key has {account.running} requests in flight, its limit; "
                "retry when one finishes",
                self.retry_after,
                "concurrency_limit_exceeded",
            )
        tpm = quota.tokens_per_minute
        if tpm is not None:
            if worst_case_tokens > tpm:
                raise bad_request(
                    f"max_tokens: this request may use up to {worst_case_tokens} tokens "
                    f"(prompt and completion), more than this API key's {tpm} tokens per "
                    "minute; lower max_tokens (or the agents, rounds)",
                    "max_tokens",
                    "tokens_per_minute_exceeded",
                )
            now = self.clock()
            in_window = account.window_use(now)
            excess = in_window + account.promised + worst_case_tokens - tpm
            if excess > 0:
                raise self._refuse(
                    f"this API key used {in_window} of its {tpm} tokens per minute "
                    f"({account.promised} more promised to requests in flight); this request "
                    f"may use up to {worst_case_tokens}",
                    self._wait(account, excess, now),
                    "tokens_per_minute_limit",
                )
        account.running += 1
        account.promised += worst_case_tokens
        return Admission(self, account, worst_case_tokens)

    def _wait(self, account: _Account, excess: int, now: float) -> int:
        """Seconds until ``excess`` tokens of the window have expired."""
        freed = 0
        for at, tokens in account.used:
            freed += tokens
            if freed >= excess:
                return max(1, math.ceil(at + WINDOW_SECONDS - now))
        return self.retry_after  # what blocks it is promised to requests still running

    def _refuse(self, message: str, retry_after: int, code: str) -> ApiError:
        return ApiError(
            429,
            message,
            code=code,
            type="rate_limit_error",
            headers={"retry-after": str(retry_after)},
        )

    def used(self, key: str) -> int:
        """Tokens ``key``'s settled requests used in the last minute."""
        account = self._accounts.get(key)
        return 0 if account is None else account.window_use(self.clock())

    def running(self, key: str) -> int:
        """Requests of ``key`` in flight."""
        account = self._accounts.get(key)
        return 0 if account is None else account.running
