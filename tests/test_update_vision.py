"""The update on samples with images: the real veRL worker (FSDP2, CPU) on a tiny Qwen-VL model, its images read
from a run's image folder and run through the checkpoint's own image processor (`steps.update.vision`).

Needs the training environment (verl==0.9.1), like tests/test_update.py; the vLLM comparison also needs the
serving environment (`OPENFORGE_SERVE_PYTHON`): samples recorded from the module's vLLM, the trainer's logprobs
on them, and after an update on them the proxy's weight swap, the same prompts again and the updated trainer's
logprobs. The module's model is `steps.tiny_model --vision qwen3_vl`'s Qwen3-VL, the production target (random
weights, a 1280x720 screenshot is 252 image tokens at its pixel cap); `OPENFORGE_TEST_VISION_FAMILY=qwen2_5_vl`
runs it on the Qwen2.5-VL the session's vision vLLM and the GUI loop serve. The tests that load a model are
marked `slow`; the rest are in `make test-fast`."""

import asyncio
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 is not installed in this environment (the training env)")
torch = pytest.importorskip("torch")

from steps.tiny_model import build_tiny_model  # noqa: E402
from steps.update import batch as update_batch, train as update, vision  # noqa: E402
from steps.update.config import load_config  # noqa: E402

OVERRIDES = ["learning_rate=1e-3", "weight_decay=0.0"]
FAMILY = os.environ.get("OPENFORGE_TEST_VISION_FAMILY", "qwen3_vl")


def screenshot(seed: int = 0, size: tuple[int, int] = (1280, 720), transparent: bool = False) -> bytes:
    """A synthetic PNG screenshot: a page of coloured boxes and text lines (`transparent`: RGBA, its
    background fully transparent, as some capture tools write it)."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGBA", size, (0, 0, 0, 0) if transparent else (240, 240, 240, 255))
    draw = ImageDraw.Draw(image)
    for _ in range(24):
        x, y = rng.randrange(max(1, size[0] - 200)), rng.randrange(max(1, size[1] - 60))
        draw.rectangle([x, y, x + rng.randrange(40, 200), y + rng.randrange(20, 60)],
                       fill=tuple(rng.randrange(256) for _ in range(3)) + (255,))
        draw.text((x + 4, y + 4), f"button {rng.randrange(1000)}", fill=(0, 0, 0, 255))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def store_image(folder: Path, data: bytes) -> str:
    """Stores `data` as the proxy's store does (`<images>/<sha256>`); returns its name."""
    name = hashlib.sha256(data).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return name


def image_prompt(checkpoint: Path, images: list[bytes], text: str = "Click the blue button.") -> list[int]:
    """The chat template's prompt ids for one user turn with `images` then `text`, each image part expanded to
    one `<|image_pad|>` per merged patch (what vLLM's prompt ids hold)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    model = vision.load(checkpoint)
    grids = model.processor(images=[vision.on_white(data) for data in images], return_tensors="pt")["image_grid_thw"]
    counts = iter(vision.image_tokens(grids, model.merge_size))
    return [token for token_id in ids
            for token in ([token_id] * next(counts) if token_id == model.image_token_id else [token_id])]


@pytest.fixture(scope="module")
def vision_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny vision model of `FAMILY` (seed 0) for this module."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-vision"), seed=0, vision=FAMILY)


@pytest.fixture(scope="module")
def run_images(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run's image folder holding three screenshots (one with a transparent background); their names."""
    folder = tmp_path_factory.mktemp("run") / "calls" / "images"
    names = [store_image(folder, screenshot(seed, transparent=seed == 2)) for seed in range(3)]
    return {"url": str(folder), "names": names, "data": [(folder / name).read_bytes() for name in names]}


