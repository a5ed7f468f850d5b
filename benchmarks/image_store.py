"""What storing images once is worth: the store's bytes per call with and without image deduplication.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/image_store.py [--steps 20] [--keep 3] [--unchanged-every 4]

Runs two 20-step browser-like rollouts (1280x720 PNG screenshots drawn with PIL, ~100 KB, a new page every step but
every `--unchanged-every`-th, when the page did not change) through the real proxy (`python -m steps.proxy`)
into a real local store, its upstream `tests/screenshots.py`'s (vLLM's answer shape with Qwen-VL's image tokens;
no model is the point):

- `browser-use`: the harness rewrites its history into one user message every call and sends only the
  current screenshot (`[system, user[text, image_url]]`);
- `computer-use`: the Anthropic computer-use loop's shape, appending a tool call and a tool result holding
  the screenshot each step and keeping the last `--keep` screenshots in the history (older ones leave it),
  sent as Chat Completions `tool` messages with image parts.

"With" is what the store holds: the rollout's records as written plus every image file it names. "Without"
is what the same records would hold with every image's bytes left in the stored request, sharing what each
request has in common with the one before exactly as the store does (`steps.proxy.store.share_request`),
computed from the same stored records. Prints a markdown table to stdout.
"""

import argparse
import base64
import sys
import tempfile
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from proxy_process import start_proxy, stop_proxy  # noqa: E402
from screenshots import CapturingUpstream, data_url, screenshot  # noqa: E402
from steps.proxy.protocol import one_line  # noqa: E402
from steps.proxy.store import share_request  # noqa: E402

ADMIN_KEY = "bench-admin-key"
IMAGE_TOKENS = 1196  # smart_resize(720, 1280, 28, 56 * 56, 28 * 28 * 1280) = 728x1288: 52 x 92 patches / 4
SYSTEM = "You are a browser agent. Answer with one action as JSON. " * 60  # browser-use's prompt is ~3 KB


def page(seed: int) -> bytes:
    """A 1280x720 PNG with a page's worth of text (tests/screenshots.py's boxes plus 40 lines of words), ~100 KB
    like a real page's screenshot."""
    import io
    import random

    from PIL import Image, ImageDraw

    rng, image = random.Random(seed), Image.open(io.BytesIO(screenshot(seed)))
    draw = ImageDraw.Draw(image)
    for line in range(40):
        words = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 9)))
                         for _ in range(18))
        draw.text((20, 70 + line * 16), words, fill=(rng.randrange(90), rng.randrange(90), rng.randrange(90)))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def pages(steps: int, unchanged_every: int) -> list[bytes]:
    """One screenshot per step: a new page, or the last one again every `unchanged_every`-th step."""
    shots, seed = [], 0
    for step in range(steps):
        if not (unchanged_every and step and step % unchanged_every == 0):
            seed += 1
        shots.append(page(seed))
    return shots


def browser_use(shots: list[bytes], step: int, keep: int) -> dict:
    """browser-use's call at `step`: its history rewritten into the one user message, the current screenshot."""
    history = "".join(f"<step {n}>clicked element {n}; the page changed</step>\n" for n in range(step))
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": [
        {"type": "text", "text": f"<agent_history>{history}</agent_history><browser_state>url, tabs, elements</browser_state>"},
        {"type": "image_url", "image_url": {"url": data_url(shots[step])}}]}], "model": "tiny", "max_tokens": 8}


def computer_use(shots: list[bytes], step: int, keep: int) -> dict:
    """The computer-use loop's call at `step`: every step's tool call and result, screenshots in the last `keep`."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Book the cheapest flight."}]
    for n in range(step + 1):
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{n}", "type": "function",
                         "function": {"name": "computer", "arguments": '{"action": "screenshot"}'}}]})
        content = [{"type": "text", "text": f"screenshot {n}"}]
        if n > step - keep:
            content.append({"type": "image_url", "image_url": {"url": data_url(shots[n])}})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": content})
    return {"messages": messages, "model": "tiny", "max_tokens": 8}


def run(shape, shots: list[bytes], keep: int, proxy, store: Path, rollout_id: str) -> dict:
    """One rollout of `shape` through the proxy; the store's bytes with images stored once and inline."""
    rollout = proxy.register(rollout_id)
    sent = []
    for step in range(len(shots)):
        body = orjson.dumps(shape(shots, step, keep))
        sent.append(one_line(body))
        answer = httpx.post(f"{rollout['openai_base_url']}/chat/completions", content=body, timeout=120,
                            headers={"authorization": f"Bearer {rollout['api_key']}", "content-type": "application/json"})
        answer.raise_for_status()
    lines = (store / "rollouts" / rollout_id / "calls.jsonl").read_bytes().splitlines(keepends=True)
    names = {ref["sha256"] for line in lines for ref in orjson.loads(line)["images"]}
    images = sum((store / "images" / name).stat().st_size for name in names)
    inline, base = 0, None
    for line, request in zip(lines, sent):  # the same records, each request kept as sent
        record = orjson.loads(line)
        between, record["request_shared"], base = share_request(base, request, record["call_index"])
        record["request"] = between if record["request_shared"] else orjson.Fragment(request)
        inline += len(orjson.dumps(record)) + 1
    return {"calls": len(lines), "records": sum(map(len, lines)), "images": images, "image_files": len(names),
            "with": sum(map(len, lines)) + images, "without": inline,
            "screenshot": sum(len(base64.b64encode(s)) for s in shots) // len(shots)}


def main() -> None:
    """Runs both shapes, prints the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--keep", type=int, default=3, help="screenshots the computer-use history keeps")
    p.add_argument("--unchanged-every", type=int, default=4, help="every Nth step the page did not change (0: never)")
    args = p.parse_args()
    shots = pages(args.steps, args.unchanged_every)
    # Prompt ids as vLLM gives them on Qwen2.5-VL: text, and 1196 image tokens per 1280x720 screenshot (its
    # default pixel cap), so records hold what a real run's do.
    with tempfile.TemporaryDirectory() as tmp, CapturingUpstream(image_tokens=lambda png: IMAGE_TOKENS) as upstream:
        store = Path(tmp) / "calls"
        proxy = start_proxy(upstream.url, str(store), ADMIN_KEY, log_path=Path(tmp) / "proxy.log")
        try:
            rows = {name: run(shape, shots, args.keep, proxy, store, f"r{n}") for n, (name, shape) in enumerate(
                (("browser-use", browser_use), (f"computer-use (last {args.keep})", computer_use)))}
        finally:
            stop_proxy(proxy)
    print(f"{args.steps} steps, 1280x720 PNG screenshots of ~{rows['browser-use']['screenshot'] // 1024} KB (base64), "
          f"an unchanged page every {args.unchanged_every}th step\n")
    print("| rollout shape | calls | images stored | without dedup: bytes/call | with dedup: bytes/call "
          "(records + images) | saved |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        n = row["calls"]
        print(f"| {name} | {n} | {row['image_files']} | {row['without'] // n:,} | {row['with'] // n:,} "
              f"({row['records'] // n:,} + {row['images'] // n:,}) | {row['without'] / row['with']:.1f}x |")


if __name__ == "__main__":
    main()
