"""A recorded evaluation for the SFT tests: two built-in tasks evaluated through `submit.py eval --upstream` in
front of the scripted model (tests/scripted_model.py), which replays hello-file's oracle (reward 1) and a wrong
script for count-errors (reward 0), so a reward filter has something to keep and something to leave out.

The recording is the real path a stronger model's is: the proxy records every call of the `direct` harness into
the eval run's store (`<store>/<run>/calls`), the rollouts are graded by the tasks' verifiers. It takes ~10 s.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from scripted_model import ScriptedModel

REPO = Path(__file__).resolve().parents[1]
BUILTIN = REPO / "steps" / "tasks" / "builtin"
PASSED, FAILED = "hello-file", "count-errors"


def serving_python() -> str:
    """The serving environment's Python: the one running the tests, or the train env's named one."""
    return os.environ.get("OPENFORGE_SERVE_PYTHON") or sys.executable


def record_eval(root: Path, run: str = "recorded", k: int = 2) -> Path:
    """Records `k` tries of each of two tasks into `root/runs/<run>`; returns the run's folder."""
    tasks, oracle = root / "tasks", root / "oracle"
    for name in (PASSED, FAILED):
        shutil.copytree(BUILTIN / name, tasks / name)
        shutil.copytree(BUILTIN / name, oracle / name)
    # the scripted model plays each task's solution: count-errors' is made wrong, so its tries score 0
    (oracle / FAILED / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'a wrong guess' > /tmp/guess\n")
    env = {key: value for key, value in os.environ.items() if key != "ARGO_SERVER"}
    env["PYTHONPATH"] = str(REPO)
    with ScriptedModel(model="remote", oracle=oracle) as double:
        done = subprocess.run([serving_python(), "workflows/submit.py", "eval", "--harness", "direct", "--dataset",
                               str(tasks), "--k", str(k), "--upstream", double.url, "--upstream-model", "remote",
                               "max_tokens_cap=4096", f"store={root / 'runs'}", f"run={run}", "parallel_rollouts=2"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "runs" / run