def image_sample(checkpoint: Path, run_images: dict, which: list[int], rollout: str, reward: float,
                 response: list[int] | None = None) -> update_batch.Sample:
    """A sample whose prompt shows the screenshots `which` (indices into `run_images`)."""
    prompt = image_prompt(checkpoint, [run_images["data"][i] for i in which])
    response = response or [300 + 7 * i for i in range(12)]
    return update_batch.Sample(rollout_id=rollout, task="click", prompt_token_ids=prompt, response_token_ids=response,
                               response_mask=[1] * len(response), response_logprobs=None, reward=reward,
                               images=[run_images["names"][i] for i in which])


def test_the_prompt_holds_one_image_token_per_merged_patch(vision_checkpoint: Path, run_images: dict) -> None:
    """A 1280x720 screenshot at the tiny model's pixel cap: a 24x42 patch grid, 12x21 merged: 252 tokens; the position ids
    are the text row then the model's 3 mrope rows, which differ from the text row from the image on."""
    sample = image_sample(vision_checkpoint, run_images, [0], "r0", 1.0)
    model = vision.load(vision_checkpoint)
    (inputs, positions), = vision.batch_inputs([sample], vision_checkpoint, run_images["url"])
    assert inputs["image_grid_thw"].tolist() == [[1, 24, 42]]
    assert vision.image_runs(sample.prompt_token_ids, model.image_token_id) == [252]
    ids = sample.prompt_token_ids + sample.response_token_ids
    assert positions.shape == (4, len(ids)) and positions[0].tolist() == list(range(len(ids)))
    first = sample.prompt_token_ids.index(model.image_token_id)
    assert torch.equal(positions[1:, :first], positions[:1, :first].expand(3, -1))
    assert not torch.equal(positions[1:, first:], positions[:1, first:].expand(3, -1))


def test_transparent_pixels_are_composited_on_white_as_vllm_does(run_images: dict) -> None:
    """The transparent screenshot's background is white, as vLLM shows it; PIL's plain convert makes it black."""
    from PIL import Image

    data = run_images["data"][2]
    assert vision.on_white(data).getpixel((0, 0)) == (255, 255, 255)
    assert Image.open(io.BytesIO(data)).convert("RGB").getpixel((0, 0)) == (0, 0, 0)  # control


@pytest.mark.parametrize("change, message", [
    ("one token less", "hold image token runs of [251] but its 1 image(s) make [252]"),
    ("other image size", "hold image token runs of [252] but its 1 image(s) make [4]"),
    ("image tokens, no images", "its token ids hold image tokens but it names no images"),
    ("name not a hash", "is not a SHA-256"),
    ("bytes not of their name", "do not have that SHA-256"),
    ("missing image", "cannot read image"),
    ("not an image", "not a decodable image"),
])
def test_a_sample_whose_images_do_not_match_is_refused_by_name(change: str, message: str, vision_checkpoint: Path,
                                                             run_images: dict, tmp_path: Path) -> None:
    """Never trained on misaligned features: each mismatch is one sentence naming the sample, before any model
    is loaded; the unchanged sample passes (control)."""
    sample = image_sample(vision_checkpoint, run_images, [0], "r0", 1.0)
    assert vision.batch_inputs([sample], vision_checkpoint, run_images["url"])  # control
    folder = tmp_path / "images"
    if change == "one token less":
        sample.prompt_token_ids.remove(vision.load(vision_checkpoint).image_token_id)
    elif change == "other image size":
        sample.images = [store_image(folder, screenshot(0, size=(56, 56)))]
    elif change == "image tokens, no images":
        sample.images = []
    elif change == "name not a hash":
        sample.images = ["../../etc/passwd"]
    elif change == "bytes not of their name":
        store_image(folder, b"")
        (folder / sample.images[0]).write_bytes(screenshot(1))
    elif change == "missing image":
        store_image(folder, b"")
    elif change == "not an image":
        sample.images = [store_image(folder, b"<html>not a png</html>")]
    url = str(folder) if folder.exists() else run_images["url"]
    with pytest.raises(update_batch.SampleError, match="rollout 'r0' sample") as error:
        vision.batch_inputs([sample], vision_checkpoint, url)
    assert message in str(error.value)


