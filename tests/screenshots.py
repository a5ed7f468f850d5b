"""Screenshots and an upstream that records what the proxy sends it, for the image store and sample tests.

    png = screenshot(3)                              # a 1280x720 PNG, its content drawn from the seed
    with CapturingUpstream() as upstream:            # upstream.url; upstream.bodies: every chat body sent
        ...

Why a double upstream: these tests are about what the proxy stores and how calls merge into samples, not
about a model; real vLLM with a vision model costs minutes per start here (the serving tests run it). The
upstream is `benchmarks/fake_vllm.py`'s app (vLLM's answer shape, token ids when asked) on a loopback
thread; with `image_tokens` it answers like vLLM on a Qwen-VL model: prompt ids with one run of
`IMAGE_PAD` per image, of the length that function gives, between `VISION_START` and `VISION_END`.
"""

import base64
import hashlib
import importlib.util
import io
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import uvicorn

from steps.net import HOST, free_port

ROOT = Path(__file__).resolve().parents[1]
VISION_START, VISION_END, IMAGE_PAD = 151652, 151653, 151655  # Qwen2.5-VL's ids
RESPONSE = [7, 8, 9]


def screenshot(seed: int, size: tuple[int, int] = (1280, 720)) -> bytes:
    """A PNG of `size` that looks like a page: a bar, boxes and text placed by `seed` (different seeds:
    different bytes, the same size)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", size, (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, size[0], 60), fill=(rng.randrange(256), 90, 160))
    for n in range(12):
        x, y = rng.randrange(max(size[0] - 200, 1)), rng.randrange(min(80, size[1] - 1), max(size[1] - 40, 81))
        draw.rectangle((x, y, x + rng.randrange(40, 200), y + 30), outline=(0, 0, 0), fill=(255, 255, 255))
        draw.text((x + 4, y + 8), f"button {seed}-{n}", fill=(20, 20, 20))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def data_url(png: bytes) -> str:
    """The chat `image_url` data URL of a PNG."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def sha(data: bytes) -> str:
    """The store's name for an image's bytes."""
    return hashlib.sha256(data).hexdigest()


def _fake_vllm():
    spec = importlib.util.spec_from_file_location("fake_vllm", ROOT / "benchmarks" / "fake_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vision_prompt(body: dict, image_tokens: Callable[[bytes], int]) -> list[int]:
    """Prompt ids as vLLM gives them for a Qwen-VL chat body: per message a role id, a text's bytes as
    ids, each image as VISION_START, `image_tokens(bytes)` IMAGE_PADs, VISION_END. Two images of one size
    give the same ids, as with the real model."""
    ids = []
    for message in body.get("messages") or []:
        # An assistant turn opens as the generation prompt does (6), so a next call's prompt continues the last.
        ids.append({"system": 1, "user": 2, "assistant": 6, "tool": 4}.get(message.get("role"), 5))
        if message.get("role") == "assistant":
            ids += RESPONSE  # what this upstream answered it, as a template renders the turn again
            continue
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for part in parts:
            if part.get("type") == "image_url":
                raw = base64.b64decode(part["image_url"]["url"].partition(",")[2])
                ids += [VISION_START, *[IMAGE_PAD] * image_tokens(raw), VISION_END]
            elif part.get("type") == "text":
                ids += [10 + b for b in part["text"].encode()]
    return ids + [6]  # the generation prompt


class CapturingUpstream:
    """fake_vllm's app on a loopback port, recording every chat body; see the module docstring."""

    def __init__(self, image_tokens: Callable[[bytes], int] | None = None):
        self.bodies: list[dict] = []
        self.image_tokens = image_tokens
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._app = _fake_vllm().make_app()

    async def _serve(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self._app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = orjson.loads(body)
        self.bodies.append(request)
        if self.image_tokens is None:
            replay = iter([{"type": "http.request", "body": body, "more_body": False}])
            return await self._app(scope, lambda: _next(replay, receive), send)
        prompt = vision_prompt(request, self.image_tokens)
        answer = orjson.dumps({
            "id": "c", "object": "chat.completion", "created": 0, "model": "tiny", "prompt_token_ids": prompt,
            "choices": [{"index": 0, "finish_reason": "stop", "token_ids": RESPONSE,
                         "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}
                                                  for _ in RESPONSE]},
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(RESPONSE),
                      "total_tokens": len(prompt) + len(RESPONSE)}})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})

    def __enter__(self) -> "CapturingUpstream":
        self._server = uvicorn.Server(uvicorn.Config(self._serve, host=HOST, port=self.port, log_level="warning", interface="asgi3"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        while not self._server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)


async def _next(replay, receive):
    return next(replay, None) or await receive()
