"""The proxy is token-exact against the real vLLM, in every dialect, streamed or not, through the official SDKs.

Each call goes SDK -> proxy -> tap -> vLLM. The tap (a loopback pass-through defined here) keeps the exact
chat request vLLM received and vLLM's exact answer, outside the proxy, so every recorded call is checked
against evidence the proxy's own bookkeeping cannot have shaped:

(a) prompt: recorded `prompt_token_ids` == vLLM's answer == a replay of the same upstream request ==
    vLLM's `/tokenize` of the conversation the dialect request means, written out by hand in this file
    as chat messages (so a wrong translation of tool calls or tool results fails here);
(b) response: recorded `response_token_ids` == vLLM's answer == the replay's, and decoded with the
    tokenizer they are exactly the text / tool calls the SDK client received;
(c) logprobs: recorded `response_logprobs` == vLLM's answer == the replay's; and for unconstrained
    temperature-0 calls also == an independent re-score of prompt + response by `/v1/completions`
    `prompt_logprobs` (a different code path: prefill, not decode). Tolerance 1e-4 nats: on this CPU all
    three agree bit for bit; the margin only absorbs bf16 reduction-order noise should batching differ.
    Forced tool calls are excluded from the re-score: vLLM's `processed_logprobs` are taken after the
    grammar mask, so they are the sampler's (renormalised) logprobs, not the raw model's;
(d) `dialect`, `weight_version`, `call_index` and the `sampling` settings (as they reached vLLM); with the
    run's sampling forced (`--sampling`), vLLM gets the run's whatever the harness asked, the record keeps
    both, and a checkpoint's generation_config.json decides nothing (vLLM's own logprobs show it).

Temperature 0 wherever answers are compared; the sampled case fixes `seed`, so its replay is exact too.
"""

import json
import re
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from steps.net import HOST, free_port
from steps.sampling import KEYS, NEUTRAL, RESHAPING, as_flags
from steps.vllm_server import spawn, stop_vllm, vllm_command, wait_healthy

pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4
SYSTEM = "You are a weather assistant."
QUESTION = "What is the weather in Paris?"
FOLLOW_UP = "And in Rome?"
TOOL_RESULT = "Sunny, 21 C."
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}
TOOL_NAME, TOOL_DESCRIPTION = "get_weather", "Current weather in a city."
# What vLLM must receive for the tool in every dialect. `strict` makes vLLM's grammar enforce the schema,
# so the random model's forced call is a small JSON object (without it the arguments are free JSON).
CHAT_TOOL = {"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                                              "parameters": CITY, "strict": True}}
PRIOR_ARGUMENTS = {"city": "Paris"}


# --- the tap ---------------------------------------------------------------------------------------
class Tap:
    """A pass-through to vLLM on loopback that keeps every exchange: (method, path, request, status, answer)."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[dict] = []
        self._lock = threading.Lock()
        tap = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0)) or None
                req = urllib.request.Request(tap.upstream + self.path, data=body, method=self.command,
                                             headers={"content-type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as resp:
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as err:
                    status, answer = err.code, err.read()
                try:
                    parsed = json.loads(answer)
                except ValueError:
                    parsed = answer.decode(errors="replace")
                with tap._lock:
                    tap.exchanges.append({"method": self.command, "path": self.path, "status": status,
                                          "request": json.loads(body) if body else None, "answer": parsed})
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def chat_exchanges(self) -> list[dict]:
        with self._lock:
            return [e for e in self.exchanges if e["path"] == "/v1/chat/completions"]


def vllm(base_url: str, path: str, body: dict) -> dict:
    """One JSON POST straight to vLLM (not through the proxy or the tap)."""
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


# --- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tap(vllm_server: str) -> Iterator[Tap]:
    tap = Tap(vllm_server)
    yield tap
    tap.server.shutdown()
    tap.server.server_close()


@pytest.fixture(scope="module")
def recording_proxy(proxy, tap: Tap):
    """The real proxy, with the tap as its upstream."""
    return proxy(tap.url)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def rollout(recording_proxy, request) -> dict:
    """A fresh rollout named after the test."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:100]
    return recording_proxy.register(name)


# --- what the SDK client saw ------------------------------------------------------------------------
@dataclass
class Seen:
    """A dialect's answer reduced to what token-exactness is about."""

    text: str | None
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)
    finish: str | None = None  # in the dialect's own terms


