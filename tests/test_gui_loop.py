"""The whole loop on the embedded default with a GUI agent: browser-use on a built-in GUI task, served and trained
as the tiny vision model, for 2 iterations (configs/gui.yaml).

Real parts throughout: vLLM on CPU with the vision model, the recording proxy, browser-use 0.13 driving Chromium
in the rollout sandbox beside the task's app, the verifier, the trajectories step, the veRL update with the
screenshots, the weight swap (encoder cache reset included) and iteration 1 served by the new weights. The
random model cannot do the task (every reward is 0), so a small entropy bonus makes every update train, as in
tests/test_local_run.py. One rollout per iteration: each of browser-use's calls is a prompt of ~9,000 tokens, and the
update's cost on CPU grows with them (minutes per update).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from steps.proxy.images import REFERENCE_PREFIX
from steps.contracts.table_files import read_table
from steps.contracts import layout
from steps.update.shards import read_weights

REPO = Path(__file__).resolve().parents[1]
# timeout: the run's own, two iterations of a vision model's update on CPU (minutes each on two busy cores)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.harness, pytest.mark.timeout(1200),
              pytest.mark.skipif(not (REPO / ".venv-train" / "bin" / "python").exists() and
                                 not os.environ.get("OPENFORGE_TRAIN_PYTHON"),
                                 reason="veRL's environment (.venv-train) is not set up: run `make train-setup`")]


def test_two_iterations_of_a_gui_agent_train_on_its_screenshots_and_serve_the_new_weights(tmp_path, tiny_vision_model):
    from steps.harnesses import GUI_HARNESSES, default_prefix

    harness = GUI_HARNESSES["browser-use"]
    harness.install(default_prefix("browser-use", harness.VERSION))
    update_config = tmp_path / "update.yaml"
    defaults = (REPO / "configs" / "update.yaml").read_text()
    assert "\nentropy_coeff: 0.0\n" in defaults
    update_config.write_text(defaults.replace("\nentropy_coeff: 0.0\n", "\nentropy_coeff: 0.001\n"))
    store = tmp_path / "runs"
    settings = [f"store={store}", "run=gui", f"model={tiny_vision_model}", "dataset=steps/tasks/gui/gui-signup-form",
                "tasks_per_iteration=1", "samples_per_task=1", "max_tokens_cap=48", f"update_config={update_config}"]
    done = subprocess.run([sys.executable, "workflows/submit.py", "--config", "configs/gui.yaml", *settings],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = store / "gui"
    records = [json.loads((run / "manifest" / f"iteration-{i}.json").read_text()) for i in (0, 1)]
    assert [r["status"] for r in records] == ["Succeeded", "Succeeded"]

    # Every call carried its screenshot: stored once by its bytes, named in the record, not inline in the request.
    images = Path(layout.images_url(str(run)))
    stored = {path.name for path in images.iterdir()}
    for iteration, record in enumerate(records):
        assert record["metrics"]["tokens_trained"] > 0, record["metrics"]
        partition = layout.run_partition_url(str(run), "gui", iteration)
        calls = read_table(partition, "calls").to_pylist()
        samples = read_table(partition, "samples").to_pylist()
        assert calls and all(len(call["images"]) == 1 for call in calls if call["status"] == "ok")
        assert samples and all(sample["images"] and set(sample["images"]) <= stored for sample in samples)
        assert {call["weight_version"] for call in calls} == {str(iteration)}  # iteration 1: the new weights
    log = next((run / "calls" / "rollouts").glob("*/calls.jsonl")).read_text()
    assert REFERENCE_PREFIX in log and "data:image/png;base64," not in log

    # The update trained the vision model (its tower too) and wrote a checkpoint vLLM could reload whole.
    checkpoint = run / "checkpoints" / "iteration-1"
    for name in ("preprocessor_config.json", "chat_template.jinja", "tokenizer.json", "config.json"):
        assert (checkpoint / name).read_bytes() == (tiny_vision_model / name).read_bytes(), name
    before, after = load_file(tiny_vision_model / "model.safetensors"), read_weights(checkpoint)
    # The builder saves the tower as `visual.*`, transformers 5 (the update) as `model.visual.*`: vLLM reads both.
    after = {name.removeprefix("model.") if "visual" in name else name: value for name, value in after.items()}
    tower = [name for name in before if name.startswith("visual.")]
    assert tower and set(tower) <= set(after) and any(not before[name].equal(after[name]) for name in tower)
