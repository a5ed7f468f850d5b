"""Request models of the three dialects the proxy speaks, checked before anything goes upstream.

They type what the proxy reads and bound what it forwards; unknown fields are allowed (harnesses
send many vendor extras) and ignored. Responses are built as plain dicts by each dialect module.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Loose = ConfigDict(extra="allow")


class Sampling(BaseModel):
    """Sampling settings shared by all dialects."""

    model_config = Loose
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None


# --- OpenAI Chat Completions -------------------------------------------------------------------
class ChatFunctionCall(BaseModel):
    model_config = Loose
    name: str
    arguments: str | dict = "{}"


class ChatToolCall(BaseModel):
    model_config = Loose
    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatMessage(BaseModel):
    model_config = Loose
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None


class ChatTool(BaseModel):
    model_config = Loose
    type: Literal["function"] = "function"
    function: dict[str, Any]


class ChatRequest(Sampling):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


# --- OpenAI Responses ----------------------------------------------------------------------------
class ResponsesRequest(Sampling):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    parallel_tool_calls: bool | None = None
    previous_response_id: None = Field(default=None, description="server-side state is not kept")
    text: dict[str, Any] | None = None


# --- Anthropic Messages --------------------------------------------------------------------------
class AnthropicMessage(BaseModel):
    model_config = Loose
    # "system" is not in Anthropic's API, but Claude Code sends it inside `messages`.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class AnthropicTool(BaseModel):
    model_config = Loose
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class MessagesRequest(Sampling):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    top_k: int | None = Field(default=None, ge=-1)
