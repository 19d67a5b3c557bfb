"""Every request runs under the server's code policy (``--allow-code-validators``,
``--calculator``): one ASGI layer sets it, and ``collab``'s one gate
(``require_code``) reads it wherever a spec would build or run client code, the
streamed body and every task the request starts included."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ..collab import CodePolicy, code_policy
from ._state import ServerLimits


def server_code_policy(limits: ServerLimits) -> CodePolicy:
    """What this server's flags allow, with the flag that allows each kind."""
    return CodePolicy(
        python_tests=limits.allow_code_validators,
        calculator=limits.allow_calculator,
        enable_hint={
            "python_tests": "start the server with --allow-code-validators to accept it",
            "calculator": "start the server with --calculator to accept it",
        },
    )


class CodeGate:
    """Hold ``policy`` for the whole of each request (its response's body included)."""

    def __init__(self, app: ASGIApp, *, policy: CodePolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with code_policy(self.policy):
            await self.app(scope, receive, send)