def conversation(kind: str) -> list[dict]:
    """The chat messages every dialect's request below means (what vLLM must render)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    if kind == "history":
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": TOOL_NAME, "arguments": json.dumps(PRIOR_ARGUMENTS)}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
            {"role": "user", "content": FOLLOW_UP},
        ]
    return messages


def ask_chat(rollout: dict, kind: str, stream: bool) -> Seen:
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    args = dict(model="tiny", messages=conversation(kind), temperature=0, max_tokens=16)
    if kind != "plain":
        args["tools"] = [CHAT_TOOL]
    if kind == "forced":
        args.update(tool_choice="required", parallel_tool_calls=False, max_tokens=64)
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        return Seen(choice.message.content, calls, choice.finish_reason)
    text, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
            finish = choice.finish_reason or finish
    return Seen(text, [(name, json.loads(arguments)) for _, (name, arguments) in sorted(calls.items())], finish)


def _responses_seen(response) -> Seen:
    text = "".join(part.text for item in response.output if item.type == "message" for part in item.content)
    calls = [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]
    return Seen(text, calls, response.status)


def ask_responses(rollout: dict, kind: str, stream: bool) -> Seen:
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    items: list[dict] = [{"role": "user", "content": QUESTION}]
    if kind == "history":
        items += [{"type": "function_call", "call_id": "call_1", "name": TOOL_NAME,
                   "arguments": json.dumps(PRIOR_ARGUMENTS)},
                  {"type": "function_call_output", "call_id": "call_1", "output": TOOL_RESULT},
                  {"role": "user", "content": FOLLOW_UP}]
    args = dict(model="tiny", instructions=SYSTEM, input=items, temperature=0, max_output_tokens=16)
    if kind != "plain":
        args["tools"] = [{"type": "function", "name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                          "parameters": CITY, "strict": True}]
    if kind == "forced":
        args.update(tool_choice="required", parallel_tool_calls=False, max_output_tokens=64)
    if not stream:
        return _responses_seen(client.responses.create(**args))
    events = list(client.responses.create(**args, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    seen = _responses_seen(events[-1].response)
    assert kinds.count("response.output_item.done") == len(events[-1].response.output)
    streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert streamed == seen.text, "the text deltas do not add up to the final text"
    return seen


def ask_messages(rollout: dict, kind: str, stream: bool) -> Seen:
    client = anthropic.Anthropic(base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    if kind == "history":
        messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME,
                                                        "input": PRIOR_ARGUMENTS}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                   "content": TOOL_RESULT},
                                                  {"type": "text", "text": FOLLOW_UP}]}]
    # The Anthropic SDK has no sampling parameters any more; the proxy still reads them from the body.
    args = dict(model="tiny", system=SYSTEM, messages=messages, max_tokens=16, extra_body={"temperature": 0})
    if kind != "plain":
        args["tools"] = [{"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": CITY, "strict": True}]
    if kind == "forced":
        args.update(tool_choice={"type": "any", "disable_parallel_tool_use": True}, max_tokens=64)
    if stream:
        with client.messages.stream(**args) as events:
            streamed = "".join(events.text_stream)
            message = events.get_final_message()
    else:
        message = client.messages.create(**args)
    text = "".join(block.text for block in message.content if block.type == "text")
    if stream:
        assert streamed == text, "the text deltas do not add up to the final text"
    calls = [(block.name, block.input) for block in message.content if block.type == "tool_use"]
    return Seen(text, calls, message.stop_reason)


ASK = {"chat_completions": ask_chat, "responses": ask_responses, "messages": ask_messages}


def finish_in_dialect(dialect: str, finish_reason: str) -> str:
    """vLLM's finish reason as each dialect reports it."""
    if dialect == "responses":
        return "incomplete" if finish_reason == "length" else "completed"
    if dialect == "messages":
        return {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[finish_reason]
    return finish_reason


# --- independent evidence ----------------------------------------------------------------------------
def decoded(tokenizer, ids: list[int], tools_offered: bool) -> Seen:
    """The answer as the tokenizer reads the recorded ids, parsed the hermes way, independent of vLLM's parser.

    The stop token's text is never part of an answer; with tools offered the hermes parser makes vLLM keep
    special tokens in the text, otherwise vLLM skips them.
    """
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=not tools_offered)
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
    try:
        calls = [json.loads(block) for block in blocks]
    except json.JSONDecodeError:
        return Seen(text)
    return Seen(text.split("<tool_call>")[0] if calls else text, [(c["name"], c["arguments"]) for c in calls])


