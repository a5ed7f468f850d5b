"""Every harness may act anywhere inside its sandbox: nothing of its own fences it into the working folder.

    pytest -m harness tests/test_harness_permissions.py

Each case is a whole rollout (`steps.rollout.run_rollout`): the real harness CLI in a real local sandbox, through
the real recording proxy, the model being `tests/scripted_model.py`, on the task `tests/data/outside-workdir`
(workspace /app). The script has the harness's shell tool write a file in /etc and read it back, then (where the
harness has file tools) its own write tool write another file in /etc and its read tool read that one back. The
task's verifier, which grades both /etc files (`[verifier] graded_paths`), says they hold what was written, and the
tool results the model got back show the read-backs. The control is opencode with its `external_directory`
permission left at its default ("ask", which `opencode run` rejects headless): the same script is refused there.
Nothing here touches the host's /etc: the files land in the sandbox's own upper layer.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from steps.analytics.dialects import READERS
from steps.harnesses import HARNESSES, opencode
from steps.rollout import RolloutSpec, run_rollout
from test_harnesses import installed_exe

ADMIN_KEY = "test-admin-key"
TASK = Path(__file__).parent / "data" / "outside-workdir"
SHELL_MARK, TOOL_MARK = "openforge-shell-ok", "openforge-tool-ok"
SHELL_FILE, TOOL_FILE = "/etc/openforge-check", "/etc/openforge-tool-check"
# The shell command names its paths as arguments too: opencode checks a command's path arguments, not only where
# it runs.
SHELL_COMMAND = f"echo {SHELL_MARK} > {SHELL_FILE} && cat {SHELL_FILE} && ls /"
# Each harness's own file tools, by name and path argument (tests/data/harness_requests); Codex 0.171 offers none
# to a model it does not know (`apply_patch` only for known model names), and `direct` has its shell alone.
FILE_TOOLS = {
    "claude-code": ("Write", "Read", "file_path"),
    "openclaw": ("write", "read", "path"),
    "qwen-code": ("write_file", "read_file", "file_path"),
    "opencode": ("write", "read", "filePath"),
}
CASES = [pytest.param(name, marks=() if name == "direct" else pytest.mark.harness) for name in HARNESSES]


def script(name: str) -> list:
    """Shell write and read-back outside the workspace, then the file tools' write and read-back there."""
    if name not in FILE_TOOLS:
        return [SHELL_COMMAND]
    write, read, path = FILE_TOOLS[name]
    return [SHELL_COMMAND,
            {"tool": write, "arguments": {path: TOOL_FILE, "content": f"{TOOL_MARK}\n"}},
            {"tool": read, "arguments": {path: TOOL_FILE}}]


def run_outside(name: str, scripted, proxy, tmp_path: Path):
    """One rollout of the script on the task: its result, the tool results the harness sent back last, the end of
    its log, and all of that for an assertion's message."""
    installed_exe(name)  # skips when the harness is not installed
    scripted.set_commands(script(name))
    rollout_id = f"outside-{name}-{uuid.uuid4().hex[:6]}"
    spec = RolloutSpec(task=TASK, harness=name, proxy_url=proxy.url, rollout_id=rollout_id, out=tmp_path / "rollout",
                       admin_key=ADMIN_KEY)
    result = run_rollout(spec)
    calls = sorted(proxy.calls(result.rollout_id), key=lambda call: call["call_index"])
    results = READERS[HARNESSES[name].DIALECT].tool_results(calls[-1]["request"]) if calls else []
    log = Path(result.paths.get("harness_log", "/dev/null")).read_text(errors="replace")[-3000:]
    return result, [item.text for item in results], log, f"{result}\ntool results: {results}\nharness log:\n{log}"


@pytest.mark.parametrize("name", CASES)
def test_a_harness_writes_and_reads_outside_its_working_folder(name, scripted, scripted_proxy, tmp_path):
    result, outputs, _, context = run_outside(name, scripted, scripted_proxy, tmp_path)
    file_tool = name in FILE_TOOLS
    assert result.status == "ok" and result.rewards == {"reward": 1.0, "file_tool": float(file_tool)}, context
    assert len(outputs) == len(script(name)), context
    assert SHELL_MARK in outputs[0] and "proc" in outputs[0], context  # written, read back, and / listed
    if file_tool:
        assert TOOL_MARK in outputs[2], context  # the read tool read back what the write tool wrote


def test_control_opencode_with_external_directory_at_its_default_is_refused(scripted, scripted_proxy, tmp_path,
                                                                             monkeypatch):
    """opencode without `permission.external_directory`: the shell command is rejected, nothing is written, and the
    session ends there, as in the report that found it."""
    def fenced(endpoint):
        config = configured(endpoint)
        del config["permission"]["external_directory"]
        return config

    configured = opencode.config
    monkeypatch.setattr(opencode, "config", fenced)
    result, outputs, log, context = run_outside("opencode", scripted, scripted_proxy, tmp_path)
    assert result.status == "ok" and result.rewards == {"reward": 0.0, "file_tool": 0.0}, context
    assert "permission requested: external_directory (/etc/*); auto-rejecting" in log, context
    assert "The user rejected permission" in log and outputs == [], context  # the model never saw a result
