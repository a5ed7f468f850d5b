"""A stand-in for one vLLM server's weight and health routes, for the replica tests that need a failure on cue.

Why a double: the failures these tests need (a reload that succeeds and then a cache reset that fails, a
`/health` that answers slowly three times, a server that dies between two stages of a swap) cannot be
caused on cue in a real vLLM on CPU, and each real one costs minutes to start. This one speaks real HTTP/1.1
on a loopback port, so the proxy's own client (`steps.proxy.upstream.Upstream`) talks to it exactly as to
vLLM: `/health`, `POST /collective_rpc` (reload_weights), `/reset_prefix_cache`, `/reset_encoder_cache`,
`/update_weight_version`, `/weight_info`, `/v1/models`, a LoRA run's `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter`, and a non-streaming `/v1/chat/completions` whose answer names the weights the server
holds ("weights 1"; a call naming a loaded adapter as its model: that adapter's path; an unknown model: vLLM's 404)
with token ids and logprobs in vLLM's shape. Every answer closes its
connection, so a stopped server refuses the next request, as a killed vLLM does.

    fake = FakeVllm(); await fake.start()      # fake.url
    fake.fail_at = "reset_prefix_cache"        # that route answers 500 (after a reload_weights that loaded)
    fake.health_delay_s = 0.5                  # /health answers after this long
    await fake.stop()                          # nothing listens any more
"""

import asyncio
import json
import time

from steps.net import free_port

STAGE_PATHS = {"/collective_rpc": "reload_weights", "/reset_prefix_cache": "reset_prefix_cache",
               "/reset_encoder_cache": "reset_encoder_cache", "/update_weight_version": "update_weight_version",
               "/v1/load_lora_adapter": "load_lora_adapter", "/v1/unload_lora_adapter": "unload_lora_adapter"}


class FakeVllm:
    """One fake vLLM server (see the module docstring); `weights` is the checkpoint it holds, `seen` its routes."""

    def __init__(self, weights: str = "0"):
        self.weights, self.version = weights, weights
        self.fail_at: str | None = None  # a stage that answers 500 ("reload_weights" fails before loading)
        self.stage_delay_s: dict[str, float] = {}
        self.health_delay_s = 0.0
        self.call_delay_s = 0.0  # a chat completion answers after this long (a hung engine: longer than the timeout)
        self.on_stage = None  # called with each stage's name once it is done (a test's cue)
        self.seen: list[str] = []
        self.adapters: dict[str, str] = {}  # the LoRA adapters loaded: name -> path
        self.called_at: list[float] = []  # when each chat completion arrived (time.monotonic)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listens on its port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        """Stops listening: every later request is refused."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            length = next((int(line.split(":", 1)[1]) for line in head[1:]
                           if line.lower().startswith("content-length:")), 0)
            body = json.loads(await reader.readexactly(length)) if length else {}
            status, answer = await self._answer(method, path, body)
            data = json.dumps(answer).encode()
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
                         "connection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # the client went, or stop()
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        self.seen.append(path)
        if path == "/health":
            await asyncio.sleep(self.health_delay_s)
            return 200, {}
        if path == "/weight_info":
            return 200, {"weight_version": self.version}
        if path == "/v1/models":
            return 200, {"data": [{"id": "tiny"}]}
        if path == "/v1/chat/completions":
            self.called_at.append(time.monotonic())
            await asyncio.sleep(self.call_delay_s)
            model = body.get("model", "tiny")
            if model != "tiny" and model not in self.adapters:
                return 404, {"message": f"The model `{model}` does not exist."}
            weights = self.adapters.get(model, self.weights)
            return 200, {"id": "c", "object": "chat.completion", "model": "tiny", "prompt_token_ids": [1, 2],
                         "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [3],
                                      "message": {"role": "assistant", "content": f"weights {weights}"},
                                      "logprobs": {"content": [{"token": "w", "logprob": -0.5, "bytes": [119],
                                                                "top_logprobs": []}]}}],
                         "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
        stage = STAGE_PATHS.get(path)
        if stage is None:
            return 404, {"message": f"no route {path}"}
        await asyncio.sleep(self.stage_delay_s.get(stage, 0.0))
        if self.fail_at == stage:
            return 500, {"message": f"{stage} failed"}
        if stage == "reload_weights":
            self.weights = body["kwargs"]["weights_path"]
        elif stage == "update_weight_version":
            self.version = body["new_version"]
        elif stage == "load_lora_adapter":
            self.adapters[body["lora_name"]] = body["lora_path"]
        elif stage == "unload_lora_adapter":
            self.adapters.pop(body["lora_name"], None)
        if self.on_stage is not None:
            self.on_stage(stage)
        return 200, {}
