"""The proxy's client for vLLM's OpenAI-compatible server.

Every dialect is served through one upstream call: a NON-streaming `/v1/chat/completions` with
`return_token_ids` and `logprobs`, because only the complete response carries the prompt token ids,
every sampled token id and the sampler's logprob of each (vLLM drops token ids when it streams
through a tool parser). Dialects stream the finished result to the harness themselves.

An external upstream (a server the serve step did not start: a vLLM elsewhere, or any OpenAI-compatible
endpoint) may answer without token ids: the call is answered and recorded all the same, marked untrainable
(`Completion.untrainable`). What it refuses is learnt once, before the proxy listens (`probe`: one call of
the proxy's own, one token long): a field its 400 names (`return_token_ids`, `logprobs`) is never sent. A
harness's call never teaches it: its 400 may echo the harness's own values, which could name any field.
"""

import asyncio
import logging
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec
import orjson
from msgspec import Raw, Struct

from steps.proxy.errors import ProxyError
from steps.proxy.http_pool import HttpPool, NotSent, UpstreamFailed, UpstreamTimeout

log = logging.getLogger("openforge.proxy.upstream")
_ENCODE = msgspec.json.Encoder().encode  # plain values and raw JSON fields (forwarded verbatim) alike
_JSON = {"content-type": "application/json"}


@dataclass
class ToolCall:
    """One tool call the model made, arguments as the JSON text vLLM parsed out."""

    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    """vLLM's answer to one call, independent of the dialect the harness speaks.

    Read from vLLM's answer, the prompt token ids (10-30k per agent call) and the logprob entries are
    vLLM's own JSON bytes (orjson fragments): stored and passed on verbatim, never decoded here."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    stop_reason: str | int | None
    prompt_token_ids: list[int] | orjson.Fragment | None  # None: an external upstream returned none
    response_token_ids: list[int] | None
    response_logprobs: list[float] | None
    prompt_count: int | None = None  # vLLM's count of the prompt tokens, when they are kept as bytes
    prompt_ids_json: bytes | None = None  # those bytes (the fragment's contents cannot be read back)
    logprob_entries: list[dict] | orjson.Fragment = field(default_factory=list, repr=False)
    completion_count: int | None = None  # the upstream's count of response tokens, when it gave no ids
    untrainable: str | None = None  # why the call cannot be trained on (no token ids), else None

    @property
    def prompt_tokens(self) -> int:
        if self.prompt_count is not None or self.prompt_token_ids is None:
            return self.prompt_count or 0
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        if self.response_token_ids is None:
            return self.completion_count or 0
        return len(self.response_token_ids)


# vLLM's chat completion, as far as the proxy reads it (unknown fields are skipped, not decoded).
class _Function(Struct):
    name: str
    arguments: str | None = None


class _ToolCall(Struct):
    function: _Function
    id: str | None = None


class _Message(Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Logprobs(Struct):
    content: Raw = Raw(b"null")


class _Logprob(Struct):
    logprob: float


class _Choice(Struct):
    message: _Message
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class _Usage(Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Answer(Struct):
    choices: list[_Choice]
    prompt_token_ids: Raw = Raw(b"null")
    usage: _Usage | None = None


_ANSWER = msgspec.json.Decoder(_Answer)
_LOGPROBS = msgspec.json.Decoder(list[_Logprob] | None)
_PROMPT_IDS = b'"prompt_token_ids":['
NO_TOKEN_IDS = "the upstream returned no token ids, so this call cannot be trained on"
# Fields only vLLM knows that the proxy adds to every upstream call; one an external upstream refuses by name
# when `probe` calls it is left out of every later call, with what depends on it.
_VLLM_EXTRAS = {"return_token_ids": (), "logprobs": ("top_logprobs",)}  # each, and what depends on it


def _cut_prompt_ids(data: bytes) -> tuple[bytes, bytes | None]:
    """vLLM's answer with its prompt token ids replaced by null, and those ids as vLLM's JSON bytes.

    A JSON decoder spends ~0.1 ms a call just skipping 10-30k numbers; finding the array's two ends
    takes a few microseconds. Unescaped quotes around the key mean it is a key, not text in a string,
    and an array without quotes ends at its first `]`. The caller decodes what is left: if the cut
    was anything but the top-level array, that fails or still shows prompt ids, and the whole answer
    is decoded instead."""
    start = data.find(_PROMPT_IDS)
    close = data.find(b"]", start) + 1 if start >= 0 else 0
    if close == 0:
        return data, None
    open_ = start + len(_PROMPT_IDS) - 1
    ids = data[open_:close]
    if b'"' in ids:
        return data, None
    return data[:open_] + b"null" + data[close:], ids


def _decode_answer(data: bytes) -> tuple[_Answer, bytes]:
    """vLLM's answer, and its prompt token ids as JSON bytes."""
    rest, ids = _cut_prompt_ids(data)
    if ids is not None:
        try:
            answer = _ANSWER.decode(rest)
            if bytes(answer.prompt_token_ids) == b"null":
                return answer, ids
        except msgspec.DecodeError:
            pass
    answer = _ANSWER.decode(data)
    return answer, bytes(answer.prompt_token_ids)