def test_images_served_at_a_pixel_cap_are_gridded_at_that_cap(vision_checkpoint: Path, run_images: dict) -> None:
    """A screenshot served with the run config's `max_pixels` at a quarter of the checkpoint's cap is 60 image
    tokens in vLLM's prompt (`tests/test_vision_serving.py`); at that cap the update grids it so and trains on
    it. Control: at the checkpoint's own cap (252 tokens) the same sample is refused, naming both counts."""
    model = vision.load(vision_checkpoint)
    cap = model.processor.size["longest_edge"] // 4
    sample = image_sample(vision_checkpoint, run_images, [0], "r0", 1.0)
    capped = [token for token in sample.prompt_token_ids if token != model.image_token_id]
    first = sample.prompt_token_ids.index(model.image_token_id)
    sample.prompt_token_ids = capped[:first] + [model.image_token_id] * 60 + capped[first:]
    (inputs, positions), = vision.batch_inputs([sample], vision_checkpoint, run_images["url"], max_pixels=cap)
    assert inputs["image_grid_thw"].tolist() == [[1, 12, 20]] and positions.shape[1] == len(sample.prompt_token_ids) + 12
    with pytest.raises(update_batch.SampleError, match=r"runs of \[60\] but its 1 image\(s\) make \[252\]"):
        vision.batch_inputs([sample], vision_checkpoint, run_images["url"])


def test_images_on_a_text_checkpoint_or_without_an_image_folder_are_refused(vision_checkpoint: Path,
                                                                           run_images: dict, tmp_path: Path) -> None:
    """A text model cannot see the images, and without `--images` there are none to read: both refused."""
    sample = image_sample(vision_checkpoint, run_images, [0], "r0", 1.0)
    text_model = build_tiny_model(tmp_path / "text")
    with pytest.raises(update_batch.SampleError, match="is a text model"):
        vision.batch_inputs([sample], text_model, run_images["url"])
    with pytest.raises(update_batch.SampleError, match="pass --images"):
        vision.batch_inputs([sample], vision_checkpoint, None)
    assert vision.batch_inputs([update_batch.Sample("t", "a", [1, 2], [3], [1], None, 1.0)], text_model, None) is None


def test_the_images_column_is_read_and_optional(tmp_path: Path) -> None:
    """`images` comes through `read_samples`; a table without the column (a text run's) reads as no images."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{name: value for name, value in zip(update_batch.SAMPLE_COLUMNS,
                                                 ["r", "t", [1, 2], [3], [1], None, 1.0, 1.0])}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "samples.parquet")
    assert update_batch.read_samples(str(tmp_path))[0].images == []
    pq.write_table(pa.Table.from_pylist([{**rows[0], "images": ["a" * 64]}]), tmp_path / "samples.parquet")
    assert update_batch.read_samples(str(tmp_path))[0].images == ["a" * 64]


@pytest.fixture(scope="module")
def image_update(vision_checkpoint: Path, run_images: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real update on 4 samples in one task (two with one screenshot, one with two, one text) through the
    CLI, as a run calls it, with the images read from the run's image folder."""
    from update_reference import write_samples

    samples = [image_sample(vision_checkpoint, run_images, [0], "r0", 1.0),
               image_sample(vision_checkpoint, run_images, [1, 2], "r1", 0.0),
               image_sample(vision_checkpoint, run_images, [2], "r2", 1.0),
               update_batch.Sample("r3", "click", [40, 41, 42, 43], [300 + i for i in range(12)], [1] * 12, None, 0.0)]
    folder = tmp_path_factory.mktemp("image-samples")
    write_samples(samples, folder)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "samples.parquet")
    table = table.append_column("images", pa.array([s.images or [] for s in samples], pa.list_(pa.string())))
    pq.write_table(table, folder / "samples.parquet")
    out = tmp_path_factory.mktemp("image-update") / "out"
    code = update.main(["--trajectories", str(folder), "--checkpoint", str(vision_checkpoint), "--out", str(out),
                        "--images", run_images["url"], *OVERRIDES,
                        # every weight moves by less than bf16 resolves on some (norms, biases): fp32 shows them all
                        "served_dtype=fp32"])
    return {"code": code, "out": out, "samples": samples}


