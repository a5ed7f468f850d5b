"""The embedded default's main job until the full loop lands: serve, proxy, one call per dialect.

    python -m steps.demo [--out runs/demo]

Builds the tiny model (no download), starts the real vLLM on CPU and the recording proxy, sends one
streamed call in each dialect (Chat Completions, Responses, Messages) as a harness would, and prints
what the proxy recorded: token counts, weight version, and where the call records are.
"""

import argparse
import json
import secrets
import sys
import time
from pathlib import Path

import httpx

from steps.proxy.launch import serve_proxy
from steps.tiny_model import build_tiny_model
from steps.vllm_server import serve_vllm

TOOL = {"name": "shell", "description": "Run a shell command.",
        "schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
QUESTION = "List the files in the current folder."


def dialect_calls(rollout: dict) -> list[tuple[str, str, dict, dict]]:
    """(dialect, url, headers, body) of one streamed call per dialect, shaped as the harnesses send them."""
    openai = {"authorization": f"Bearer {rollout['api_key']}"}
    anthropic = {"x-api-key": rollout["api_key"], "anthropic-version": "2023-06-01"}
    fn = {"name": TOOL["name"], "description": TOOL["description"], "parameters": TOOL["schema"]}
    return [
        ("chat_completions", f"{rollout['openai_base_url']}/chat/completions", openai,
         {"model": "tiny", "stream": True, "max_tokens": 24, "messages": [{"role": "user", "content": QUESTION}],
          "tools": [{"type": "function", "function": fn}]}),
        ("responses", f"{rollout['openai_base_url']}/responses", openai,
         {"model": "tiny", "stream": True, "max_output_tokens": 24, "input": QUESTION, "tools": [{"type": "function", **fn}]}),
        ("messages", f"{rollout['anthropic_base_url']}/v1/messages", anthropic,
         {"model": "tiny", "stream": True, "max_tokens": 24, "messages": [{"role": "user", "content": QUESTION}],
          "tools": [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]}),
    ]


def step(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Runs the demo and prints one line per recorded call, then where everything is."""
    p = argparse.ArgumentParser(prog="python -m steps.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/demo"))
    args = p.parse_args(argv)
    out = args.out.resolve()
    step(f"building the tiny model in {out / 'model'}")
    model = build_tiny_model(out / "model")
    step("starting vLLM on CPU (about 30 s)")
    with serve_vllm(model, name="tiny", log_path=out / "vllm.log") as vllm:
        step(f"vLLM ready at {vllm.base_url}; starting the recording proxy")
        with serve_proxy(vllm.base_url, str(out / "calls"), secrets.token_urlsafe(24),
                         log_path=out / "proxy.log") as proxy:
            rollout = proxy.register(f"demo-{int(time.time())}")
            for dialect, url, headers, body in dialect_calls(rollout):
                step(f"streaming one {dialect} call through the proxy")
                with httpx.stream("POST", url, headers=headers, json=body, timeout=120) as resp:
                    events = sum(1 for line in resp.iter_lines() if line.startswith("data:"))
                    if resp.status_code != 200:
                        sys.exit(f"{dialect} call failed with HTTP {resp.status_code}")
                step(f"  {events} SSE events received")
            calls = proxy.calls(rollout["rollout_id"])
    for call in calls:
        print(json.dumps({key: call[key] for key in ("call_index", "dialect", "status", "weight_version", "finish_reason")}
                         | {"prompt_tokens": len(call["prompt_token_ids"]), "response_tokens": len(call["response_token_ids"]),
                            "logprobs": len(call["response_logprobs"])}))
    print(f"recorded {len(calls)} calls under {out / 'calls' / 'rollouts' / rollout['rollout_id']}")


if __name__ == "__main__":
    main()
