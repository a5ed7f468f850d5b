"""The update on 2 ranks under torchrun (gloo on CPU, veRL's real worker with FSDP2 over both) against 1 rank.

Every update here is the real command the run builds (`workflows.commands.update`: `steps.update.launch`,
torchrun's launcher, with `update_gpus: 2`), a subprocess as in a run. On 2 shared cores a 2-rank update
takes tens of seconds, so the module makes eight runs (plus two that load no model) and every test
reads them: 9 samples in 3 mini-batches (3 samples each: a filler evens each out over the 2 ranks).
The second updates correct with `tis` (the trainer's logprobs as PPO's old ones): with the sampler's, the
first update's lr 1e-3 moved every token out of the clip range and their gradient would be 0.
The second 2-rank update reads and writes its checkpoints in S3 (moto on loopback), as on a cluster.
The tolerance (`WEIGHTS`, `METRICS`) is the one docs/update.md states. With images (`vision_runs`, the tiny
Qwen2.5-VL): one 2-rank update against the same step run as 1 rank in this process, and its control.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import ranks as update_ranks, shards, train as update_train  # noqa: E402
from update_reference import craft_samples, write_samples  # noqa: E402
from steps.contracts import layout  # noqa: E402
from workflows import commands  # noqa: E402
from steps.contracts.config import RunConfig  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# 2 ranks against 1 on the same batch, fp32 (docs/update.md, "On many GPUs"): the weights' difference relative
# to how far the update moved them (L2 over all weights; 3 AdamW steps of lr 1e-3 move each by ~3e-3), and the
# relative difference of loss and grad norm. Float rounding only: the ranks sum the same tokens' gradients in
# another order. Not a largest-difference bound: a gradient that is rounding noise (the key bias's: softmax
# ignores it) gets a full step of either sign from AdamW, so a few weights differ by ~lr/10 (measured 6.7e-5
# on 1 of 1.35M weights; the relative difference 4e-5).
WEIGHTS = 1e-3
METRICS = 1e-4
UPDATE = ["compute_dtype: fp32", "weight_decay: 0.0", "mini_batches: 3", "served_dtype: fp32"]
DISTRIBUTED_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, s3_server: dict) -> dict:
    """The tiny model, 9 crafted samples, and the module's update runs, each named by what it did."""
    import s3fs

    s3 = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": s3_server["endpoint_url"]})
    bucket = f"s3://{s3_server['bucket']}/ranks"
    root = tmp_path_factory.mktemp("ranks")
    checkpoint = build_tiny_model(root / "base", seed=0)
    samples = craft_samples(checkpoint, seed=0)
    assert len(samples) == 9
    config = root / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text() + "\n".join(UPDATE) + "\n")
    full = write_samples(samples, root / "full")
    # what rank 0 of 2 trains on: its share of each mini-batch
    half = write_samples([samples[row] for row in update_ranks.shard_rows(9, 3, 2)[0]], root / "half")

    def update(name: str, gpus: int, trajectories: Path, start: Path | str, *overrides: str, out: str = "") -> dict:
        run = RunConfig(update_gpus=gpus, update_config=str(config), learning_rate=1e-3)
        argv = [*commands.update(run, str(trajectories), str(start), out or str(root / name), python=sys.executable),
                *overrides]
        done = subprocess.run(argv, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO), **s3_server["env"]},
                              capture_output=True, text=True, timeout=900)
        if out and done.returncode == 0:
            s3.get(f"{out}/", str(root / name), recursive=True)
        return {"code": done.returncode, "stderr": done.stderr, "stdout": done.stdout, "out": root / name}

    result = {"base": checkpoint}
    result["one"] = update("one", 1, full, checkpoint)
    result["two"] = update("two", 2, full, checkpoint)
    result["half"] = update("half", 1, half, checkpoint)
    s3.put(f"{result['two']['out']}/", f"{bucket}/two", recursive=True)
    result["two_again"] = update("two-again", 2, full, f"{bucket}/two", "correction=tis", out=f"{bucket}/two-again")
    result["one_again"] = update("one-again", 1, full, result["one"]["out"], "correction=tis")
    result["fresh_again"] = update("fresh-again", 1, full, result["two"]["out"], "correction=tis",
                                   "carry_optimizer=false")
    result["one_from_two"] = update("one-from-two", 1, full, result["two"]["out"], "correction=tis")
    result["two_from_one"] = update("two-from-one", 2, full, result["one"]["out"], "correction=tis")
    flat = write_samples([dataclasses.replace(sample, reward=0.5) for sample in samples], root / "flat")
    result["skipped"] = update("skipped", 2, flat, result["two"]["out"])
    return result