def parse_completion(data: bytes, require_token_ids: bool = True) -> Completion:
    """Reads vLLM's chat completion, insisting on the token fields the proxy exists to record; with
    `require_token_ids` False (an external upstream) a completion without them is read as untrainable."""
    try:
        answer, prompt_ids = _decode_answer(data)
        choice = answer.choices[0]
        logprobs = Raw(b"null") if choice.logprobs is None else choice.logprobs.content
        entries = _LOGPROBS.decode(logprobs) or []
    except (msgspec.DecodeError, IndexError) as exc:
        raise ProxyError(502, f"upstream answered without the expected chat completion fields ({exc})") from None
    has_ids = prompt_ids.startswith(b"[") and choice.token_ids is not None
    if not has_ids and require_token_ids:
        raise ProxyError(502, "upstream returned no token ids: is it vLLM with return_token_ids support?")
    matched = not has_ids or len(entries) == len(choice.token_ids)
    if not matched and require_token_ids:
        raise ProxyError(502, f"upstream returned {len(entries)} logprobs for {len(choice.token_ids)} sampled tokens")
    # An external upstream's logprobs are kept when they fit: one per sampled token, or all there are without ids.
    logprob_values = [entry.logprob for entry in entries] if matched and (has_ids or entries) else None
    message = choice.message
    calls = [ToolCall(id=call.id or f"call_{i}", name=call.function.name, arguments=call.function.arguments or "{}")
             for i, call in enumerate(message.tool_calls or [])]
    usage = answer.usage or _Usage()
    if has_ids:
        ids = dict(prompt_token_ids=orjson.Fragment(prompt_ids), response_token_ids=choice.token_ids,
                   prompt_ids_json=prompt_ids, prompt_count=usage.prompt_tokens if usage.prompt_tokens is not None
                   else prompt_ids.count(b",") + (prompt_ids != b"[]"))
    else:
        ids = dict(prompt_token_ids=None, response_token_ids=None, prompt_count=usage.prompt_tokens,
                   completion_count=usage.completion_tokens, untrainable=NO_TOKEN_IDS)
    return Completion(
        content=message.content,
        reasoning=message.reasoning_content or message.reasoning,
        tool_calls=calls,
        finish_reason=choice.finish_reason or "stop",
        stop_reason=choice.stop_reason,
        response_logprobs=logprob_values,
        logprob_entries=orjson.Fragment(bytes(logprobs)) if entries else [],
        **ids,
    )


class Unreachable(ProxyError):
    """The upstream could not be reached: nothing of the call was sent (so another replica may take it)."""


