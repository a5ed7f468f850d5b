"""Reasoning through the proxy on the real vLLM (CPU) with a real reasoning parser (`--reasoning-parser qwen3`).

    .venv/bin/python -m pytest -q tests/test_reasoning.py      # ~2 min: one vLLM start for the module

The served model is `tests/thinking_model.py`'s: the tiny tokenizer with weights that always answer
`<think>The first check</think> it is done`, so vLLM's parser has real reasoning to split off. In every
dialect, JSON and SSE, the harness gets the reasoning apart from the text (`reasoning_content`, Anthropic
`thinking` blocks, Responses reasoning items), and the recorded call is token-exact: its response ids are
the model's chain, they decode to exactly the reasoning and text the client saw, its prompt ids are the
chat template's rendering (by the tokenizer here, not by vLLM), and its logprobs equal an independent
re-score by prefill. Reasoning sent back in a later turn reaches the prompt in each dialect's own form.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from steps.vllm_server import ServingOptions
from thinking_model import Chain, build_thinking_model
from vllm_process import serve_vllm

pytestmark = pytest.mark.vllm

NAME = "thinker"
SYSTEM, QUESTION, FOLLOW_UP = "You are terse.", "What did you check?", "And then?"
LOGPROB_TOL = 1e-4
DIALECTS = ["chat_completions", "responses", "messages"]


@dataclass(frozen=True)
class Seen:
    """What the SDK client got: the reasoning and the text, apart."""

    reasoning: str
    text: str


@pytest.fixture(scope="module")
def thinking(tmp_path_factory) -> tuple[Path, Chain]:
    return build_thinking_model(tmp_path_factory.mktemp("thinking-model"))


@pytest.fixture(scope="module")
def thinking_vllm(thinking, tmp_path_factory) -> Iterator[str]:
    """vLLM with the qwen3 reasoning parser serving the thinking model: the suite's one extra vLLM start."""
    options = ServingOptions(reasoning_parser="qwen3", max_model_len=4096)
    with serve_vllm(thinking[0], name=NAME, options=options,
                    log_path=tmp_path_factory.mktemp("vllm-thinking") / "vllm.log") as server:
        yield server.base_url


@pytest.fixture(scope="module")
def recording(proxy, thinking_vllm):
    return proxy(thinking_vllm)


@pytest.fixture(scope="module")
def tokenizer(thinking):
    return AutoTokenizer.from_pretrained(thinking[0])


@pytest.fixture
def rollout(recording, request) -> dict:
    return recording.register(re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:100])


