"""RemoteBridge: a role's model served by any OpenAI-compatible endpoint (chat completions).

Text crosses the boundary, never KV. Roles compose prompts as on a local
engine, through ``bridge.chat`` (a ``MessageComposer``): a remote handle
carries the chat messages it stands for (``KVHandle.conversation``), and those
messages are the ``messages`` of ``POST {url}/chat/completions`` (``stream=true``),
exactly as composed; nothing is rendered to a prompt text and parsed back. Its
ids come from a local reversible tokenizer (``ToyTokenizer``) and only count
tokens. Its fingerprint is its own, so handles reach it only through the
explicit re-tokenization cascade already does across tokenizers. Nothing is
cached here: ``cached_tokens`` is what the endpoint reports, and the usage it
reports (its own tokenizer's counts) is what the results and stats carry.

Tenants: a request made under a cache salt (a server's API key, ``cache_salt``)
carries it as vLLM's ``cache_salt`` body field when the bridge is told the
endpoint takes it (``send_cache_salt``); otherwise the endpoint's cache is shared
by every tenant, so its ``cached_tokens`` would tell one tenant what another sent,
and a salted request reports 0 cached tokens instead.

Failures: a timeout, a dropped connection, 408/409/5xx and 429 (waiting
``Retry-After``) are retried with exponential backoff up to ``max_attempts``;
then, or on any other refusal, ``RemoteError`` names the remote. A stream cut
after text was delivered is retried and resumed only when the new output
repeats what was delivered. Leaving a ``Generation`` early closes the HTTP
stream. The key goes in one header to this endpoint only (redirects are
never followed) and is scrubbed from every error text.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from .._bridge import EngineBridge, EngineRequest, EngineStep, Generation, SchedulerSnapshot
from .._chat import ChatTemplate
from .._errors import RemoteError, RequestRefused
from .._handle import Conversation, KVHandle
from .._tokenizer import IM_END, ToyTokenizer
from .._types import FinishReason, GenerationResult, Sampling
from ._chat import MessageComposer

if TYPE_CHECKING:  # httpx is imported when a bridge opens: ``import microagent`` needs none
    import httpx

_RETRIED_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_ERROR_TEXT = 300


@attrs.frozen
class RemoteUsage:
    """What the endpoint reported for one request (its own tokenizer's counts)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class _Retry(Exception):
    """One attempt failed in a way worth another (after ``wait`` seconds, if any)."""

    def __init__(self, reason: str, status: int | None = None, wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.wait = wait


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RemoteBridge(EngineBridge):
    """An ``EngineBridge`` over an OpenAI-compatible endpoint; ``name`` is its served model name.

    Args:
        name: the name agents give as ``model`` to run here.
        url: the endpoint's base URL, e.g. ``http://host:8000/v1`` (``/chat/completions`` is added).
        model: the model id the endpoint serves (default: ``name``).
        api_key_env: the environment variable holding the API key (read at ``open``).
        api_key: the key itself (Python callers; never in a repr or an error).
        timeout: seconds per attempt to connect and between bytes of the response.
        max_attempts: requests per generation before ``RemoteError`` (1 = no retry).
        backoff: the first retry's wait in seconds; each next one doubles, up to ``max_backoff``.
        max_retry_after: the longest ``Retry-After`` honoured; a longer one fails at once.
        max_concurrency: requests in flight to this endpoint at once (others wait here).
        send_cache_salt: the endpoint takes vLLM's ``cache_salt`` field: a salted request
            (a server's API key) sends its salt, so tenants never share its prefix cache.
            Otherwise a salted request's ``cached_tokens`` is reported as 0.
        transport: an ``httpx`` transport (tests).
    """

    remote = True

    def __init__(
        self,
        name: str,
        url: str,
        *,
        model: str | None = None,
        api_key_env: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_attempts: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 30.0,
        max_concurrency: int = 16,
        send_cache_salt: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(name, block_size=1)
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.url = url.rstrip("/")
        self.remote_model = model or name
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.send_cache_salt = send_cache_salt
        self._api_key = api_key
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._limit = anyio.CapacityLimiter(max_concurrency)
        self._usage: dict[str, RemoteUsage] = {}
        self._running = 0
        #: requests sent (retries included), and retries alone
        self.attempts = 0
        self.retries = 0
        self.tokenizer = ToyTokenizer()
        self.eot_token_id = self.tokenizer.token_id(IM_END)
        self.chat = MessageComposer(ChatTemplate.chatml(self.tokenize, self.eot_token_id), self)

    def __repr__(self) -> str:  # never the key
        return f"RemoteBridge({self.model!r}, url={self.url!r}, model={self.remote_model!r})"

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        """Make the HTTP client (no request is sent: a remote that is down never blocks start)."""
        if self._client is not None:
            return
        import httpx

        if self._api_key is None and self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise RemoteError(
                    self.model, f"the environment variable {self.api_key_env} holds no key"
                )
            self._api_key = key
        headers = {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout),
            follow_redirects=False,  # the key goes to this endpoint only
            transport=self._transport,
        )

    async def close(self) -> None:
        """Abort live requests (their streams close) and close the client."""
        for gen in list(self._live.values()):
            gen._finish("abort")
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- tokens ------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def expected_cached_tokens(self, prompt: KVHandle, salt: str | None = None) -> tuple[int, bool]:
        """Nothing is known resident on a remote: no hit is expected, no miss is certain."""
        return 0, False

    # -- requests ------------------------------------------------------------------------
    def check_request(self, prompt: KVHandle, sampling: Sampling) -> None:
        """Refuse what the chat completions API cannot carry (never dropped silently)."""
        super().check_request(prompt, sampling)
        conversation = _conversation_of(prompt)
        if not conversation.messages():
            raise RequestRefused("prompt", "a remote prompt needs at least one message")
        if conversation.open and conversation.turns[-1].content:
            raise RequestRefused(
                "prompt",
                f"remote model {self.model!r} cannot continue a started assistant message "
                "(chat completions begin a new one): close the turn and ask again",
            )
        if prompt.adapter is not None:
            raise RequestRefused("adapter", f"remote model {self.model!r} takes no LoRA adapter")
        unsupported = {
            "regex": sampling.regex is not None,
            "tagged": sampling.tagged is not None,
            "logprobs": sampling.logprobs is not None,
            "top_k": sampling.top_k is not None,
            "min_p": sampling.min_p != 0.0,
            "repetition_penalty": sampling.repetition_penalty != 1.0,
        }
        for field, given in unsupported.items():
            if given:
                raise RequestRefused(
                    field, f"remote model {self.model!r} (chat completions) cannot take {field}"
                )

    def body(self, request: EngineRequest) -> dict[str, Any]:
        """The JSON body of ``request``'s chat completion (streaming, usage included)."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.remote_model,
            "messages": _conversation_of(request.prompt).messages(),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": s.max_tokens + (16 if s.choices else 0),
            "temperature": s.temperature,
        }
        optional: dict[str, Any] = {
            "top_p": s.top_p if s.top_p != 1.0 else None,
            "stop": list(s.stop) or None,
            "seed": s.seed,
            "presence_penalty": s.presence_penalty or None,
            "frequency_penalty": s.frequency_penalty or None,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if request.cache_salt is not None and self.send_cache_salt:
            body["cache_salt"] = request.cache_salt  # the tenant's own prefix cache there
        if s.choices:  # portable: a JSON object whose one field is one of the choices
            schema = {
                "type": "object",
                "properties": {"answer": {"type": "string", "enum": list(s.choices)}},
                "required": ["answer"],
                "additionalProperties": False,
            }
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            }
        elif s.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": json.loads(s.json_schema)},
            }
        elif s.json_object:
            body["response_format"] = {"type": "json_object"}
        return body

    def usage_of(self, request_id: str) -> RemoteUsage | None:
        """The usage the endpoint reported for a live request (``None`` until it arrives)."""
        return self._usage.get(request_id)

    async def _engine_steps(self, request: EngineRequest) -> AsyncIterator[EngineStep]:
        body = self.body(request)
        delivered = ""  # text already handed to the consumer (a resumed stream skips it)
        attempt = 0
        async with self._limit:
            self._running += 1
            try:
                while True:
                    attempt += 1
                    client = self._client
                    if client is None:
                        raise self._failed(request, "the bridge is not open", None, attempt)
                    self.attempts += 1
                    try:
                        async for step in self._attempt(client, request, body, delivered):
                            delivered += step.text
                            yield step
                        return
                    except RemoteError as exc:
                        raise self._failed(request, exc.reason, exc.status, attempt) from None
                    except _Retry as retry:
                        if attempt >= self.max_attempts:
                            raise self._failed(
                                request, self._scrub(retry.reason), retry.status, attempt
                            ) from None
                        wait = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                        if retry.wait is not None:
                            if retry.wait > self.max_retry_after:
                                reason = (
                                    f"rate limited; Retry-After {retry.wait:.0f} s exceeds "
                                    f"{self.max_retry_after:.0f} s"
                                )
                                raise self._failed(request, reason, retry.status, attempt) from None
                            wait = max(wait, retry.wait)
                        self.retries += 1
                        await anyio.sleep(wait)
            finally:
                self._running -= 1

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        request: EngineRequest,
        body: Mapping[str, Any],
        delivered: str,
    ) -> AsyncIterator[EngineStep]:
        """One streaming request; text in ``delivered`` is checked and skipped, not re-yielded."""
        import httpx

        choices = bool(request.sampling.choices)
        # a shared cache's hits would tell this tenant what other tenants sent
        shows_cache = request.cache_salt is None or self.send_cache_salt
        text: list[str] = []
        finish: FinishReason | None = None
        skip = delivered
        try:
            async with client.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    await self._refuse(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:  # an error reported inside the stream
                        raise _Retry(f"error in stream: {str(chunk['error'])[:_ERROR_TEXT]}")
                    usage = chunk.get("usage")
                    if usage:
                        details = usage.get("prompt_tokens_details") or {}
                        self._usage[request.request_id] = RemoteUsage(
                            int(usage.get("prompt_tokens") or 0),
                            int(usage.get("completion_tokens") or 0),
                            int(details.get("cached_tokens") or 0) if shows_cache else 0,
                        )
                    for choice in chunk.get("choices") or ():
                        piece = (choice.get("delta") or {}).get("content") or ""
                        if piece and skip:
                            common = min(len(skip), len(piece))
                            if piece[:common] != skip[:common]:
                                raise RemoteError(
                                    self.model,
                                    "the stream was cut and the retried output differs "
                                    "from what was already delivered",
                                )
                            piece, skip = piece[common:], skip[common:]
                        if piece:
                            if choices:
                                text.append(piece)
                            else:
                                yield EngineStep(tuple(self.tokenize(piece)), piece)
                        reason = choice.get("finish_reason")
                        if reason:
                            finish = "length" if reason == "length" else "stop"
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise _Retry(reason) from None
        except json.JSONDecodeError as exc:
            raise _Retry(f"unreadable stream chunk: {exc}") from None
        if finish is None:
            raise _Retry("the stream ended before a finish reason")
        if skip:  # the retried output stopped short of what was already delivered
            raise RemoteError(
                self.model,
                "the stream was cut and the retried output differs from what was already delivered",
            )
        if choices:
            answer = _choice_answer("".join(text), request.sampling.choices or ())
            yield EngineStep(tuple(self.tokenize(answer)), answer)
        usage = self._usage.get(request.request_id)
        yield EngineStep((), "", finish, usage.cached_tokens if usage else 0)

    async def _refuse(self, response: httpx.Response) -> None:
        """Raise for a non-200 reply: ``_Retry`` when worth another try, else ``RemoteError``."""
        status = response.status_code
        import httpx

        try:
            raw = (await response.aread()).decode("utf-8", "replace")
        except httpx.HTTPError:
            raw = ""
        detail = f"{response.reason_phrase or 'error'}: {raw[:_ERROR_TEXT]}".strip()
        if 300 <= status < 400:
            detail = "redirects are not followed (the key goes to the configured URL only)"
        if status in _RETRIED_STATUS:
            wait = retry_after_seconds(response.headers.get("retry-after"))
            raise _Retry(detail, status, wait if status in (429, 503) else None)
        raise RemoteError(self.model, self._scrub(detail), status=status)

    def _failed(
        self, request: EngineRequest, reason: str, status: int | None, attempts: int
    ) -> RemoteError:
        """The error that ends ``request`` (its generation is counted as failed, not aborted)."""
        gen = self._live.get(request.request_id)
        if gen is not None:
            gen._finish("error")
        return RemoteError(self.model, reason, status=status, attempts=attempts)

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def _abort_engine(self, request_id: str) -> None:
        """Nothing to send: the consumer leaving closes the HTTP stream (the endpoint aborts)."""

    def _scheduler_snapshot(self) -> SchedulerSnapshot:
        return SchedulerSnapshot(running=self._running)

    def _output_handle(self, prompt: KVHandle, output_ids: tuple[int, ...], text: str) -> KVHandle:
        """The prompt's conversation with the reply written into its assistant turn (as sent:
        for choices, the chosen text); the ids count the reply's tokens."""
        conversation = _conversation_of(prompt)
        if not conversation.open:  # the endpoint begins an assistant message of its own
            conversation = conversation.opened()
        return attrs.evolve(
            prompt,
            token_ids=prompt.token_ids + output_ids,
            parent=prompt,
            conversation=conversation.written(text),
        )

    def _account(self, gen: Generation, reason: FinishReason) -> GenerationResult:
        """The base accounting, with the endpoint's own token counts where it reported them."""
        result = super()._account(gen, reason)
        usage = self._usage.pop(result.request_id, None)
        if usage is None:
            return result
        c = self._counters
        c.prompt_tokens += usage.prompt_tokens - result.prompt_tokens
        c.cached_tokens += usage.cached_tokens - result.cached_tokens
        c.completion_tokens += usage.completion_tokens - result.completion_tokens
        return attrs.evolve(
            result,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
        )


def _conversation_of(prompt: KVHandle) -> Conversation:
    """The chat messages ``prompt`` stands for; a handle without them is refused.

    Raises:
        RequestRefused: ``prompt`` is a piece of text (bare ids, a segment), not a
            conversation composed with the bridge's ``chat``.
    """
    if prompt.conversation is None:
        raise RequestRefused(
            "prompt",
            f"a {prompt.model!r} prompt must be chat messages composed with its bridge's chat "
            "(chat.prompt, chat.append, chat.generation_prompt); this handle holds bare ids",
        )
    return prompt.conversation


def _choice_answer(text: str, choices: Sequence[str]) -> str:
    """The choice in a ``{"answer": …}`` reply (the raw text when it is not one)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("answer"), str):
        return str(value["answer"])
    stripped = text.strip().strip('"')
    return stripped if stripped in choices else text
