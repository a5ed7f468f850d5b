"""The proxy's client for vLLM's OpenAI-compatible server.

Every dialect is served through one upstream call: a NON-streaming `/v1/chat/completions` with
`return_token_ids` and `logprobs`, because only the complete response carries the prompt token ids,
every sampled token id and the sampler's logprob of each (vLLM drops token ids when it streams
through a tool parser). Dialects stream the finished result to the harness themselves.
"""

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp
import orjson

from steps.proxy.errors import ProxyError

log = logging.getLogger("openforge.proxy.upstream")


@dataclass
class ToolCall:
    """One tool call the model made, arguments as the JSON text vLLM parsed out."""

    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    """vLLM's answer to one call, independent of the dialect the harness speaks."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    stop_reason: str | int | None
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    logprob_entries: list[dict] = field(default_factory=list, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.response_token_ids)


def parse_completion(body: dict) -> Completion:
    """Reads vLLM's chat completion, insisting on the token fields the proxy exists to record."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
        prompt_ids = body["prompt_token_ids"]
        token_ids = choice["token_ids"]
        entries = (choice.get("logprobs") or {}).get("content") or []
    except (KeyError, IndexError, TypeError) as exc:
        raise ProxyError(502, f"upstream answered without the expected chat completion fields ({exc!r})") from None
    if prompt_ids is None or token_ids is None:
        raise ProxyError(502, "upstream returned no token ids: is it vLLM with return_token_ids support?")
    if len(entries) != len(token_ids):
        raise ProxyError(502, f"upstream returned {len(entries)} logprobs for {len(token_ids)} sampled tokens")
    calls = [
        ToolCall(id=call.get("id") or f"call_{i}", name=call["function"]["name"],
                 arguments=call["function"].get("arguments") or "{}")
        for i, call in enumerate(message.get("tool_calls") or [])
    ]
    return Completion(
        content=message.get("content"),
        reasoning=message.get("reasoning_content") or message.get("reasoning"),
        tool_calls=calls,
        finish_reason=choice.get("finish_reason") or "stop",
        stop_reason=choice.get("stop_reason"),
        prompt_token_ids=prompt_ids,
        response_token_ids=token_ids,
        response_logprobs=[entry["logprob"] for entry in entries],
        logprob_entries=entries,
    )


class Upstream:
    """A pooled HTTP client for one vLLM server; retries only what was never sent."""

    def __init__(self, url: str, timeout_s: float = 600.0, connect_retries: int = 3, model: str | None = None):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.model = model
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Opens the connection pool."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: orjson.dumps(o).decode())

    async def close(self) -> None:
        """Closes the connection pool."""
        if self._session is not None:
            await self._session.close()

    async def served_model(self) -> str:
        """The model name vLLM serves (from `/v1/models`, asked once)."""
        if self.model is None:
            body = await self.request("GET", "/v1/models")
            try:
                self.model = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise ProxyError(502, "upstream /v1/models lists no model") from None
        return self.model

    async def complete(self, chat_body: dict) -> Completion:
        """Runs one non-streaming chat completion with token ids and logprobs."""
        chat_body = {**chat_body, "model": await self.served_model(), "stream": False,
                     "return_token_ids": True, "logprobs": True}
        return parse_completion(await self.request("POST", "/v1/chat/completions", chat_body))

    async def request(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                      retries: int | None = None) -> dict:
        """Sends one request; maps every failure to a ProxyError (400 passes vLLM's own message)."""
        data = None if body is None else orjson.dumps(body)
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        retries = self.connect_retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                async with self._session.request(method, self.url + path, data=data, timeout=timeout,
                                                 headers={"content-type": "application/json"}) as resp:
                    raw = await resp.read()
                    return _decode(resp.status, raw, path)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                # Nothing reached vLLM (or it closed a stale keep-alive connection): safe to send again.
                if attempt == retries:
                    raise ProxyError(502, f"upstream {self.url} is unreachable: {exc}") from None
                log.warning("upstream unreachable, retrying", extra={"attempt": attempt + 1, "error": str(exc)})
                await asyncio.sleep(0.2 * 2**attempt)
            except asyncio.TimeoutError:
                raise ProxyError(504, f"upstream {self.url} did not answer within {timeout.total:.0f} s") from None
            except aiohttp.ClientError as exc:
                raise ProxyError(502, f"upstream {self.url} failed: {exc}") from None
        raise AssertionError("unreachable")


def _decode(status: int, raw: bytes, path: str) -> dict:
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        body = {"message": raw[:500].decode(errors="replace")}
    if status < 400:
        return body
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    message = str(error.get("message") or body)
    if status == 400 or status == 422:
        code = "context_length_exceeded" if "context length" in message or "maximum context" in message else None
        raise ProxyError(400, message, code=code)
    raise ProxyError(502, f"upstream {path} answered {status}: {message}")
