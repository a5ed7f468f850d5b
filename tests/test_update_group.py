"""The update's process group on CPU (`steps.update.cpu._process_group`): one process alone keeps its store in memory
and binds no port, since a port picked free and bound later can be taken in between by any connection on the machine
(an overlapped update once failed with EADDRINUSE beside its rollouts); ranks a launcher started meet at the
launcher's MASTER_PORT. Each case runs in its own Python (a process has one default group)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workflows.local import LAUNCHER_ENV

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import json, os, socket
import torch
from steps.update.cpu import _process_group
_process_group()
port = int(os.environ["MASTER_PORT"])
listening = socket.socket()
try:
    listening.bind(("127.0.0.1", port))
    bound_by_group = False
except OSError:
    bound_by_group = True
print(json.dumps({"bound_by_group": bound_by_group, "world_size": torch.distributed.get_world_size()}))
"""


def probe(env: dict) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_process_alone_binds_no_port_and_a_launchers_port_is_used() -> None:
    alone = probe({})
    assert alone == {"bound_by_group": False, "world_size": 1}
    with socket.socket() as sock:  # the control: a group given its port by a launcher listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launched = probe({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert launched == {"bound_by_group": True, "world_size": 1}
