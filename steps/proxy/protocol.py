"""Request models of the three dialects the proxy speaks, checked before anything goes upstream.

They type what the proxy reads and bound what it forwards; unknown fields are allowed (harnesses
send many vendor extras) and ignored. Responses are built as plain dicts by each dialect module.

What the translating dialects only pass on (tool schemas and descriptions, tool outputs, the
instructions: much of an agent's request) is typed `Raw`: its JSON type is checked where it is used
(`expect`), its bytes are copied into the body for vLLM, and a raw text that must be joined to others
is joined as JSON (`join_text`), never decoded.

msgspec Structs rather than pydantic models (a protocol module's usual choice), for the hot path: one
pass over an agent's 30-80 KB request decodes and checks it 2-3x faster than orjson + pydantic, and
`decode` keeps the top-level fields as raw JSON, so what is forwarded to vLLM is copied, never decoded
and re-encoded.

A request is stored as sent, so `decode` refuses what a reader of the store could not read back:
bytes that are not UTF-8 (msgspec checks the strings it decodes, but not the raw JSON it skips: one
`isascii`, then a strict decode of a body that is not plain ASCII), nesting deeper than msgspec's
recursion limit, and integers that the store (64-bit) or vLLM's sampler (token counts: 32-bit) cannot
take, each a 400 naming the field.
"""

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Raw, Struct

from steps.proxy.errors import ProxyError

T = TypeVar("T")
_FIELDS = msgspec.json.Decoder(dict[str, Raw])
_DECODERS: dict[type, msgspec.json.Decoder] = {}
_ENCODE = msgspec.json.Encoder().encode
NULL = Raw(b"null")
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_NAMED = re.compile(r"^(?:Object missing required field )?`(?P<name>[^`]+)`")


INT32_MAX = 2**31 - 1  # vLLM's sampler keeps token counts and top-k as 32-bit integers
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1  # what the store (orjson, Parquet) and vLLM's seed take
Count = Annotated[int, Meta(ge=1, le=INT32_MAX)]  # max_tokens and the like


def check_utf8(data: bytes) -> None:
    """400 if `data` is not UTF-8, naming the byte; plain ASCII (most bodies) is found in one fast pass."""
    if data.isascii():
        return
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        raise ProxyError(400, f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None


def too_large_integer(value, field: str) -> str | None:
    """The path (from `field`, joined by dots) of the first integer in a decoded JSON value that the store
    cannot take (outside 64 bits), or None."""
    stack = [(value, field)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, dict):
            stack.extend((item, f"{at}.{key}") for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, f"{at}.{i}") for i, item in enumerate(value))
        elif isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            return at
    return None


def decode(data: bytes, kind: type[T], fields: bool = True) -> tuple[T, dict[str, Raw]]:
    """The request body checked against `kind`, and its top-level fields as raw JSON (if `fields`: one
    more pass over the body); 400 naming the field if it is not UTF-8, not valid JSON, nested too deeply
    or not a valid request."""
    raw = {}
    check_utf8(data)
    try:
        if fields:
            raw = _FIELDS.decode(data)
        decoder = _DECODERS.get(kind) or _DECODERS.setdefault(kind, msgspec.json.Decoder(kind))
        return decoder.decode(data), raw
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`, got") and " - at `" not in str(exc):  # the body itself
            raise ProxyError(400, "request body must be a JSON object") from None
        message, field = invalid_field(exc)
        raise ProxyError(400, message, param=field) from None
    except msgspec.DecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProxyError(400, "request body is nested too deeply (arrays and objects nest at most a few "
                              "hundred levels)") from None


def decode_part(raw: Raw, kind: type[T], field: str) -> T:
    """A raw field of a checked request decoded as `kind`; 400 naming `field` and the path inside it."""
    decoder = _DECODERS.get(kind) or _DECODERS.setdefault(kind, msgspec.json.Decoder(kind))
    try:
        return decoder.decode(raw)
    except RecursionError:
        raise ProxyError(400, f"request field '{field}' is nested too deeply", param=field) from None
    except msgspec.ValidationError as exc:
        message, inner = invalid_field(exc)
        name = field if inner == "body" else f"{field}.{inner}"
        raise ProxyError(400, message.replace(f"'{inner}'", f"'{name}'", 1), param=name) from None