class Upstream:
    """A pooled HTTP client for one vLLM server; retries only what was never sent.

    `external`: a server the serve step did not start, which may answer without token ids (see the module
    docstring); `api_key` is sent to it as `Authorization: Bearer`."""

    def __init__(self, url: str, timeout_s: float = 600.0, connect_retries: int = 3, model: str | None = None,
                 external: bool = False, api_key: str | None = None):
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        self._origin, self._prefix = f"{parts.scheme}://{parts.netloc}", parts.path  # vLLM may sit under a path
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.model = model
        self.external = external
        self._headers = {**_JSON, **({"authorization": f"Bearer {api_key}"} if api_key else {})}
        self._extras = dict.fromkeys(_VLLM_EXTRAS, True)  # what the proxy adds to every call, less those refused
        self._refused: tuple[str, ...] = ()  # those refused, and what depends on them: left out of every call
        self._pool: HttpPool | None = None

    async def start(self) -> None:
        """Opens the connection pool."""
        self._pool = HttpPool(self._origin)

    async def close(self) -> None:
        """Closes the connection pool."""
        if self._pool is not None:
            await self._pool.close()

    async def served_model(self) -> str:
        """The model name vLLM serves (from `/v1/models`, asked once)."""
        if self.model is None:
            body = await self.request("GET", "/v1/models")
            try:
                self.model = body["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise ProxyError(502, "upstream /v1/models lists no model") from None
        return self.model

    async def complete(self, chat_body: dict, model: str | None = None) -> Completion:
        """Runs one non-streaming chat completion with token ids and logprobs (to an external upstream, without
        those `probe` found it refuses), on `model` (a LoRA adapter loaded there) or else the served model."""
        chat_body = {**chat_body, "model": model or await self.served_model(), "stream": False, **self._extras}
        for name in self._refused:
            chat_body.pop(name, None)
        return parse_completion(await self.send("POST", "/v1/chat/completions", chat_body),
                                require_token_ids=not self.external)

    async def probe(self) -> None:
        """An external upstream's refusals, learnt from one call of the proxy's own (nothing in it comes from a
        harness): each vLLM field its 400 names is left out of every later call. Any other failure is logged
        and changes nothing: the harnesses' calls then meet it themselves."""
        if not self.external:
            return
        body = {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        while True:
            try:
                await self.complete(body)
                return
            except ProxyError as err:
                refused = self._refused_extra(err, self._extras)
                if refused is None:
                    log.warning("upstream probe call failed; sending calls with every vLLM field",
                                extra={"status": err.status, "error": err.message[:500]})
                    return
                log.warning("upstream refused a vLLM field; sending calls without it",
                            extra={"field": refused, "error": err.message[:500]})
                del self._extras[refused]
                self._refused += (refused, *_VLLM_EXTRAS[refused])

    def _refused_extra(self, err: ProxyError, sent: dict) -> str | None:
        """The vLLM field of `sent` that an external upstream's 400 names (the call goes again without it), else None."""
        if not self.external or err.status != 400:
            return None
        # As a word: a 400 about the harness's `top_logprobs` does not refuse `logprobs`.
        return next((name for name in _VLLM_EXTRAS if name in sent and re.search(rf"\b{name}\b", err.message)), None)

    async def request(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                      retries: int | None = None) -> dict:
        """Sends one request and decodes the JSON answer (see `send`)."""
        raw = await self.send(method, path, body, timeout_s, retries)
        try:
            return orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            raise ProxyError(502, f"upstream {path} answered malformed JSON: {raw[:200]!r}") from None

    async def send(self, method: str, path: str, body: dict | None = None, timeout_s: float | None = None,
                   retries: int | None = None) -> bytes:
        """Sends one request, returns the answer's bytes; maps every failure to a ProxyError (400 passes
        vLLM's own message)."""
        data = None if body is None else _ENCODE(body)
        timeout_s = timeout_s or self.timeout_s
        retries = self.connect_retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                status, raw = await self._pool.request(method, self._prefix + path, data, headers=self._headers,
                                                        timeout_s=timeout_s)
            except NotSent as exc:  # nothing reached vLLM: safe to send again
                if attempt == retries:
                    raise Unreachable(502, f"upstream {self.url} is unreachable: {exc}") from None
                log.warning("upstream unreachable, retrying", extra={"attempt": attempt + 1, "error": str(exc)})
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            except UpstreamTimeout:
                raise ProxyError(504, f"upstream {self.url} did not answer within {timeout_s:.0f} s") from None
            except UpstreamFailed as exc:
                raise ProxyError(502, f"upstream {self.url} failed: {exc}") from None
            if status >= 400:
                _raise_for(status, raw, path)
            return raw
        raise AssertionError("unreachable")


def _raise_for(status: int, raw: bytes, path: str) -> None:
    """vLLM's error answer as a ProxyError: 400 with vLLM's own message (over the context window too),
    anything else 502."""
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        body = {"message": raw[:500].decode(errors="replace")}
    if not isinstance(body, dict):
        body = {"message": str(body)[:500]}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    message = str(error.get("message") or body)
    if status == 400 or status == 422:
        code = "context_length_exceeded" if "context length" in message or "maximum context" in message else None
        raise ProxyError(400, message, code=code)
    raise ProxyError(502, f"upstream {path} answered {status}: {message}")
