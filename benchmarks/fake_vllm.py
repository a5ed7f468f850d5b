"""A fast stand-in for vLLM's chat completions endpoint, for measuring the proxy's own overhead.

    python benchmarks/fake_vllm.py --port 8000 [--delay-ms 0]

It answers every `/v1/chat/completions` instantly with one canned vLLM-shaped body (token ids and
logprobs included) so that a benchmark times the proxy, not a model. Bare ASGI: no framework cost.
`--delay-ms` (or `POST /delay {"ms": N}`) makes each completion take that long, like a model
generating, without using CPU.
"""

import argparse
import asyncio

import orjson
import uvicorn

RESPONSE_TOKENS = 64
BODY = orjson.dumps({
    "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
    "prompt_token_ids": list(range(2000)),
    "choices": [{
        "index": 0, "finish_reason": "tool_calls", "stop_reason": None,
        "token_ids": list(range(RESPONSE_TOKENS)),
        "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}
                                 for _ in range(RESPONSE_TOKENS)]},
        "message": {"role": "assistant", "content": "Let me look.", "reasoning_content": None,
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": "exec_command", "arguments": "{\"cmd\": \"ls -la\"}"}}]},
    }],
    "usage": {"prompt_tokens": 2000, "completion_tokens": RESPONSE_TOKENS, "total_tokens": 2000 + RESPONSE_TOKENS},
})
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
        body = MODELS if scope["path"].endswith("/models") else BODY
        if scope["path"] == "/delay":
            settings["delay_s"] = orjson.loads(b"".join(chunks))["ms"] / 1000
            body = b"{}"
        elif settings["delay_s"] and body is BODY:
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
