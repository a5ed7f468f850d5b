"""Samples from image calls: a call continues a sample only if its images continue the sample's too, and
its image tokens are checked against each image's grid with the checkpoint's own preprocessor config.

Calls go through the real proxy into a real store; the upstream (`tests/screenshots.py`, a double: the point
is the merge, and vLLM with a vision model costs minutes per start here) answers like vLLM on Qwen2.5-VL,
one run of image-pad ids per image, counted by transformers' own Qwen2-VL image processor (PIL), which is
also what wrote the checkpoint's `preprocessor_config.json`. The trajectories CLI then reads that store.
"""

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from proxy_process import serve_proxy
from screenshots import IMAGE_PAD, RESPONSE, CapturingUpstream, data_url, screenshot, sha
from steps.trajectories.samples import build_samples
from steps.trajectories.vision import load_grid, smart_resize

ADMIN = "test-admin-key"
MIN_PIXELS, MAX_PIXELS = 4 * 28 * 28, 256 * 28 * 28  # the tiny vision model's cap: 252 tokens for 1280x720
ROOT = Path(__file__).resolve().parents[1]


def processor(max_pixels: int = MAX_PIXELS):
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=max_pixels)


def processor_tokens(png: bytes, max_pixels: int = MAX_PIXELS) -> int:
    """Image tokens of one image, as the real image processor counts them (its grid / merge^2)."""
    import io

    from PIL import Image

    grid = processor(max_pixels)(images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="np")["image_grid_thw"][0]
    return int(grid[0] * grid[1] * grid[2]) // 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint's config files: Qwen2.5-VL's image token, and the processor's own saved config."""
    folder = tmp_path_factory.mktemp("checkpoint")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "image_token_id": IMAGE_PAD}))
    processor().save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("width", "height"), [(1280, 720), (720, 1280), (1920, 1080), (333, 77), (20, 20), (5000, 400)])
def test_smart_resize_gives_the_real_processors_grid(width, height):
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, "PNG")
    h, w = smart_resize(height, width, 28, MIN_PIXELS, MAX_PIXELS)
    assert (h // 14) * (w // 14) // 4 == processor_tokens(out.getvalue())


def chat(url: str, key: str, messages: list[dict]) -> None:
    answer = httpx.post(url, json={"model": "tiny", "max_tokens": 8, "messages": messages},
                        headers={"authorization": f"Bearer {key}"}, timeout=120)
    assert answer.status_code == 200, answer.text


def user(text: str, png: bytes) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(png)}}]}


