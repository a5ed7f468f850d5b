"""Capture the first agent request each real harness sends, as fixtures for the proxy's tests.

    python tests/capture_requests.py codex claude-code      # or: --all
    # writes tests/data/harness_requests/<name>.json: {"path", "headers", "body"}

Each harness is pointed at a small HTTP server on 127.0.0.1 that records every request and answers
model calls with a 500, so nothing is generated and nothing leaves the machine. The saved request is
the first one offering tools (the agent's first turn; side requests such as title generation come
without tools); the harness is stopped once it is captured. Credential headers are left out. Rerun
this after bumping a harness's pinned version.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from steps.harnesses import HARNESSES, Endpoint, default_prefix  # noqa: E402

OUT_DIR = Path(__file__).parent / "data" / "harness_requests"
INSTRUCTION = "Write the word hello into a file named answer.txt in the current directory."
SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization"}
# Fixed paths, so the fixtures do not change with every capture.
SCRATCH = Path("/tmp/openforge-capture")


class Recorder(BaseHTTPRequestHandler):
    """Records each request on the server; lists one model for GETs, fails every POST."""

    def _record(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"undecoded": raw[:200].decode("latin-1")}
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() not in SECRET_HEADERS}
        self.server.requests.append({"method": self.command, "path": self.path,
                                     "headers": headers, "body": body})

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._record()
        self._reply(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        # A server error in both OpenAI's and Anthropic's error shapes; nothing is generated.
        self._reply(500, {"type": "error", "error": {"type": "api_error", "message": "capture only"}})

    def log_message(self, *args: object) -> None:
        """Quiet: the harness's own output is what matters."""


def first_agent_request(requests: list[dict]) -> dict | None:
    """The first POST whose body offers tools."""
    for request in list(requests):
        body = request["body"]
        if request["method"] == "POST" and isinstance(body, dict) and body.get("tools"):
            return request
    return None


def capture(name: str, timeout: float = 120.0) -> dict | None:
    """Run one harness against a recording server until its first agent request arrives."""
    harness = HARNESSES[name]
    exe = harness.install(default_prefix(name, harness.VERSION))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = f"http://127.0.0.1:{server.server_port}/rollouts/capture"
    endpoint = Endpoint(f"{root}/v1", root, "capture-key", "tiny")
    shutil.rmtree(SCRATCH, ignore_errors=True)
    home, workdir = SCRATCH / "home", SCRATCH / "work"
    workdir.mkdir(parents=True)
    env = harness.prepare(home, workdir, endpoint)
    process = subprocess.Popen(harness.command(INSTRUCTION, workdir, exe), env=env, cwd=workdir,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while first_agent_request(server.requests) is None and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    if process.poll() is None:
        process.kill()
    process.wait()
    server.shutdown()
    for request in server.requests:
        print(f"  {request['method']} {request['path']}", file=sys.stderr)
    return first_agent_request(server.requests)


def main() -> int:
    """Capture the named harnesses (or all) and write their fixtures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(HARNESSES)}")
    parser.add_argument("--all", action="store_true", help="capture every harness")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in HARNESSES]
    if unknown or not (args.names or args.all):
        parser.error(f"name harnesses among {', '.join(HARNESSES)}, or pass --all")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in list(HARNESSES) if args.all else args.names:
        request = capture(name)
        if request is None:
            print(f"{name}: no agent request captured", flush=True)
            failed += 1
            continue
        fixture = {"path": request["path"], "headers": request["headers"], "body": request["body"]}
        out = OUT_DIR / f"{name}.json"
        out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {request['path']}, {out.stat().st_size // 1024} KB -> {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
