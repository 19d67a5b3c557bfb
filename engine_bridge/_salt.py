"""Cache salts: requests of different tenants never share a cached KV block.

vLLM puts a request's ``cache_salt`` into the hash of its first block, so of
every block: two tenants sending the same document compute it each, and
neither can tell from ``cached_tokens`` (or from timing, CVE-2025-46570)
what the other sent. A salt is scoped, like a deadline: every engine request
started inside ``with cache_salt(s):`` (in that task and the tasks it starts,
a collaboration's actors included) carries ``s``. The bridge's own
bookkeeping (expected hits, retained handles) is keyed by the salt too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CACHE_SALT: ContextVar[str | None] = ContextVar("microagent_cache_salt", default=None)


@contextmanager
def cache_salt(salt: str | None) -> Iterator[None]:
    """Salt every engine request started inside the block (None: the shared cache)."""
    token = _CACHE_SALT.set(salt)
    try:
        yield
    finally:
        _CACHE_SALT.reset(token)


def current_cache_salt() -> str | None:
    """The salt of the enclosing ``cache_salt`` block (None outside one)."""
    return _CACHE_SALT.get()


def salt_for(secret: str) -> str:
    """A tenant's salt: a digest of its secret (an API key), never the secret itself."""
    return hashlib.sha256(b"microagent-cache-salt\0" + secret.encode()).hexdigest()[:32]


def set_cache_salt(salt: str | None) -> None:
    """Salt the rest of the current task (and the tasks it starts): a server's request task."""
    _CACHE_SALT.set(salt)
