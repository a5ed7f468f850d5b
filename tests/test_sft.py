"""SFT samples from a real recording: an evaluation through `submit.py eval --upstream` in front of the scripted
model (tests/sft_recording.py: hello-file passes, count-errors fails), its calls recorded by the proxy into the
eval run's store, read back by `steps.sft.samples` for the tiny model as the student.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q -n 0 tests/test_sft.py
"""

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from sft_recording import FAILED, PASSED, record_eval
from steps.contracts import layout
from steps.sft import samples as sft
from steps.trajectories.collect import fetch_calls_store, load_results
from steps.update.samples import read_samples
from test_workflows import fake_argo, s3_store  # noqa: F401 - the fake Argo Server and the S3 store, as fixtures

CLUSTER = Path(__file__).resolve().parents[1] / "configs" / "cluster-example.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.PydanticDeprecatedSince20")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The eval run's folder: 2 tries of each task, every call recorded."""
    return record_eval(tmp_path_factory.mktemp("sft-recording"))


def spans(row, tokenizer) -> list[tuple[int, str]]:
    """A sample's response as (mask, text) runs."""
    ids, mask = row.response_token_ids, row.response_mask
    return [(value, tokenizer.decode([ids[i] for i in group]))
            for value, group in ((v, list(g)) for v, g in itertools.groupby(range(len(ids)), key=lambda i: mask[i]))]


