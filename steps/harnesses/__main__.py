"""Install the pinned harness CLIs from npm.

    python -m steps.harnesses install --all
    python -m steps.harnesses install codex claude-code
    OPENFORGE_CACHE=/cache python -m steps.harnesses install openclaw

Each goes to `${OPENFORGE_CACHE:-~/.cache/openforge}/harnesses/<name>-<version>`, next to the pinned
Node.js they all run on (`node-<version>`, installed first); one already there is left alone. Prints
one line per install: version, time taken, size on disk, executable. Exits 1 if any install failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from steps.harnesses import GUI_HARNESSES, HARNESSES, InstallError, default_prefix
from steps.harnesses.base import NODE_PACKAGE, NODE_VERSION, dir_size, install_node, installed_version, node_bin_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read `install [NAME ...|--all]`."""
    parser = argparse.ArgumentParser(prog="python -m steps.harnesses", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="install pinned harness CLIs")
    install.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join([*HARNESSES, *GUI_HARNESSES])}")
    install.add_argument("--all", action="store_true", help="install every harness")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in HARNESSES and name not in GUI_HARNESSES]
    if unknown:
        parser.error(f"unknown harness {unknown[0]!r}; choose from {', '.join([*HARNESSES, *GUI_HARNESSES])}")
    if not args.names and not args.all:
        parser.error("name at least one harness, or pass --all")
    return args


def install_one(name: str, version: str, package: str, prefix: Path, install: Callable[[], Path]) -> bool:
    """Run one install and print its line: version, whether it was already there, size, executable."""
    # A PyPI harness (its own virtualenv) has no npm manifest: its site-packages says what is installed.
    dist_info = f"lib/python3*/site-packages/{package.replace('-', '_')}-{version}.dist-info"
    already = installed_version(prefix, package) == version or any(prefix.glob(dist_info))
    started = time.monotonic()
    try:
        exe = install()
    except InstallError as error:
        print(f"{name} {version}: FAILED: {error}", flush=True)
        return False
    how = "already installed" if already else f"installed in {time.monotonic() - started:.0f} s"
    print(f"{name} {version}: {how}, {dir_size(prefix) / 2**20:.0f} MB, {exe}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    """Install Node, then each requested harness; exit 1 if any failed, after trying them all."""
    args = parse_args(argv)
    node_prefix = node_bin_dir().parents[2]
    if not install_one("node", NODE_VERSION, NODE_PACKAGE, node_prefix, lambda: install_node() / "node"):
        return 1
    failed = 0
    for name in list(HARNESSES) + list(GUI_HARNESSES) if args.all else args.names:
        harness = HARNESSES.get(name) or GUI_HARNESSES[name]
        if harness.NPM_PACKAGE is None and not hasattr(harness, "PIP_PACKAGE"):
            print(f"{name}: built in, nothing to install", flush=True)
            continue
        prefix = default_prefix(name, harness.VERSION)
        failed += not install_one(name, harness.VERSION, harness.NPM_PACKAGE or harness.PIP_PACKAGE, prefix,
                                  partial(harness.install, prefix))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