def plain(value):
    """A value as Python data, decoding it if it was kept as raw JSON."""
    return msgspec.json.decode(value) if isinstance(value, Raw) else value


def expect(raw: Raw, kinds: str, what: str, *field) -> str:
    """The JSON type of a raw value by its first character ('"' a string, "[" an array, "{" an object,
    "n" null...); 400 naming the field (its path, joined by dots) if it is none of `kinds`."""
    kind = chr(memoryview(raw)[0])
    if kind not in kinds:
        name = ".".join(map(str, field))
        raise ProxyError(400, f"invalid request field '{name}': must be {what}", param=name)
    return kind


def join_text(pieces: list, sep: str = "") -> str | Raw:
    """Texts joined. Each piece is a str or a raw JSON string, joined without being decoded: `"ab"`
    and `"cd"` give `"abcd"` (inside its quotes a JSON string is a run of whole characters and
    escapes, so the insides of two strings concatenate)."""
    if all(isinstance(piece, str) for piece in pieces):
        return sep.join(pieces)
    if len(pieces) == 1:
        return pieces[0]
    insides = [bytes(memoryview(piece)[1:-1]) if isinstance(piece, Raw) else _ENCODE(piece)[1:-1] for piece in pieces]
    return Raw(b'"' + _ENCODE(sep)[1:-1].join(insides) + b'"')


def function_tool(name: str, description: Raw, parameters: Raw | dict, strict: bool | None, index: int,
                  schema_field: str) -> dict:
    """A chat function tool for vLLM whose description and schema (raw) are forwarded as sent, null
    meaning none; 400 naming `tools.N.description` or `tools.N.<schema_field>` if one has the wrong type."""
    described = expect(description, '"n', "a string or null", "tools", index, "description") == '"'
    if isinstance(parameters, Raw):
        typed = expect(parameters, "{n", "an object or null", "tools", index, schema_field) == "{"
        parameters = parameters if typed else {"type": "object", "properties": {}}
    fn = {"name": name, "description": description if described else "", "parameters": parameters}
    if strict is not None:  # vLLM then enforces the schema on the arguments
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def one_line(data) -> bytes:
    """JSON bytes on one line, to embed in an SSE event or a log record: line breaks between tokens
    become spaces (inside strings they are always escaped)."""
    data = bytes(data)
    return data.replace(b"\n", b" ").replace(b"\r", b" ") if b"\n" in data or b"\r" in data else data


def invalid_field(exc: msgspec.ValidationError) -> tuple[str, str]:
    """("invalid request field 'messages.0.role': what is wrong", "messages.0.role") from msgspec's
    "Invalid enum value 'robot' - at `$.messages[0].role`"."""
    match = _AT.match(str(exc))
    what, path = match["what"], re.sub(r"\[(\d+)\]", r".\1", match["path"] or "").lstrip(".")
    named = _NAMED.match(what)
    if named:
        path = f"{path}.{named['name']}".lstrip(".")
    field = path or "body"
    return f"invalid request field '{field}': {what}", field


_OUT_OF_RANGE = "holds an integer out of range (64 bits at most)"


def _fits(value, field: str) -> None:
    """For a struct's checks: ValueError naming `field` (msgspec adds the path to the struct) if a decoded
    value holds an integer the store cannot take."""
    at = too_large_integer(value, field)
    if at is not None:
        raise ValueError(f"`{at}` {_OUT_OF_RANGE}")


class Sampling(Struct, kw_only=True):
    """Sampling settings shared by all dialects."""

    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None

    def __post_init__(self) -> None:
        for name in ("tool_choice", "stream_options", "text"):  # decoded as Python data: stored re-encoded
            at = too_large_integer(getattr(self, name, None), name)
            if at is not None:
                raise ProxyError(400, f"invalid request field '{at}': {_OUT_OF_RANGE}", param=at)