def test_a_stronger_models_recording_is_rendered_for_the_student_with_only_the_assistants_turns_trained(
        recorded: Path, tiny_model: Path) -> None:
    """The scripted recorder's ids are not the tiny model's (an upstream's tokenizer is unknown), so each call is
    rendered with the student's chat template and tools; the calls of a rollout merge into one sample; the
    trained tokens are exactly the assistant's two answers (the oracle's tool call, then "done"), each through
    its end-of-turn token, and nothing of the system, user or tool turns."""
    rows, report = sft.build(str(recorded), str(tiny_model), min_reward=1.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert report.mode == sft.RENDERED and "upstream" in report.why and report.left_out == []
    assert len(rows) == 2 and {row.task for row in rows} == {PASSED}
    for row in rows:
        runs = spans(row, tokenizer)
        trained = [text for value, text in runs if value == 1]
        assert trained[0].startswith('<tool_call>\n{"name": "shell"') and "echo hello > /app/answer.txt" in trained[0]
        assert trained[0].endswith("</tool_call><|im_end|>") and trained[1] == "done<|im_end|>" and len(trained) == 2
        assert not any("<|im_start|>" in text for text in trained)  # no turn of another role is trained
        # the control: the untrained part holds the instruction and the tool's answer, and decodes with the
        # trained part to the whole conversation as the student's template writes it
        prompt = tokenizer.decode(row.prompt_token_ids)
        assert "Create the file `/app/answer.txt`" in prompt and prompt.endswith("<|im_start|>assistant\n")
        assert "<tool_response>" in "".join(text for value, text in runs if value == 0)
        assert row.num_calls == 2 and row.response_logprobs is None
    assert report.trained_tokens == sum(sum(row.response_mask) for row in rows)


def test_the_reward_filter_keeps_only_rollouts_at_or_above_min_reward(recorded: Path, tiny_model: Path) -> None:
    """min_reward 1.0 keeps the passing task's 2 tries of 4; the control, min_reward 0.0, keeps all 4 (so it is
    the filter that left count-errors out, not the recording)."""
    rows, report = sft.build(str(recorded), str(tiny_model), min_reward=1.0)
    assert (report.rollouts, report.kept_rollouts) == (4, 2)
    assert {(row.task, row.reward) for row in rows} == {(PASSED, 1.0)}
    everything, control = sft.build(str(recorded), str(tiny_model), min_reward=0.0)
    assert (control.rollouts, control.kept_rollouts) == (4, 4)
    assert {(row.task, row.reward) for row in everything} == {(PASSED, 1.0), (FAILED, 0.0)}


def test_the_recorded_ids_are_reused_when_the_recorder_has_the_students_tokenizer(
        recorded: Path, tiny_model: Path, tmp_path: Path) -> None:
    """`same_tokenizer` compares the tokenizer files (a copy: same; another chat template: not; an upstream:
    unknown); in the exact mode a rollout's samples are its recorded prompt and sampled ids, unchanged, the
    sampled ones alone trained (the scripted model's prompt is the JSON of the request, which a later call does
    not continue: one sample per call, docs/trajectories.md)."""
    copy, other = tmp_path / "copy", tmp_path / "other"
    shutil.copytree(tiny_model, copy)
    shutil.copytree(tiny_model, other)
    (other / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert sft.same_tokenizer(str(copy), str(tiny_model))[0]
    assert not sft.same_tokenizer(str(other), str(tiny_model))[0]
    assert not sft.same_tokenizer(None, str(tiny_model))[0]
    result = next(r for r in load_results(layout.eval_results_url(str(recorded), 0)) if r.reward == 1.0)
    calls, _ = fetch_calls_store(layout.calls_url(str(recorded)), [result.rollout_id])
    left_out: list[dict] = []
    rows = sft.rollout_samples(result, calls[result.rollout_id], None, sft.EXACT, left_out)
    assert len(rows) == 2 and left_out == []
    for row, call in zip(rows, calls[result.rollout_id], strict=True):
        assert (row.prompt_token_ids, row.response_token_ids) == (call["prompt_token_ids"], call["response_token_ids"])
        assert set(row.response_mask) == {1}
    # a call without token ids (an upstream that returns none) is named, not trained
    bare = [{**call, "prompt_token_ids": None, "response_token_ids": None} for call in calls[result.rollout_id]]
    assert sft.rollout_samples(result, bare, None, sft.EXACT, left_out) == [] and len(left_out) == 2


def test_the_step_writes_a_samples_table_the_update_reads_and_refuses_an_empty_filter(
        recorded: Path, tiny_model: Path, tmp_path: Path, capsys) -> None:
    """`python -m steps.sft.samples` writes the `samples` table (read by the update's own reader) and `_sft.json`;
    a min_reward no rollout reaches is one sentence and exit code 2, nothing written."""
    out = tmp_path / "sft"
    assert sft.main(["--source", str(recorded), "--model", str(tiny_model), "--out", str(out), "--run", "s"]) == 0
    report = json.loads(capsys.readouterr().out)
    samples = read_samples(str(out))
    assert len(samples) == report["samples"] == 2 and {s.run for s in samples} == {"s"}
    assert json.loads((out / "_sft.json").read_text()) == report
    assert sft.main(["--source", str(recorded), "--model", str(tiny_model), "--out", str(tmp_path / "none"),
                     "--min-reward", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"steps.sft.samples: no rollout of {recorded} has a reward >= 2 (4 graded); lower --min-reward or " \
                  "record more" and not (tmp_path / "none").exists()


@pytest.mark.parametrize("argv, message", [
    (["sft"], "sft needs --from RUN, the recorded run or eval run (its name in the store) to learn from"),
    (["--min-reward", "1"], "--min-reward is a flag of `python workflows/submit.py sft`"),
    (["eval", "--from", "x"], "--from is a flag of `python workflows/submit.py sft`"),
    (["sft", "--from", "x", "--k", "3"], "--k is a flag of `python workflows/submit.py eval`"),
    (["sft", "--from", "x", "--argo-server", "http://127.0.0.1:9", "--detach"],
     "--detach is not available for sft: its one Workflow is followed from here"),
    (["sft", "--from", "nope", "sft_min_reward=oops"], "config key 'sft_min_reward' must be a number"),
    (["sft", "--from", "x", "--argo-server", "http://127.0.0.1:9", "update_nodes=2", "update_gpus=8"],
     "config key 'update_nodes' is 2, but sft trains on one node"),
])
def test_submit_sft_refuses_in_one_sentence(argv: list[str], message: str, monkeypatch, capsys) -> None:
    """Each wrong use of `submit.py sft` (or of its flags elsewhere) is one sentence and exit code 2."""
    from workflows import submit

    monkeypatch.delenv("ARGO_SERVER", raising=False)
    assert submit.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {message}") and "\n" not in err


def test_submit_sft_refuses_a_source_that_is_not_in_the_store(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--from` names a run of the store; another name is one sentence naming where it looked, nothing trained."""
    from workflows import submit

    monkeypatch.delenv("ARGO_SERVER", raising=False)
    assert submit.main(["sft", "--from", "nope", f"store={tmp_path}", "run=s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --from nope: no run named 'nope' in the store '{tmp_path}' " \
                  f"(no {tmp_path}/nope/manifest/run.json)"
    assert not (tmp_path / "s").exists()


def test_an_sft_run_on_argo_is_one_workflow_linted_created_followed_and_recorded(fake_argo, s3_store: str,
                                                                                  capsys) -> None:
    """`sft --from teacher` with an Argo server: the SFT Workflow (tests/golden/sft-hub.yaml's shape) is linted,
    created and followed; run.json says what it learned from and iteration 0 is recorded with its Workflow, so
    `eval --checkpoint warm:1` would find the checkpoint. The control: a source not in the store is refused in one
    sentence and nothing is sent."""
    from steps import manifest
    from test_workflows import NO_CLUSTER_EGRESS
    from workflows import submit
    from workflows.config import load_config

    def drive(*args: str) -> int:
        return submit.main([*args, "--config", str(CLUSTER), "--argo-server", fake_argo.url, "--poll", "0.01",
                            f"store={s3_store}", f"s3_endpoint={os.environ['AWS_ENDPOINT_URL']}", *NO_CLUSTER_EGRESS])

    assert drive("sft", "--from", "teacher", "run=warm") == 2
    assert "no run named 'teacher' in the store" in capsys.readouterr().err and not fake_argo.calls("POST")
    manifest.write_run_config(f"{s3_store}/teacher", load_config(CLUSTER, ["run=teacher"]).to_dict())
    assert drive("sft", "--from", "teacher", "--min-reward", "0.5", "run=warm", "learning_rate=1e-5") == 0
    posts = [(path.rsplit("/", 1)[-1], body["workflow"]["metadata"]["name"])
             for _, path, body, _ in fake_argo.calls("POST")]
    assert posts == [("lint", "openforge-warm-sft"), ("openforge", "openforge-warm-sft")]
    templates = {t["name"]: t for t in fake_argo.workflows["openforge-warm-sft"]["spec"]["templates"]}
    samples, train = templates["sft-samples"]["container"]["command"], templates["sft"]["container"]["command"]
    assert samples[samples.index("--source") + 1] == f"{s3_store}/teacher"
    assert samples[samples.index("--min-reward") + 1] == "0.5" and "learning_rate=1e-05" in train
    assert train[train.index("--out") + 1] == f"{s3_store}/warm/checkpoints/iteration-1"
    assert manifest.read_sft(f"{s3_store}/warm") == {"from": "teacher", "min_reward": 0.5}
    record = manifest.read_iterations(f"{s3_store}/warm")[0]
    assert (record.workflow, record.status) == ("openforge-warm-sft", "Succeeded")
    assert drive("resume", "--run", "warm") == 0  # on record: followed (it succeeded), never an RL iteration
    assert [body["workflow"]["metadata"]["name"] for _, _, body, _ in fake_argo.calls("POST")][2:] == []


def test_sft_dry_run_prints_its_workflow(tmp_path: Path, capsys) -> None:
    """`--dry-run` prints the SFT Workflow and sends nothing."""
    from workflows import submit

    assert submit.main(["sft", "--from", "teacher", "--config", str(CLUSTER), "--dry-run", "run=warm"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out.split("\n", 2)[2])
    assert printed["metadata"]["name"] == "openforge-warm-sft"
    assert [t["name"] for t in printed["spec"]["templates"][0]["dag"]["tasks"]] == ["sft-samples", "sft"]
    train, = [t for t in printed["spec"]["templates"] if t["name"] == "sft"]
    assert train["container"]["command"][:3] == ["python", "-m", "steps.sft"] and "volumes" not in train
    # on 8 GPUs: torchrun with 8 ranks, a memory-backed /dev/shm for them, the update's NCCL env
    assert submit.main(["sft", "--from", "teacher", "--config", str(CLUSTER), "--dry-run", "run=warm",
                        "update_gpus=8", "update_env={NCCL_DEBUG: INFO}"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out.split("\n", 2)[2])
    train, = [t for t in printed["spec"]["templates"] if t["name"] == "sft"]
    assert train["container"]["command"][2:6] == ["steps.update.launch", "--standalone", "--nproc-per-node", "8"]
    assert train["container"]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in train["volumes"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in train["container"]["env"]
