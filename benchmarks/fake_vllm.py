"""A fast stand-in for vLLM's chat completions endpoint, for measuring the proxy's own overhead.

    python benchmarks/fake_vllm.py --port 8000 [--delay-ms 0]

It answers every `/v1/chat/completions` instantly with a canned vLLM-shaped body so that a benchmark
times the proxy, not a model. As vLLM does, it sends token ids and logprobs only to a request that asks
for them (`return_token_ids`, as the proxy does; a harness calling vLLM directly does not), and then
one prompt token id per ~4 bytes of the request (an agent's 30-80 KB request is 8-20k tokens).
Bare ASGI: no framework cost.
`--delay-ms` (or `POST /delay {"ms": N}`) makes each completion take that long, like a model
generating, without using CPU.
"""

import argparse
import asyncio
import functools

import orjson
import uvicorn

RESPONSE_TOKENS = 64
BYTES_PER_TOKEN = 4


def completion(prompt_tokens: int, token_ids: bool = True) -> bytes:
    """The canned answer to a prompt of `prompt_tokens` tokens, with token ids and logprobs or without."""
    tokens = {
        "prompt_token_ids": [1000 + i % 50000 for i in range(prompt_tokens)],
        "token_ids": list(range(RESPONSE_TOKENS)),
        "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}
                                 for _ in range(RESPONSE_TOKENS)]},
    } if token_ids else {"prompt_token_ids": None, "token_ids": None, "logprobs": None}
    return orjson.dumps({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
        "prompt_token_ids": tokens["prompt_token_ids"],
        "choices": [{
            "index": 0, "finish_reason": "tool_calls", "stop_reason": None,
            "token_ids": tokens["token_ids"],
            "logprobs": tokens["logprobs"],
            "message": {"role": "assistant", "content": "Let me look.", "reasoning_content": None,
                        "tool_calls": [{"id": "call_1", "type": "function",
                                        "function": {"name": "exec_command", "arguments": "{\"cmd\": \"ls -la\"}"}}]},
        }],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": RESPONSE_TOKENS,
                  "total_tokens": prompt_tokens + RESPONSE_TOKENS},
    })


@functools.lru_cache(maxsize=64)
def answer_for(request_bytes: int, token_ids: bool = True) -> bytes:
    """The answer to a request of that size (a benchmark sends a few fixed requests: built once each)."""
    return completion(max(1, request_bytes // BYTES_PER_TOKEN), token_ids)


def asks_for_token_ids(body: bytes) -> bool:
    """Whether a chat request sets `return_token_ids` (found by its bytes: decoding 50 KB would cost more
    than the rest of this server's answer)."""
    at = body.rfind(b'"return_token_ids"')
    return at >= 0 and body[at + 18:at + 30].lstrip(b": ").startswith(b"true")
MODELS = orjson.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]})


def make_app(delay_s: float = 0.0):
    """The ASGI app; every completion is answered `delay_s` after its body arrived.

    `POST /delay` with `{"ms": N}` changes that delay for later calls (a benchmark's control knob).
    """
    settings = {"delay_s": delay_s}

    async def app(scope, receive, send):
        """Drains the request body, then answers with the canned completion (or the model list)."""
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if scope["path"].endswith("/models"):
            body = MODELS
        elif scope["path"] == "/delay":
            settings["delay_s"] = orjson.loads(b"".join(chunks))["ms"] / 1000
            body = b"{}"
        else:
            request = b"".join(chunks)
            body = answer_for(len(request), asks_for_token_ids(request))
            if settings["delay_s"]:
                await asyncio.sleep(settings["delay_s"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    return app


app = make_app()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="time each completion takes")
    args = parser.parse_args()
    uvicorn.run(make_app(args.delay_ms / 1000), host="127.0.0.1", port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
