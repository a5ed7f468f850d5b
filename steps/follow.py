"""Following the update from the next iteration (on Argo with `max_staleness` >= 1): a serve that swaps in each
newer checkpoint the moment its update has published it, and a step that waits for one.

    OPENFORGE_ADMIN_KEY=... python -m steps.follow swap --run-url s3://openforge/runs/demo --served 1 --until 2 \
        --proxy-url http://127.0.0.1:8100 --model-dir /models
    python -m steps.follow wait --run-url s3://openforge/runs/demo --version 2

Checkpoint N (`steps.contracts.layout.checkpoint_url`) is what iteration N-1's update writes, served as version N. It
is complete once its `metrics.json` exists: the update writes that file last, locally by rename and in an
object store as the last upload (`steps.checkpoint.publish`), so neither command ever loads half a checkpoint.
If iteration N-1 is recorded Failed or Error (the manifest, `steps.manifest`), checkpoint N will never come:
`wait` exits 1 saying so, and `swap` stops following (the serve keeps serving what it has; the iteration's own
update then fails in its `wait` step, never training on an unknown base). `swap` is started by `steps.serve
--follow-run-url URL --follow-until N`, once the proxy answers; it fetches each checkpoint (without what only
training reads) into its own folder below `--model-dir` and swaps it in through the proxy's
`POST /weights/update`, which holds new calls, lets calls in flight finish, and stamps the rest with the new
version. A LoRA run's checkpoint is an adapter: only the adapter is fetched (vLLM serves the base it started on)
and the proxy loads it beside the base under the version's own name (docs/serving.md, "LoRA").
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from steps import manifest
from steps.checkpoint import TRAINING_ONLY, fetch
from steps.proxy.client import ProxyClient, ProxyClientError
from steps.contracts import layout

POLL_S = 10.0


class FollowError(RuntimeError):
    """A checkpoint that will never come, or one that could not be swapped in; one sentence."""


def checkpoint(run_url: str, version: int) -> str:
    """Checkpoint `version` (>= 1) of the run: what iteration `version` - 1's update writes."""
    return layout.checkpoint_url(run_url, version, base_model="")


def complete(run_url: str, version: int) -> bool:
    """Whether checkpoint `version` is whole: its `metrics.json`, written last, exists."""
    return manifest.read_metrics(checkpoint(run_url, version)) is not None


def never_coming(run_url: str, version: int) -> str | None:
    """Why checkpoint `version` will not be written (its iteration failed), or None while it may be."""
    writer = manifest.read_iterations(run_url).get(version - 1)
    if writer is not None and writer.status in ("Failed", "Error"):
        return (f"iteration {version - 1} ended {writer.status} ({writer.workflow}), so checkpoint {version} "
                f"will not be written; retry that iteration first")
    return None


def wait_for(run_url: str, version: int, poll_s: float = POLL_S, timeout_s: float | None = None) -> str:
    """Blocks until checkpoint `version` is complete; returns its URL. Raises FollowError when it never comes."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not complete(run_url, version):
        if problem := never_coming(run_url, version):
            raise FollowError(problem)
        if deadline is not None and time.monotonic() > deadline:
            raise FollowError(f"checkpoint {version} ({checkpoint(run_url, version)}) was not complete within "
                              f"{timeout_s:.0f} s, and the manifest does not say iteration {version - 1} ended: "
                              f"look at that iteration's Workflow, then retry it")
        time.sleep(poll_s)
    return checkpoint(run_url, version)


def newest(run_url: str, served: int, until: int) -> int | None:
    """The newest complete checkpoint after `served`, up to `until`; None when there is none yet.

    Checked from the newest down, so that a serve that started behind skips straight to the latest one."""
    return next((v for v in range(until, served, -1) if complete(run_url, v)), None)


def follow(run_url: str, served: int, until: int, proxy: ProxyClient, model_dir: Path, poll_s: float = POLL_S) -> int:
    """Swaps each newer complete checkpoint, up to `until`, into the serve behind `proxy`; returns the version
    served at the end. Stops early (said on stderr) when the next checkpoint will never come."""
    while served < until:
        version = newest(run_url, served, until)
        if version is None:
            if problem := never_coming(run_url, served + 1):
                print(f"follow: {problem}; still serving version {served}", file=sys.stderr, flush=True)
                return served
            time.sleep(poll_s)
            continue
        local = fetch(checkpoint(run_url, version), model_dir / f"version-{version}", skip=TRAINING_ONLY)
        try:
            proxy.update_weights(str(Path(local).resolve()), str(version))
        except ProxyClientError as exc:
            raise FollowError(f"the swap to checkpoint {version} failed: {exc}") from None
        print(f"follow: serving checkpoint {version}", file=sys.stderr, flush=True)
        served = version
    return served


def wait_ready(proxy: ProxyClient, timeout_s: float = 3600.0) -> None:
    """Blocks until the proxy answers /health (the follower starts beside the serve it follows)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            proxy.health()
            return
        except ProxyClientError:
            if time.monotonic() > deadline:
                raise FollowError(f"the proxy did not answer /health within {timeout_s:.0f} s") from None
            time.sleep(1)


def start_follower(run_url: str, served: int, until: int, proxy_url: str, model_dir: Path) -> subprocess.Popen:
    """`swap` as a child of the serve step (which stops it on the way out), in its environment (the admin key)."""
    return subprocess.Popen([sys.executable, "-m", "steps.follow", "swap", "--run-url", run_url, "--served",
                             str(served), "--until", str(until), "--proxy-url", proxy_url, "--model-dir", str(model_dir)],
                            stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    """`swap`: follow the update from a running serve; `wait`: block until a checkpoint is complete. Exit code 1
    when the checkpoint will never come or the swap failed."""
    p = argparse.ArgumentParser(prog="python -m steps.follow", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    swap = commands.add_parser("swap", help="swap each newer checkpoint into a running serve")
    swap.add_argument("--served", type=int, required=True, help="the version the serve started with")
    swap.add_argument("--until", type=int, required=True, help="the last version to swap in")
    swap.add_argument("--proxy-url", required=True)
    swap.add_argument("--model-dir", type=Path, required=True, help="a local folder for the fetched checkpoints")
    wait = commands.add_parser("wait", help="block until a checkpoint is complete")
    wait.add_argument("--version", type=int, required=True, help="the checkpoint's number (>= 1)")
    wait.add_argument("--timeout-s", type=float, default=None,
                      help="give up after this many seconds (the Workflow passes update_timeout_s); none: no limit")
    for sub in (swap, wait):
        sub.add_argument("--run-url", required=True)
        sub.add_argument("--poll-s", type=float, default=POLL_S)
    args = p.parse_args(argv)
    try:
        if args.command == "wait":
            print(wait_for(args.run_url, args.version, args.poll_s, args.timeout_s))
            return 0
        proxy = ProxyClient(args.proxy_url, os.environ.get("OPENFORGE_ADMIN_KEY", ""))
        wait_ready(proxy)
        follow(args.run_url, args.served, args.until, proxy, args.model_dir, args.poll_s)
    except (FollowError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