@pytest.mark.slow
def test_an_update_with_images_trains_the_model_and_its_vision_tower(image_update: dict,
                                                                     vision_checkpoint: Path) -> None:
    """The update runs (exit 0), every weight moved, the vision tower's too (its gradient came through the
    images' features), and the checkpoint carries the processor files vLLM needs to serve it again."""
    from transformers import AutoModelForImageTextToText

    assert image_update["code"] == 0
    out = image_update["out"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["samples"] == 4 and metrics["tokens_trained"] == 48
    # loaded as a model (the update writes the in-memory names, `model.visual.*`; the builder the saved ones)
    before, after = (AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).state_dict()
                     for folder in (vision_checkpoint, out))
    assert set(before) == set(after)
    moved = [name for name in before if not torch.equal(before[name], after[name])]
    assert [name for name in moved if ".visual." in f".{name}"]
    assert len(moved) == len(before)
    for name in ("preprocessor_config.json", "chat_template.jinja", "tokenizer.json", "tokenizer_config.json",
                 "config.json"):
        assert (out / name).read_bytes() == (vision_checkpoint / name).read_bytes(), name


def test_doctests() -> None:
    """`steps.update.vision`'s doctests (compositing on white, image token runs, grids)."""
    import doctest

    failures, tried = doctest.testmod(vision)
    assert tried and not failures


@pytest.fixture(scope="module")
def vision_vllm(vision_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    """The real vLLM (CPU, bf16) serving the tiny vision model as "tiny", from the serving environment
    (`OPENFORGE_SERVE_PYTHON`), with the serve step's own vision flags and CPU shim."""
    from steps.vllm_server import stop_vllm
    from vllm_process import start_vllm

    server = start_vllm(vision_checkpoint, name="tiny", log_path=tmp_path_factory.mktemp("vllm") / "vllm.log",
                        timeout_s=600)
    try:
        yield server.base_url
    finally:
        stop_vllm(server)


def sampled(url: str, content, seed: int) -> dict:
    """One chat call to vLLM at temperature 1 with token ids and logprobs: its prompt ids, sampled ids and
    their logprobs."""
    import httpx

    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 16,
            "temperature": 1.0, "logprobs": True, "return_token_ids": True, "seed": seed, "ignore_eos": True}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    return {"prompt": reply.json()["prompt_token_ids"], "response": choice["token_ids"],
            "logprobs": [token["logprob"] for token in choice["logprobs"]["content"]]}


def trainer_gaps(worker, samples: list, checkpoint: Path, images_url: str, flat: bool = False) -> list[float]:
    """The mean absolute difference, per sample, of the worker's logprobs (production bf16) from vLLM's on its
    sampled tokens; `flat`: with 1-D positions (`arange` in all four rows) instead of the model's mrope ones."""
    inputs = vision.batch_inputs(samples, checkpoint, images_url)
    if flat:
        inputs = [(features, vision.text_position_ids(positions.shape[1])) for features, positions in inputs]
    batch = update_batch.with_images(update_batch.pad(samples, {s.rollout_id: 0.0 for s in samples}), samples, inputs)
    log_probs, _ = update.trainer_logprobs(worker, batch, 1.0)
    return [float((log_probs[row] - batch.rollout_log_probs[row])[batch.response_mask[row].bool()].abs().mean())
            for row in range(len(samples))]


NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("OPENFORGE_SERVE_PYTHON"),
                                reason="vLLM is not installed here and OPENFORGE_SERVE_PYTHON names no serving env's Python")
TEXT_PROMPT = "Click the blue button on the page."