def conversation(history: Seen | None) -> list[dict]:
    """The chat messages each dialect's request means; an earlier answer comes back with its reasoning."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    if history is not None:
        messages += [{"role": "assistant", "content": history.text, "reasoning_content": history.reasoning},
                     {"role": "user", "content": FOLLOW_UP}]
    return messages


def ask_chat(rollout: dict, history: Seen | None, stream: bool) -> Seen:
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    args = dict(model=NAME, messages=conversation(history), temperature=0, max_tokens=32)
    if not stream:
        message = client.chat.completions.create(**args).choices[0].message
        return Seen(message.model_extra.get("reasoning_content") or "", message.content or "")
    reasoning = text = ""
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            text += choice.delta.content or ""
    return Seen(reasoning, text)


def ask_responses(rollout: dict, history: Seen | None, stream: bool) -> Seen:
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    items: list[dict] = [{"role": "user", "content": QUESTION}]
    if history is not None:
        items += [{"type": "reasoning", "id": "rs_1", "summary": [],
                   "content": [{"type": "reasoning_text", "text": history.reasoning}]},
                  {"role": "assistant", "content": history.text}, {"role": "user", "content": FOLLOW_UP}]
    args = dict(model=NAME, instructions=SYSTEM, input=items, temperature=0, max_output_tokens=32)
    if not stream:
        return _responses_seen(client.responses.create(**args).output)
    events = list(client.responses.create(**args, stream=True))
    seen = _responses_seen(events[-1].response.output)
    streamed = Seen("".join(e.delta for e in events if e.type == "response.reasoning_text.delta"),
                    "".join(e.delta for e in events if e.type == "response.output_text.delta"))
    assert streamed == seen, "the streamed deltas do not add up to the final output"
    return seen


def _responses_seen(output) -> Seen:
    reasoning = "".join(part.text for item in output if item.type == "reasoning" for part in item.content or [])
    text = "".join(part.text for item in output if item.type == "message" for part in item.content)
    return Seen(reasoning, text)


def ask_messages(rollout: dict, history: Seen | None, stream: bool) -> Seen:
    client = anthropic.Anthropic(base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    if history is not None:
        messages += [{"role": "assistant", "content": [
                         {"type": "thinking", "thinking": history.reasoning, "signature": ""},
                         {"type": "text", "text": history.text}]},
                     {"role": "user", "content": FOLLOW_UP}]
    args = dict(model=NAME, system=SYSTEM, messages=messages, max_tokens=32, extra_body={"temperature": 0})
    if stream:
        with client.messages.stream(**args) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**args)
    return Seen("".join(block.thinking for block in message.content if block.type == "thinking"),
                "".join(block.text for block in message.content if block.type == "text"))


ASK = {"chat_completions": ask_chat, "responses": ask_responses, "messages": ask_messages}


def rescored(vllm_url: str, prompt: list[int], response: list[int]) -> list[float]:
    """Each response token's logprob from a prefill of prompt + response (`prompt_logprobs`), not decoding."""
    body = {"model": NAME, "prompt": prompt + response, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    answer = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=120).json()
    entries = answer["choices"][0]["prompt_logprobs"][len(prompt):]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, response)]


def rendered(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt the chat template makes of `messages`, tokenized here (vLLM's own rendering is not evidence)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_gets_the_reasoning_apart_and_the_record_is_token_exact(dialect, stream, thinking, recording,
                                                                            rollout, thinking_vllm, tokenizer):
    chain = thinking[1]
    seen = ASK[dialect](rollout, None, stream)
    assert seen == Seen(chain.reasoning, chain.answer)
    call = recording.calls(rollout["rollout_id"])[-1]
    assert (call["dialect"], call["stream"], call["status"]) == (dialect, stream, "ok")
    assert call["response_token_ids"] == chain.token_ids
    # What the client got, reasoning and text apart, is exactly what the recorded tokens say.
    assert tokenizer.decode(call["response_token_ids"][:-1]) == f"<think>{seen.reasoning}</think>{seen.text}"
    assert call["prompt_token_ids"] == rendered(tokenizer, conversation(None))
    assert call["response_logprobs"] == pytest.approx(
        rescored(thinking_vllm, call["prompt_token_ids"], call["response_token_ids"]), abs=LOGPROB_TOL)
    assert len(set(call["response_logprobs"])) == len(chain.token_ids)  # a shifted record could not match


@pytest.mark.parametrize("dialect", DIALECTS)
def test_reasoning_sent_back_reaches_the_prompt(dialect, recording, rollout, tokenizer, thinking):
    """An earlier answer's reasoning, in the dialect's own form, is in the next prompt as the template puts it
    (`<think>\\n...\\n</think>`); the control is the same history without it, which renders differently."""
    chain = thinking[1]
    history = Seen(chain.reasoning, chain.answer)
    ASK[dialect](rollout, history, stream=False)
    prompt = recording.calls(rollout["rollout_id"])[-1]["prompt_token_ids"]
    assert prompt == rendered(tokenizer, conversation(history))
    assert f"<think>\n{chain.reasoning}\n</think>" in tokenizer.decode(prompt)
    without = conversation(history)
    del without[2]["reasoning_content"]
    assert rendered(tokenizer, without) != prompt