def check_token_exact(call: dict, exchange: dict, vllm_url: str, tokenizer, expected_messages: list[dict],
                      expected_tools: list[dict] | None, unconstrained: bool) -> None:
    """(a)-(c) of the module docstring for one recorded call and the upstream exchange the tap saw."""
    sent, answer = exchange["request"], exchange["answer"]
    choice = answer["choices"][0]
    vllm_logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert exchange["status"] == 200
    assert len(call["prompt_token_ids"]) > 0 and len(call["response_token_ids"]) > 0, "nothing to compare"
    assert len(vllm_logprobs) == len(choice["token_ids"])
    # What the proxy recorded is what vLLM answered, bit for bit.
    assert call["prompt_token_ids"] == answer["prompt_token_ids"]
    assert call["response_token_ids"] == choice["token_ids"]
    assert call["response_logprobs"] == vllm_logprobs
    assert call["finish_reason"] == choice["finish_reason"]
    # (a) The prompt is the conversation the dialect request means, rendered by vLLM's own template.
    assert sent.get("tools") == expected_tools
    rendered = vllm(vllm_url, "/tokenize", {"model": "tiny", "messages": expected_messages, "add_generation_prompt": True,
                                            **({"tools": sent["tools"]} if expected_tools else {})})
    assert rendered["tokens"] == call["prompt_token_ids"], "the proxy's translation changed what the model sees"
    # (a)-(c) Sent again straight to vLLM, the same request gives the same tokens and logprobs.
    replay = vllm(vllm_url, "/v1/chat/completions", sent)
    assert replay["prompt_token_ids"] == call["prompt_token_ids"]
    assert replay["choices"][0]["token_ids"] == call["response_token_ids"]
    assert [e["logprob"] for e in replay["choices"][0]["logprobs"]["content"]] == pytest.approx(
        call["response_logprobs"], abs=LOGPROB_TOL)
    if unconstrained:  # (c) re-scored by prefill: the model's own logprob of each sampled token
        ids = call["prompt_token_ids"] + call["response_token_ids"]
        scored = vllm(vllm_url, "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 1,
                                                   "temperature": 0, "prompt_logprobs": 0})
        per_position = scored["choices"][0]["prompt_logprobs"][len(call["prompt_token_ids"]):]
        rescored = [entry[str(token)]["logprob"] for entry, token in zip(per_position, call["response_token_ids"])]
        assert rescored == pytest.approx(call["response_logprobs"], abs=LOGPROB_TOL)


def one_call(tap: Tap, recording_proxy, rollout: dict, dialect: str, kind: str,
             stream: bool) -> tuple[Seen, dict, dict]:
    """Makes one SDK call; returns what the client saw, the recorded call, and the one upstream exchange."""
    before = len(tap.chat_exchanges())
    seen = ASK[dialect](rollout, kind, stream)
    exchanges = tap.chat_exchanges()[before:]
    assert len(exchanges) == 1, f"expected one upstream call, the tap saw {len(exchanges)}"
    call = recording_proxy.calls(rollout["rollout_id"])[-1]
    return seen, call, exchanges[0]


# --- tests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", ["plain", "forced", "history"])
@pytest.mark.parametrize("dialect", ["chat_completions", "responses", "messages"])
def test_every_dialect_records_exactly_what_vllm_computed(dialect, kind, stream, tap, recording_proxy, rollout,
                                                          vllm_server, tokenizer):
    seen, call, exchange = one_call(tap, recording_proxy, rollout, dialect, kind, stream)

    assert (call["dialect"], call["stream"], call["status"], call["call_index"]) == (dialect, stream, "ok", 0)
    assert call["weight_version"] and call["weight_version"] == recording_proxy.client.health()["weight_version"]
    check_token_exact(call, exchange, vllm_server, tokenizer, conversation(kind),
                      None if kind == "plain" else [CHAT_TOOL], unconstrained=kind != "forced")
    # (b) The ids decode to exactly what the SDK client received.
    expected = decoded(tokenizer, call["response_token_ids"], tools_offered=kind != "plain")
    assert (seen.text or None) == (expected.text or None)
    assert seen.tool_calls == expected.tool_calls
    assert seen.finish == finish_in_dialect(dialect, call["finish_reason"])
    if kind == "forced":  # the hermes parser turned the random model's grammar-forced output into one call
        assert [name for name, _ in seen.tool_calls] == [TOOL_NAME] and call["finish_reason"] == "tool_calls"
        assert call["response_token_ids"][-1] == tokenizer.eos_token_id  # the stop token is recorded
    else:
        assert seen.text, "a free-text answer should not be empty"