def screenshot_content(data: bytes) -> list[dict]:
    """A user turn's content: the screenshot `data` as a data URL, then the instruction."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Click the blue button."}]


def record(url: str, folder: Path) -> list[update_batch.Sample]:
    """vLLM's samples at temperature 1 as a rollout records them (prompt ids, sampled ids, their logprobs): after
    screenshot 0 (opaque) and screenshot 1 (transparent background), stored in `folder`, then after a text
    prompt; rewards 0, 1, 0 in one task."""
    samples = []
    for seed in range(2):
        data = screenshot(seed, transparent=seed == 1)
        call = sampled(url, screenshot_content(data), seed)
        samples.append(update_batch.Sample(f"r{seed}", "click", call["prompt"], call["response"], [1] * 16,
                                           call["logprobs"], float(seed), images=[store_image(folder, data)]))
    call = sampled(url, TEXT_PROMPT, 5)
    samples.append(update_batch.Sample("r2", "click", call["prompt"], call["response"], [1] * 16, call["logprobs"], 0.0))
    return samples


@pytest.fixture(scope="module")
def recorded(vision_vllm: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`record` on the module's vLLM serving the base checkpoint: the samples and their image folder."""
    folder = tmp_path_factory.mktemp("recorded") / "images"
    return {"samples": record(vision_vllm, folder), "images": str(folder)}


@pytest.mark.slow
@NEEDS_VLLM
def test_the_trainer_reproduces_vllms_logprobs_on_screenshots(recorded: dict, vision_checkpoint: Path) -> None:
    """vLLM samples after a screenshot (one opaque, one with a transparent background) and after a text prompt;
    its prompt ids are the template's expansion. The worker's logprobs on the screenshot samples are as close
    to vLLM's as on the text sample (within twice its gap); with 1-D positions, or with part of the screenshot
    blacked out (same size, so the same ids), they are far outside that bound (the controls)."""
    from PIL import ImageDraw

    folder, samples = Path(recorded["images"]), [dataclasses.replace(s) for s in recorded["samples"]]
    for sample in samples[:2]:
        assert sample.prompt_token_ids == image_prompt(vision_checkpoint, [(folder / sample.images[0]).read_bytes()])
    update.prepare_runtime()
    worker, _ = update.build_worker(vision_checkpoint, load_config(None, []))
    *image_gaps, text_gap = trainer_gaps(worker, samples, vision_checkpoint, str(folder))
    flat_gaps = trainer_gaps(worker, samples, vision_checkpoint, str(folder), flat=True)[:2]
    altered = vision.on_white((folder / samples[0].images[0]).read_bytes())
    ImageDraw.Draw(altered).rectangle([0, 0, 640, 360], fill=(0, 0, 0))
    buffer = io.BytesIO()
    altered.save(buffer, "PNG")
    samples[0].images = [store_image(folder, buffer.getvalue())]
    altered_gap = trainer_gaps(worker, samples, vision_checkpoint, str(folder))[0]
    print(f"logprob gap: text {text_gap:.4f}, screenshots {image_gaps}, 1-D positions {flat_gaps}, "
          f"blacked-out quarter {altered_gap:.4f}")
    bound = 2 * text_gap
    assert 0 < text_gap < 0.08  # bf16 noise, as on the text model (tests/test_update.py)
    assert max(image_gaps) < bound
    assert min(flat_gaps) > bound and altered_gap > bound


async def swap(url: str, weights: Path, version: str) -> None:
    """The proxy's own weight swap (`steps.proxy.weights.swap_weights`: reload, prefix and encoder cache resets,
    version) on the vLLM at `url`, its one replica."""
    from steps.proxy.replicas import Replicas
    from steps.proxy.sessions import WeightGate
    from steps.proxy.upstream import Upstream
    from steps.proxy.weights import swap_weights

    upstream = Upstream(url)
    await upstream.start()
    try:
        assert await swap_weights(WeightGate("0"), Replicas([upstream], "0"), str(weights), version) == []
    finally:
        await upstream.close()