ASSISTANT = {"role": "assistant", "content": "ok"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two rollouts through the proxy: `different` re-sends its first screenshot as another one of the same
    size (token ids still continue), `same` re-sends the same one; plus results for both."""
    tmp = tmp_path_factory.mktemp("recorded")
    first, other, later = screenshot(1), screenshot(2), screenshot(3)
    with CapturingUpstream(image_tokens=processor_tokens) as upstream, \
            serve_proxy(upstream.url, str(tmp / "calls"), ADMIN, log_path=tmp / "proxy.log") as proxy:
        for rollout_id, again in (("different", other), ("same", first)):
            rollout = proxy.register(rollout_id)
            url = f"{rollout['openai_base_url']}/chat/completions"
            chat(url, rollout["api_key"], [user("look", first)])
            chat(url, rollout["api_key"], [user("look", again), ASSISTANT, user("next", later)])
        calls = {rid: proxy.calls(rid) for rid in ("different", "same")}
    for rid in calls:
        (tmp / "results" / rid).mkdir(parents=True)
        (tmp / "results" / rid / "result.json").write_text(json.dumps(
            {"rollout_id": rid, "task": "t", "harness": "browser", "status": "ok", "reward": 1.0, "num_calls": 2}))
    return tmp, calls, (first, other, later)


def test_two_screenshots_of_one_size_give_identical_token_ids_and_do_not_merge_the_same_one_does(recorded, checkpoint):
    _, calls, (first, other, later) = recorded
    grid = load_grid(str(checkpoint))
    different, same = calls["different"], calls["same"]
    # The token ids cannot tell them apart: call 1 continues call 0 token for token in both rollouts.
    assert different[1]["prompt_token_ids"] == same[1]["prompt_token_ids"]
    assert different[1]["prompt_token_ids"][:len(different[0]["prompt_token_ids"]) + len(RESPONSE)] == \
        different[0]["prompt_token_ids"] + RESPONSE
    assert different[0]["prompt_token_ids"].count(IMAGE_PAD) == 252
    split, merged = build_samples(different, grid), build_samples(same, grid)
    assert [s.images for s in split.samples] == [[sha(first)], [sha(other), sha(later)]] and not split.untrainable
    assert [s.images for s in merged.samples] == [[sha(first), sha(later)]] and merged.continued_calls == {1}


def run_cli(tmp: Path, out: str, *extra: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "steps.trajectories", "--store", str(tmp / "calls"), "--results",
                           str(tmp / "results"), "--out", out, *extra], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]) | {"stderr": done.stderr}


def test_the_cli_writes_each_samples_images_and_drops_calls_whose_image_tokens_do_not_match_their_grids(recorded, checkpoint):
    tmp, _, (first, other, later) = recorded
    summary = run_cli(tmp, str(tmp / "out"), "--model", str(checkpoint))
    folder = Path(summary["partition"])
    samples = pq.read_table(folder / "samples.parquet").to_pylist()
    assert [(s["rollout_id"], s["images"]) for s in samples] == [
        ("different", [sha(first)]), ("different", [sha(other), sha(later)]), ("same", [sha(first), sha(later)])]
    calls = pq.read_table(folder / "calls.parquet").to_pylist()
    assert [c["images"] for c in calls if c["rollout_id"] == "same"] == [[sha(first)], [sha(first), sha(later)]]
    assert summary["untrainable_calls"] == 0 and all(c["untrainable"] is None for c in calls)
    # Another pixel cap than the one vLLM's processor used: every image's count is off, no call is trained on.
    off = run_cli(tmp, str(tmp / "off"), "--model", str(checkpoint), "--max-pixels", str(MAX_PIXELS // 2))
    calls = pq.read_table(Path(off["partition"]) / "calls.parquet").to_pylist()
    assert off["rows"]["samples"] == 0 and off["untrainable_calls"] == 4
    assert "image 0 (1280x720) has 252 image tokens in the prompt where its grid gives" in calls[0]["untrainable"]
    assert "call 0 is in no sample: its image tokens do not match" in off["stderr"]
    # Without the checkpoint nothing can be checked: image calls are in no sample, and say why.
    unchecked = run_cli(tmp, str(tmp / "unchecked"))
    assert unchecked["rows"]["samples"] == 0 and unchecked["untrainable_calls"] == 4


def test_a_prompt_whose_image_tokens_miss_an_image_or_a_token_is_in_no_sample(checkpoint):
    grid = load_grid(str(checkpoint))
    ref = {"sha256": "a" * 64, "media_type": "image/png", "width": 1280, "height": 720}
    good = [1, *[IMAGE_PAD] * 252, 2]

    def call(index, prompt, images):
        return {"call_index": index, "status": "ok", "prompt_token_ids": prompt, "response_token_ids": [5],
                "response_logprobs": [-0.5], "images": images}

    built = build_samples([call(0, good, [ref]), call(1, good[:-2] + [2], [ref]), call(2, good + good, [ref]),
                           call(3, [1, 2], [ref]), call(4, [1, 2], None)], grid)
    assert [s.call_indices for s in built.samples] == [[0]]
    assert built.untrainable[1].endswith("has 251 image tokens in the prompt where its grid gives 252")
    assert built.untrainable[2].endswith("its prompt has 2 runs of image tokens for 1 images")
    assert built.untrainable[3].endswith("its prompt has 0 runs of image tokens for 1 images")
    assert built.untrainable[4].startswith("its images cannot be read back")


def test_a_checkpoint_without_its_preprocessor_config_is_named(tmp_path, checkpoint):
    (tmp_path / "config.json").write_text(json.dumps({"image_token_id": IMAGE_PAD}))
    with pytest.raises(ValueError, match="preprocessor_config.json does not exist"):
        load_grid(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert load_grid(str(tmp_path)) is None  # a text model: nothing to check


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_tiny_vision_models_own_configs_give_252_image_tokens_for_a_screenshot(tmp_path, family):
    """The checkpoint `steps.tiny_model --vision` writes (its config.json and its processor's saved config):
    the grid the trajectories step reads from it is the one the notes measured on vLLM (252 at its cap)."""
    from steps.tiny_model import build_tiny_model

    grid = load_grid(str(build_tiny_model(tmp_path / family, vision=family)))
    assert grid.tokens(1280, 720) == 252 and grid.tokens(720, 1280) == 252
    assert grid.image_token_id == json.loads((tmp_path / family / "config.json").read_text())["image_token_id"]
    assert load_grid(str(tmp_path / family), max_pixels=grid.max_pixels // 4).tokens(1280, 720) < 252