# Settings in each SDK's own terms; what an SDK has no parameter for goes in the body as an extra.
SAMPLED = {
    "chat_completions": dict(temperature=0.7, top_p=0.9, max_tokens=5, stop=["\n\n\n"], seed=7),
    "responses": dict(temperature=0.7, top_p=0.9, max_output_tokens=5, extra_body={"seed": 7}),
    "messages": dict(max_tokens=5, stop_sequences=["\n\n\n"],
                     extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 50, "seed": 7}),
}
# The same settings in vLLM's chat terms: what the tap must see and the record must show.
SAMPLED_UPSTREAM = {
    "chat_completions": dict(temperature=0.7, top_p=0.9, max_tokens=5, stop=["\n\n\n"], seed=7),
    "responses": dict(temperature=0.7, top_p=0.9, max_tokens=5, seed=7),
    "messages": dict(temperature=0.7, top_p=0.9, top_k=50, max_tokens=5, stop=["\n\n\n"], seed=7),
}


@pytest.mark.parametrize("dialect", ["chat_completions", "responses", "messages"])
def test_sampling_settings_reach_vllm_unchanged(dialect, tap, recording_proxy, rollout, vllm_server,
                                                tokenizer):
    before = len(tap.chat_exchanges())
    seen = _ask_sampled(dialect, rollout, SAMPLED[dialect])
    (exchange,) = tap.chat_exchanges()[before:]
    (call,) = recording_proxy.calls(rollout["rollout_id"])

    wanted = SAMPLED_UPSTREAM[dialect]
    assert {k: exchange["request"].get(k) for k in wanted} == wanted, "vLLM did not get the settings as sent"
    assert {k: call["sampling"].get(k) for k in wanted} == wanted, "the record does not show the settings"
    assert len(call["response_token_ids"]) == 5 and call["finish_reason"] == "length"
    assert seen.finish == finish_in_dialect(dialect, "length")
    # Seeded, so even a sampled call replays exactly; re-scoring does not apply (temperature != 0).
    check_token_exact(call, exchange, vllm_server, tokenizer, conversation("plain"), None, unconstrained=False)
    assert (seen.text or None) == (decoded(tokenizer, call["response_token_ids"], False).text or None)


def _ask_sampled(dialect: str, rollout: dict, settings: dict) -> Seen:
    """A plain call with these sampling settings instead of the helpers' temperature 0 and 16 tokens."""
    if dialect == "chat_completions":
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        choice = client.chat.completions.create(model="tiny", messages=conversation("plain"), **settings).choices[0]
        return Seen(choice.message.content, [], choice.finish_reason)
    if dialect == "responses":
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        return _responses_seen(client.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, **settings))
    client = anthropic.Anthropic(base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], max_retries=0)
    message = client.messages.create(model="tiny", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}],
                                     **settings)
    return Seen("".join(b.text for b in message.content if b.type == "text"), [], message.stop_reason)


def test_one_rollout_numbers_its_calls_in_order_across_dialects(tap, recording_proxy, rollout):
    plan = [("chat_completions", False), ("responses", True), ("messages", False), ("chat_completions", True),
            ("messages", True)]
    before = len(tap.chat_exchanges())
    for dialect, stream in plan:
        ASK[dialect](rollout, "plain", stream)
    exchanges = tap.chat_exchanges()[before:]
    calls = recording_proxy.calls(rollout["rollout_id"])
    assert [(c["call_index"], c["dialect"], c["stream"]) for c in calls] == [
        (i, dialect, stream) for i, (dialect, stream) in enumerate(plan)]
    assert [c["response_token_ids"] for c in calls] == [e["answer"]["choices"][0]["token_ids"] for e in exchanges]
    assert len({c["weight_version"] for c in calls}) == 1