@pytest.mark.slow
@NEEDS_VLLM
def test_after_an_update_and_a_swap_vllm_serves_the_updated_trainers_logprobs(recorded: dict, vision_vllm: str,
                                                                             vision_checkpoint: Path,
                                                                             tmp_path: Path) -> None:
    """The recorded samples (two screenshots, one text) train one real update (one AdamW step at lr 1e-3 moves
    their logprobs by 1.5-4 nats, far past bf16 noise), saved as the update step saves it; the proxy's swap serves it and
    the same prompts are sent again: 200 (no encoder cache miss), the same prompt ids, and vLLM's logprobs
    match the updated trainer's within twice the text gap (the new weights' text gap). The control: vLLM's
    logprobs before the swap are outside that bound of the updated trainer's, so stale weights served after a
    swap would fail the check. The module's server is swapped back after."""
    import httpx

    worker, metrics = update.run_update([dataclasses.replace(s) for s in recorded["samples"]], vision_checkpoint,
                                        load_config(None, OVERRIDES), recorded["images"])
    assert worker is not None and metrics["tokens_trained"] == 48
    updated = update.save_checkpoint(worker, vision_checkpoint, tmp_path / "updated")
    asyncio.run(swap(vision_vllm, updated, "1"))
    try:
        again = record(vision_vllm, Path(recorded["images"]))
        assert httpx.get(f"{vision_vllm}/health", timeout=10).status_code == 200
    finally:
        asyncio.run(swap(vision_vllm, vision_checkpoint, "2"))
    assert [s.prompt_token_ids for s in again] == [s.prompt_token_ids for s in recorded["samples"]]
    *image_gaps, text_gap = trainer_gaps(worker, again, updated, recorded["images"])
    stale_gaps = trainer_gaps(worker, recorded["samples"], updated, recorded["images"])
    print(f"after the swap, updated trainer vs vLLM: text {text_gap:.4f}, screenshots {image_gaps}; "
          f"vs vLLM before the swap (stale): {stale_gaps}")
    bound = 2 * text_gap
    assert 0 < text_gap < 0.08
    assert max(image_gaps) < bound
    assert min(stale_gaps) > bound


@pytest.mark.slow
def test_samples_of_one_length_train(vision_checkpoint: Path, run_images: dict) -> None:
    """Two image samples of the same length (same-size screenshots, same text): torch nests their (4, length)
    positions as ragged in the 4 unless the batch says otherwise, and veRL's micro-batching then failed."""
    samples = [image_sample(vision_checkpoint, run_images, [index], f"r{index}", float(index)) for index in (0, 1)]
    assert len(samples[0].prompt_token_ids) == len(samples[1].prompt_token_ids)
    worker, metrics = update.run_update(samples, vision_checkpoint, load_config(None, OVERRIDES), run_images["url"])
    assert worker is not None and metrics["tokens_trained"] == 24


def test_a_vision_checkpoint_trains_on_samples_without_images(vision_checkpoint: Path, tiny_vision_model: Path,
                                                              run_images: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls before the first screenshot (the computer-use loop's first call) make samples without images; on
    Qwen2-VL and Qwen2.5-VL (the session's `tiny_vision_model`) a micro-batch of only those ran veRL's placeholder
    image through the tower and failed on its output object. The update trains them on both families; the
    control, veRL's own Qwen2.5-VL embedding step on the same batch, fails (veRL's Qwen3-VL step unpacks the
    tower's output itself)."""
    from verl.models.transformers import qwen2_vl

    text = [update_batch.Sample(rollout_id=f"t{i}", task="click", prompt_token_ids=[11, 12, 13 + i],
                                response_token_ids=[300 + 7 * j for j in range(12)], response_mask=[1] * 12,
                                response_logprobs=None, reward=float(i), images=[]) for i in (0, 1)]
    config = load_config(None, OVERRIDES)
    for checkpoint in dict.fromkeys([vision_checkpoint, tiny_vision_model]):
        worker, metrics = update.run_update(text, checkpoint, config, run_images["url"])
        assert worker is not None and metrics["tokens_trained"] == 24
    monkeypatch.setattr(update.vision, "patch_text_only_batches", lambda: None)
    monkeypatch.setattr(qwen2_vl, "_get_input_embeds", qwen2_vl._get_input_embeds.original)
    with pytest.raises(AttributeError, match="mean"):
        update.run_update(text, tiny_vision_model, config, run_images["url"])
