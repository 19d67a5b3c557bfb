"""Engine errors as API errors: what a client is told when its engine refused or failed.

``engine_error`` maps a bridge's exception to the ``ApiError`` the client gets
(``EngineLost``: 503 with ``Retry-After``, which ``run_retrying`` may run again);
planning uses it for refusals found before anything runs, the engine loop for
failures while it runs.
"""

from __future__ import annotations

from ..engine_bridge import EngineDied, EngineUnavailable, RequestRefused, UnknownAdapter
from ._errors import ApiError, bad_request
from ._remote import remote_failure
from ._retry import EngineLost


def engine_error(exc: BaseException, retry: int = 5) -> ApiError:
    """The API error for ``exc``; an engine failure is ``EngineLost`` (503, ``Retry-After``)."""
    if isinstance(exc, ApiError):
        return exc
    remote = remote_failure(exc)
    if remote is not None:
        return remote
    if isinstance(exc, UnknownAdapter):
        return bad_request(str(exc), "adapter", "adapter_not_found")
    if isinstance(exc, RequestRefused):
        return bad_request(str(exc), exc.field)
    if isinstance(exc, EngineDied | EngineUnavailable):
        return EngineLost(exc, retry)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (``exc`` itself when it is none)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