@pytest.mark.parametrize("dialect", ["chat_completions", "messages"])
def test_a_stop_string_cuts_the_text_but_the_sampled_tokens_are_all_recorded(dialect, tap, recording_proxy, rollout,
                                                                             vllm_server, tokenizer):
    # The greedy answer straight from vLLM; stop on the text of one of its later tokens.
    free = vllm(vllm_server, "/v1/chat/completions", {"model": "tiny", "messages": conversation("plain"),
                                                      "max_tokens": 8, "temperature": 0, "return_token_ids": True})
    free_ids = free["choices"][0]["token_ids"]
    stop = next(text for text in (tokenizer.decode([i]) for i in free_ids[2:]) if len(text.strip()) >= 2)
    before = len(tap.chat_exchanges())
    if dialect == "chat_completions":
        client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
        choice = client.chat.completions.create(model="tiny", messages=conversation("plain"), temperature=0,
                                                max_tokens=8, stop=[stop]).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    else:
        client = anthropic.Anthropic(base_url=rollout["anthropic_base_url"], api_key=rollout["api_key"], max_retries=0)
        message = client.messages.create(model="tiny", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}],
                                         max_tokens=8, stop_sequences=[stop], extra_body={"temperature": 0})
        text, finish = "".join(b.text for b in message.content if b.type == "text"), message.stop_reason
        assert message.stop_sequence == stop
    (exchange,) = tap.chat_exchanges()[before:]
    (call,) = recording_proxy.calls(rollout["rollout_id"])

    check_token_exact(call, exchange, vllm_server, tokenizer, conversation("plain"), None, unconstrained=True)
    assert call["sampling"]["stop"] == [stop] and call["finish_reason"] == "stop"
    assert finish == {"chat_completions": "stop", "messages": "stop_sequence"}[dialect]
    # vLLM hides the stop string from the text, but the token that completed it was sampled and is recorded.
    ids = call["response_token_ids"]
    assert ids == free_ids[:len(ids)]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert stop in full and text == full[:full.index(stop)]


# --- the run's sampling, forced ----------------------------------------------------------------------
RUN_SAMPLING = dict(NEUTRAL)  # a run's defaults: temperature 1.0, every other key neutral
# What a harness asks for instead, in each SDK's own terms (Anthropic's top_k as well).
HARNESS_ASKS = {
    "chat_completions": dict(temperature=0.2, top_p=0.5, max_tokens=5, presence_penalty=0.5,
                             logit_bias={"10": 100}, extra_body={"min_tokens": 3, "allowed_token_ids": [10, 11]}),
    "responses": dict(temperature=0.2, top_p=0.5, max_output_tokens=5),
    "messages": dict(max_tokens=5, extra_body={"temperature": 0.2, "top_p": 0.5, "top_k": 5}),
}
HARNESS_ASKS_UPSTREAM = {  # the same in vLLM's chat terms: what the record keeps as asked
    "chat_completions": dict(temperature=0.2, top_p=0.5, presence_penalty=0.5, logit_bias={"10": 100},
                             min_tokens=3, allowed_token_ids=[10, 11]),
    "responses": dict(temperature=0.2, top_p=0.5),
    "messages": dict(temperature=0.2, top_p=0.5, top_k=5),
}


@pytest.fixture(scope="module")
def forcing_proxy(proxy, tap: Tap):
    """The real proxy as the serve step runs it: the run's sampling forced, the tap as its upstream."""
    return proxy(tap.url, extra=as_flags(RUN_SAMPLING))


