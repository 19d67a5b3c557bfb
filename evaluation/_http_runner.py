"""Requests to an OpenAI-compatible ``microagent serve``, sent as a client sends them.

The openai SDK's ``chat.completions.create`` with the configuration as
``extra_body`` (``agents`` and ``collaboration``); the reply's ``collaboration``
object carries the answer, the usage and the mode's details. A 400 is a refused
configuration, a 422 (no answer) or 500 (the collaboration failed) a failed
reply; anything else (unreachable, overloaded, the engine lost) is raised, so the
run stops and resumes later.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import attrs

from ._candidates import EvalRequest
from ._errors import EvalError
from ._runner import Reply, number_or_none

#: seconds one request may take (a collaboration of several agents on a loaded CPU)
REQUEST_TIMEOUT = 600.0


def api_base(base_url: str) -> str:
    """The SDK's base URL: ``base_url`` with ``/v1`` added when it has none."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


@attrs.define
class HTTPRunner:
    """Requests to ``base_url`` for ``model`` through the openai SDK.

    Attributes:
        base_url: the server (``http://host:port`` or ``.../v1``).
        model: the request's ``model``.
        api_key: the bearer key (``"EMPTY"`` for a server without keys).
    """

    base_url: str
    model: str = "default"
    api_key: str = "EMPTY"
    _client: object | None = attrs.field(default=None, init=False, repr=False)

    @property
    def label(self) -> str:
        return f"http:{api_base(self.base_url)}:{self.model}"

    async def run(self, request: EvalRequest) -> Reply:
        import openai

        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=api_base(self.base_url),
                api_key=self.api_key,
                timeout=REQUEST_TIMEOUT,
                max_retries=2,
            )
        client = self._client
        assert isinstance(client, openai.AsyncOpenAI)
        t0 = time.monotonic()
        try:
            response = await client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": request.question}],
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                extra_body=_body(request),
            )
        except openai.BadRequestError as exc:
            return Reply(seconds=time.monotonic() - t0, refused=_message(exc))
        except openai.APIStatusError as exc:
            if exc.status_code in (422, 500):
                return Reply(seconds=time.monotonic() - t0, failed=_message(exc))
            raise EvalError(f"{api_base(self.base_url)}: {exc}") from exc
        except openai.APIConnectionError as exc:  # refused, unreachable, or timed out
            raise EvalError(
                f"{api_base(self.base_url)} cannot be reached ({exc}): is microagent serve "
                "running there? The journal keeps every reply that finished; rerun to resume."
            ) from exc
        seconds = time.monotonic() - t0
        collab = (response.model_extra or {}).get("collaboration")
        if not isinstance(collab, Mapping):
            raise EvalError(
                f"{api_base(self.base_url)} answered without a collaboration object: "
                "is it microagent serve?"
            )
        usage = collab.get("usage")
        usage = usage if isinstance(usage, Mapping) else {}
        details = collab.get("details")
        details = details if isinstance(details, Mapping) else {}
        answer = collab.get("answer")
        return Reply(
            answer=answer if isinstance(answer, str) else "",
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
            seconds=seconds,
            abstained=bool(details.get("abstained", False)),
            logprob=number_or_none(details.get("answer_logprob")),
        )

    async def aclose(self) -> None:
        """Close the SDK's connections."""
        import openai

        if isinstance(self._client, openai.AsyncOpenAI):
            await self._client.close()
        self._client = None


def _body(request: EvalRequest) -> dict[str, object]:
    """The request's ``extra_body``; a scored request (greedy's) asks for its answer's
    log-probability (``collaboration.logprob``: the chat API refuses ``logprobs`` beside
    a collaboration, whose details carry it instead)."""
    body = request.extra_body()
    if request.logprob:
        body["collaboration"] = {**request.collaboration, "logprob": True}
    return body


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return str(exc)