def launcher_free_env() -> dict[str, str]:
    """This process's env without a process group's (RANK, MASTER_PORT, ...): an update test run in this process
    before sets them, and a 1-rank update inheriting MASTER_PORT would try to listen where this process listens."""
    return {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}


def weights(run: dict) -> dict[str, torch.Tensor]:
    assert run["code"] == 0, run["stderr"][-3000:]
    return shards.read_weights(run["out"])


def metrics(run: dict) -> dict:
    assert run["code"] == 0, run["stderr"][-3000:]
    return json.loads((run["out"] / "metrics.json").read_text())


def relative_difference(a: dict, b: dict, start: dict) -> float:
    """|a - b| / |a - start| over all weights (L2): how much of a's update b does not share."""
    def norm(x: dict, y: dict) -> float:
        return sum(float(((x[name].float() - y[name].float()) ** 2).sum()) for name in x) ** 0.5

    return norm(a, b) / norm(a, start)


def test_two_ranks_make_the_update_one_rank_makes(runs: dict) -> None:
    """Same batch: loss, grad norm and every written weight within the stated tolerance, though the weights
    moved ~1e-3. Control: one rank on rank 0's share alone (what a 2-rank update that dropped rank 1's rows
    would be) differs by far more."""
    one, two, half = weights(runs["one"]), weights(runs["two"]), weights(runs["half"])
    base = load_file(str(runs["base"] / "model.safetensors"))
    assert max((one[name] - base[name].float()).abs().max().item() for name in one) > 2e-3
    assert relative_difference(one, two, base) < WEIGHTS
    assert relative_difference(one, half, base) > 100 * WEIGHTS  # measured 0.82
    m1, m2 = metrics(runs["one"]), metrics(runs["two"])
    for key in ("loss", "grad_norm"):
        assert m2[key] == pytest.approx(m1[key], rel=METRICS), key
    for key in ("samples", "tokens_trained", "optimizer_steps", "reward_mean", "entropy", "logprob_gap"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-6), key
    assert metrics(runs["half"])["loss"] != pytest.approx(m1["loss"], rel=100 * METRICS)