@pytest.mark.parametrize("dialect", ["chat_completions", "responses", "messages"])
def test_the_runs_sampling_reaches_vllm_whatever_the_harness_asked(dialect, tap, forcing_proxy, request):
    """A harness's temperature 0.2 and top_p 0.5 reach vLLM as the run's 1.0 and 1.0; the record keeps both.
    The control is `test_sampling_settings_reach_vllm_unchanged`: without `--sampling` the tap sees the
    harness's own settings, so this tap can tell."""
    rollout = forcing_proxy.register(re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")[:100])
    before = len(tap.chat_exchanges())
    _ask_sampled(dialect, rollout, HARNESS_ASKS[dialect])
    (exchange,) = tap.chat_exchanges()[before:]
    (call,) = forcing_proxy.calls(rollout["rollout_id"])

    assert {key: exchange["request"].get(key) for key in KEYS} == RUN_SAMPLING, "vLLM did not get the run's sampling"
    assert {key: call["sampling"].get(key) for key in KEYS} == RUN_SAMPLING
    assert not set(RESHAPING) & set(exchange["request"]), "a field that reshapes the distribution reached vLLM"
    asked = HARNESS_ASKS_UPSTREAM[dialect]
    assert {key: call["sampling_requested"].get(key) for key in asked} == asked
    assert call["sampling_requested"]["max_tokens"] == call["sampling"]["max_tokens"] == 5


def top_logprobs(choice: dict) -> dict[str, float]:
    """The first token's top logprobs by token (vLLM may list the sampled token beside the top ones)."""
    return {entry["token"]: entry["logprob"] for entry in choice["logprobs"]["content"][0]["top_logprobs"]}


def top_differences(choice: dict, tokens: list[str]) -> list[float]:
    """How far below `tokens[0]` each other token's logprob is (these scale with 1 / temperature)."""
    logprobs = top_logprobs(choice)
    return [logprobs[tokens[0]] - logprobs[token] for token in tokens[1:]]


@pytest.fixture(scope="module")
def checkpoint_defaults_server(tiny_model, tmp_path_factory) -> Iterator[str]:
    """vLLM on a copy of the tiny model whose generation_config.json says what Qwen3's do (temperature 0.6,
    top_p 0.95, top_k 20), started WITHOUT `--generation-config vllm`, so that it takes them as its defaults:
    the proxy in front must override them. (The serve step's vLLM also has the flag: the session server's
    command, `vllm_command`, has it; one extra vLLM start is kept for this case.)"""
    folder = tmp_path_factory.mktemp("qwen3-defaults") / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(
        {**config, "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    port = free_port()
    command = vllm_command(folder, "tiny", port)
    at = command.index("--generation-config")
    del command[at:at + 2]
    server = spawn(command, folder, "tiny", port, folder.parent / "vllm.log")
    try:
        wait_healthy(server, 300)
        yield server.base_url
    finally:
        stop_vllm(server)


def test_a_checkpoints_generation_config_does_not_decide_the_temperature(checkpoint_defaults_server, proxy):
    """Shown by vLLM's own (processed) logprobs: through the proxy, a call that names no sampling is sampled
    at the run's temperature 1.0 with top_p and top_k off, exactly as a direct call that says so; straight to
    this vLLM (the control) the same call gets the checkpoint's 0.6, its top logprob gaps 1 / 0.6 times wider."""
    body = {"model": "tiny", "messages": conversation("plain"), "max_tokens": 1, "logprobs": True, "top_logprobs": 5}
    served = proxy(checkpoint_defaults_server, extra=as_flags(RUN_SAMPLING))
    rollout = served.register("checkpoint-generation-config")
    client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
    through_proxy = client.chat.completions.create(**body).model_dump()["choices"][0]
    at_run = vllm(checkpoint_defaults_server, "/v1/chat/completions", {**body, **RUN_SAMPLING})["choices"][0]
    at_06 = vllm(checkpoint_defaults_server, "/v1/chat/completions",
                 {**body, "temperature": 0.6, "top_p": 1.0, "top_k": 0})["choices"][0]
    unset = vllm(checkpoint_defaults_server, "/v1/chat/completions", body)["choices"][0]

    ranked = sorted(top_logprobs(at_run), key=top_logprobs(at_run).get, reverse=True)[:4]  # the same at any T
    reference, cooler = top_differences(at_run, ranked), top_differences(at_06, ranked)
    assert min(reference) > 0.01, "the top logprobs are too close to tell temperatures apart"
    assert cooler == pytest.approx([d / 0.6 for d in reference], rel=0.02)  # the test can tell 1.0 from 0.6
    assert top_differences(through_proxy, ranked) == pytest.approx(reference, rel=0.02, abs=1e-3)
    # top_p / top_k forced off too: absolute logprobs (renormalised after any cut) match the direct call's.
    assert top_logprobs(through_proxy)[ranked[0]] == pytest.approx(top_logprobs(at_run)[ranked[0]], abs=1e-3)
    assert top_differences(unset, ranked) == pytest.approx(cooler, rel=0.02, abs=1e-3)  # control: the checkpoint's
