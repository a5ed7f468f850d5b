"""A fast stand-in for vLLM's chat completions endpoint, for measuring the proxy's own overhead.

    python benchmarks/fake_vllm.py --port 8000

It answers every `/v1/chat/completions` instantly with one canned vLLM-shaped body (token ids and
logprobs included) so that a benchmark times the proxy, not a model. Bare ASGI: no framework cost.
"""

import argparse

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


async def app(scope, receive, send):
    """Drains the request body, then answers with the canned completion (or the model list)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = MODELS if scope["path"].endswith("/models") else BODY
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