def test_rank_0_writes_the_checkpoint_and_every_rank_its_optimizer_shard(runs: dict) -> None:
    """The weights' index and metrics.json, one optimizer shard (and extra state) per rank, the world
    size in state.json; one JSON line of metrics on stdout (rank 0's), no leftover partial folder."""
    out = runs["two"]["out"]
    names = {path.name for path in (out / "optimizer").iterdir()}
    assert {f"optim_world_size_2_rank_{rank}.pt" for rank in (0, 1)} <= names
    assert {f"extra_state_world_size_2_rank_{rank}.pt" for rank in (0, 1)} <= names
    assert not any("world_size_1" in name for name in names)
    assert json.loads((out / "optimizer" / "state.json").read_text())["world_size"] == 2
    assert {shards.INDEX_FILE, "metrics.json", "config.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]
    (line,) = [line for line in runs["two"]["stdout"].splitlines() if line.startswith('{"')]  # veRL prints too
    assert json.loads(line) == metrics(runs["two"])


def test_state_saved_by_two_ranks_continues_under_two_ranks(runs: dict) -> None:
    """The second 2-rank update (from S3 to S3) loads both shards: it says carried, counts 6 AdamW steps and
    writes the weights of one rank continuing its own first update; both ranks' new shards reached S3.
    Control: the same second step with a fresh AdamW is far off."""
    again = metrics(runs["two_again"])
    names = {path.name for path in (runs["two_again"]["out"] / "optimizer").iterdir()}
    assert {f"{kind}_world_size_2_rank_{rank}.pt" for kind in ("optim", "extra_state") for rank in (0, 1)} <= names
    assert again["optimizer_state"] == "carried" and again["optimizer_steps_total"] == 6
    assert json.loads((runs["two_again"]["out"] / "optimizer" / "state.json").read_text())[
        "optimizer_steps_total"] == 6
    assert metrics(runs["fresh_again"])["optimizer_state"] == "fresh: carry_optimizer is off"
    carried, continued, start = weights(runs["two_again"]), weights(runs["one_again"]), weights(runs["one"])
    assert relative_difference(continued, carried, start) < 2 * WEIGHTS
    assert relative_difference(continued, weights(runs["fresh_again"]), start) > 100 * WEIGHTS


def test_an_optimizer_state_saved_by_another_number_of_ranks_is_resharded(runs: dict) -> None:
    """1 rank on the 2 ranks' checkpoint and 2 ranks on the 1 rank's: each carries the other's AdamW state
    (6 steps) and writes the weights the same number of ranks continuing would. Control: a fresh AdamW from
    the same checkpoint is far off."""
    for resharded, saved_by, kept, start in (("one_from_two", 2, "two_again", "two"),
                                                    ("two_from_one", 1, "one_again", "one")):
        said = metrics(runs[resharded])
        assert said["optimizer_state"] == f"carried, resharded from world size {saved_by}", resharded
        assert said["optimizer_steps_total"] == 6
        moved = weights(runs[start])
        assert relative_difference(weights(runs[kept]), weights(runs[resharded]), moved) < 2 * WEIGHTS
    fresh = relative_difference(weights(runs["two_again"]), weights(runs["fresh_again"]), weights(runs["two"]))
    assert fresh > 100 * WEIGHTS


def test_a_bad_input_is_refused_by_both_ranks_in_one_sentence(runs: dict, tmp_path: Path) -> None:
    """Under torchrun a bad config key stops both ranks before a model loads: exit 2 and one sentence, once,
    not torchrun's failure report (control: the same command without the bad key trained, `runs["two"]`)."""
    argv = [*commands.update(RunConfig(update_gpus=2), str(runs["two"]["out"].parent / "full"), str(runs["base"]),
                             str(tmp_path / "out"), python=sys.executable), "correction=nope"]
    done = subprocess.run(argv, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "steps.update: config key 'correction' must be one of bypass, tis, got 'nope'"]
    assert metrics(runs["two"])["samples"] == 9


def test_a_skipped_update_on_two_ranks_copies_the_checkpoint_once(runs: dict) -> None:
    """No advantage on 2 ranks: no model loads, rank 0 copies the weights and both ranks' optimizer shards
    unchanged and says so once (the trained 2-rank runs are the control: they wrote new weights)."""
    skipped, source = runs["skipped"], runs["two"]["out"]
    assert metrics(skipped)["skipped"] == "no advantage" and metrics(skipped)["optimizer_state"] == "copied unchanged"
    for name in (*(path.name for path in source.glob("*.safetensors*")), *(f"optimizer/{kind}_world_size_2_rank_{rank}.pt"
                                        for kind in ("optim", "extra_state") for rank in (0, 1))):
        assert (skipped["out"] / name).read_bytes() == (source / name).read_bytes(), name
    assert skipped["stderr"].count("steps.update: no advantage: ") == 1
    again, before = weights(runs["two_again"]), weights(runs["two"])
    assert any(not again[name].equal(before[name]) for name in before)


@pytest.fixture(scope="module")
def vision_runs(tiny_vision_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Updates on the tiny Qwen2.5-VL, each the run's command with the run's image folder: 4 samples whose ids are
    all the same (same-size screenshots, same text), each with its own screenshot, and a text sample, in one
    mini-batch (rank 0 trains rows 0-2, rank 1 rows 3-4 and the filler). On 1 and 2 ranks, and on 1 rank with
    the screenshots rotated one sample on (the control: the same ids, each image with another sample)."""
    from steps.update.batch import Sample
    from test_update_vision import image_prompt, screenshot, store_image

    root = tmp_path_factory.mktemp("vision-ranks")
    run = RunConfig(store=str(root), run="run", update_gpus=1, learning_rate=1e-3)
    folder = Path(layout.images_url(run.run_url))
    names = [store_image(folder, screenshot(seed)) for seed in range(4)]
    prompt = image_prompt(tiny_vision_model, [screenshot(0)])
    assert all(image_prompt(tiny_vision_model, [screenshot(seed)]) == prompt for seed in range(1, 4))
    response = [300 + 7 * i for i in range(12)]
    samples = [Sample(f"r{i}", "click", prompt, response, [1] * 12, None, float(i % 2), images=[names[i]])
               for i in range(4)]
    samples.append(Sample("r4", "click", [40, 41, 42, 43], response, [1] * 12, None, 1.0))
    rotated = [dataclasses.replace(s, images=[names[(i + 1) % 4]]) if s.images else s for i, s in enumerate(samples)]
    config = root / "update.yaml"
    config.write_text((REPO / "configs" / "update.yaml").read_text()
                      + "\n".join(["compute_dtype: fp32", "weight_decay: 0.0", "mini_batches: 1"]) + "\n")

    def update(name: str, gpus: int, rows: list) -> dict:
        trajectories = write_vision_samples(rows, root / f"{name}-samples")
        argv = commands.update(dataclasses.replace(run, update_gpus=gpus, update_config=str(config)),
                               str(trajectories), str(tiny_vision_model), str(root / name), python=sys.executable)
        if gpus == 1:  # `python -m steps.update ...` in this process: no second import of veRL (seconds on 2 cores)
            assert argv[1:3] == ["-m", "steps.update"]
            return {"code": update_train.main(argv[3:]), "stderr": "", "out": root / name}
        done = subprocess.run(argv, cwd=REPO, env={**launcher_free_env(), "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=900)
        return {"code": done.returncode, "stderr": done.stderr, "stdout": done.stdout, "out": root / name}

    two = update("two", 2, samples)  # first: the 1-rank updates in this process set a process group's env
    return {"base": tiny_vision_model, "two": two, "one": update("one", 1, samples),
            "rotated": update("rotated", 1, rotated)}


def write_vision_samples(samples: list, folder: Path) -> Path:
    """`write_samples` plus the samples' `images` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_samples(samples, folder)
    table = pq.read_table(folder / "samples.parquet")
    table = table.append_column("images", pa.array([s.images or [] for s in samples], pa.list_(pa.string())))
    pq.write_table(table, folder / "samples.parquet")
    return folder


def test_two_ranks_keep_each_image_with_its_sample(vision_runs: dict) -> None:
    """Images across ranks: the 2-rank update on samples that differ only by their screenshot makes the 1-rank
    update (loss, grad norm, every weight, vision tower included, within the text test's tolerance). Control: 1
    rank with each screenshot moved to the next sample (same ids) is far off, so images that left their sample
    on the way to a rank would be caught."""
    from transformers import AutoModelForImageTextToText

    def state(folder: Path) -> dict:
        return AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).state_dict()

    for name in ("one", "two", "rotated"):
        assert vision_runs[name]["code"] == 0, vision_runs[name]["stderr"][-3000:]
    base, one, two, rotated = (state(vision_runs[name]["out"] if name != "base" else vision_runs["base"])
                               for name in ("base", "one", "two", "rotated"))
    print(f"2 ranks vs 1: {relative_difference(one, two, base):.2e}; rotated images: "
          f"{relative_difference(one, rotated, base):.2e}")
    assert relative_difference(one, two, base) < WEIGHTS
    assert relative_difference(one, rotated, base) > 100 * WEIGHTS
    m1, m2, m3 = (metrics(vision_runs[name]) for name in ("one", "two", "rotated"))
    for key in ("loss", "grad_norm"):
        assert m2[key] == pytest.approx(m1[key], rel=METRICS), key
    assert m3["grad_norm"] != pytest.approx(m1["grad_norm"], rel=100 * METRICS)
    assert m1["samples"] == m2["samples"] == 5 and m1["tokens_trained"] == m2["tokens_trained"] == 60