# --- OpenAI Chat Completions -------------------------------------------------------------------
class ChatFunctionCall(Struct, kw_only=True):
    name: str
    arguments: str | dict = "{}"

    def __post_init__(self) -> None:
        _fits(self.arguments, "arguments")


class ChatToolCall(Struct, kw_only=True):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Forwarded as sent and never read here: kept raw, only its JSON type is checked.
    content: Raw = Raw(b"null")
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if bytes(memoryview(self.content)[:1]) not in b'"[n':  # a JSON string, array or null, by its first byte
            raise ValueError("`content` must be a string, an array of parts or null")


class ChatPart(Struct, kw_only=True):
    """What the proxy reads of a chat content part to tell text from media; the rest is skipped unread."""

    type: str | None = None
    uuid: Raw | None = None  # vLLM's name of a cached media item


class ChatFunction(Struct, kw_only=True):
    name: str  # description and parameters are forwarded as sent, not decoded here


class ChatTool(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatRequest(Sampling, kw_only=True):
    model: str
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    # vLLM's own integer settings, forwarded as sent: checked here so that vLLM gets only what it takes.
    top_k: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    prompt_logprobs: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None
    priority: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    # Stored among the call's sampling settings: a number past a double's range (1e400) is refused here.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None


# --- OpenAI Responses ----------------------------------------------------------------------------
class ResponsesPart(Struct, kw_only=True):
    """A content part: text (input_text, output_text, reasoning_text, summary_text), refusal, image."""

    type: str = ""
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None
    file_id: str | None = None


class ResponsesItem(Struct, kw_only=True):
    """An input item of any type; each type reads its own fields."""

    type: str = "message"
    role: str | None = None  # message
    content: str | list[ResponsesPart] | None = None  # message; reasoning
    summary: list[ResponsesPart] | None = None  # reasoning
    call_id: str | None = None  # function_call, custom_tool_call and their outputs
    name: str | None = None
    arguments: str | None = None  # function_call
    input: str | None = None  # custom_tool_call
    output: Raw = NULL  # a string (forwarded as sent) or parts; computer_call_output: a screenshot
    action: dict[str, Any] | None = None  # computer_call

    def __post_init__(self) -> None:
        _fits(self.action, "action")


class ResponsesTool(Struct, kw_only=True):
    type: str
    name: str | None = None
    display_width: int | None = None  # computer, computer_use_preview
    display_height: int | None = None
    environment: str | None = None
    description: Raw = NULL  # forwarded as sent
    parameters: Raw = NULL
    strict: bool | None = None


class ResponsesRequest(Sampling, kw_only=True):
    model: str
    input: str | list[ResponsesItem]
    instructions: Raw = NULL  # a string, sent on as (part of) the system message; echoed as sent
    stream: bool = False
    tools: Raw = NULL  # an array, decoded by `responses.to_upstream`; echoed as sent
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: Count | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: None = None  # server-side state is not kept
    text: dict[str, Any] | None = None


# --- Anthropic Messages --------------------------------------------------------------------------
class AnthropicBlock(Struct, kw_only=True):
    """A content block of any type; each type reads its own fields."""

    type: str
    text: str = ""  # text
    thinking: str = ""  # thinking
    id: str | None = None  # tool_use
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None  # tool_result
    content: Raw = NULL  # a string (forwarded as sent) or blocks
    is_error: bool | None = None
    source: dict[str, Any] | None = None  # image, document

    def __post_init__(self) -> None:
        _fits(self.input, "input")
        _fits(self.source, "source")


class AnthropicMessage(Struct, kw_only=True):
    # "system" is not in Anthropic's API, but Claude Code sends it inside `messages`.
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicBlock]


class AnthropicTool(Struct, kw_only=True):
    name: str
    description: Raw = NULL  # forwarded as sent
    input_schema: Raw = NULL
    type: str | None = None
    strict: bool | None = None
    display_width_px: int | None = None  # computer_2025*
    display_height_px: int | None = None
    max_characters: int | None = None  # text_editor_20250728


class MessagesRequest(Sampling, kw_only=True):
    model: str
    messages: Annotated[list[AnthropicMessage], Meta(min_length=1)]
    max_tokens: Count
    system: str | list[AnthropicBlock] | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None
