"""A sample's images for the update: the stored bytes become the features and mrope position ids the model saw.

For each sample that names images (the samples table's `images`: SHA-256 names in prompt order) the update
reads each image's bytes from the run's image folder (`steps.contracts.layout.images_url`), composites transparent
pixels on white (what vLLM does; PIL's `.convert("RGB")` does not), runs the checkpoint's own image processor
(its `preprocessor_config.json`) and checks that the sample's ids hold one image token per merged patch of each
image's grid: a sample whose tokens and features disagree is refused, never trained on misaligned features.
Its position ids are the model's own (veRL's layout, a (4, length) tensor: a text `arange` row, then the
model class's `get_rope_index` rows); with 1-D positions the trainer's logprobs on image tokens are wrong by
nats (`docs/update.md`, "Vision models").

The PIL image processor is called directly: the training environment has no torchvision, which transformers'
`AutoImageProcessor` wants.
"""

import hashlib
import io
import json
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from steps.update.batch import Sample, SampleError, describe

# An image name: the hex SHA-256 of its bytes (`steps.proxy.images`); nothing else is ever joined into a URL.
SHA256 = re.compile(r"[0-9a-f]{64}")
# Decoded size bounds: a stored image is a screenshot, not a decompression bomb.
MAX_IMAGE_BYTES = 64 * 1024 * 1024
MAX_IMAGE_PIXELS = 8192 * 8192


class ImageError(SampleError):
    """An image the update cannot use: the message names the sample and the image."""


@dataclass(frozen=True)
class VisionModel:
    """The checkpoint's image side: its image processor, its model config (which `get_rope_index` reads) and
    the model class's `get_rope_index`, bound as veRL binds it."""

    processor: Any
    rope: Any  # has .config and .get_rope_index(input_ids, mm_token_type_ids, image_grid_thw, ...)
    image_token_id: int
    merge_size: int


def load(checkpoint: Path, max_pixels: int = 0) -> VisionModel | None:
    """The checkpoint's `VisionModel`, or None when it is a text model (no `vision_config` or no
    `preprocessor_config.json`). `max_pixels` > 0: the pixel cap serving gave vLLM's image processor (the run
    config's `max_pixels`) instead of the checkpoint's, so that the grids are the ones vLLM made."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    processor_file = checkpoint / "preprocessor_config.json"
    try:
        vision_config = json.loads((checkpoint / "config.json").read_text()).get("vision_config")
    except (OSError, ValueError, AttributeError):
        return None  # `check_inputs` names an unreadable config.json
    if vision_config is None or not processor_file.is_file():
        return None
    config = AutoConfig.from_pretrained(checkpoint)
    name = json.loads(processor_file.read_text()).get("image_processor_type", "")
    # the PIL backend of the checkpoint's own class (the torchvision one needs a torchvision)
    kind = getattr(transformers, f"{name}Pil", None) or getattr(transformers, name, None)
    model_class = MODEL_MAPPING.get(type(config), None)
    if kind is None or not hasattr(model_class, "get_rope_index"):
        raise ImageError(f"--checkpoint {checkpoint}: image processor {name!r} of model type {config.model_type!r} "
                         "is not one the update can train on (it needs a transformers image processor and mrope "
                         "position ids, as the Qwen-VL models have)")
    rope = types.SimpleNamespace(config=config)
    rope.get_rope_index = types.MethodType(model_class.get_rope_index, rope)
    if hasattr(model_class, "get_vision_position_ids"):
        rope.get_vision_position_ids = types.MethodType(model_class.get_vision_position_ids, rope)
    processor = kind.from_pretrained(checkpoint)
    if max_pixels:
        size = {"shortest_edge": processor.size["shortest_edge"], "longest_edge": max_pixels}
        processor = kind.from_pretrained(checkpoint, size=size)
    return VisionModel(processor=processor, rope=rope, image_token_id=int(config.image_token_id),
                       merge_size=int(processor.merge_size))


def read_image(images_url: str, name: str, where: str) -> bytes:
    """The bytes of the image `name` (its SHA-256) in `images_url`, checked against the name."""
    import fsspec

    if not isinstance(name, str) or not SHA256.fullmatch(name):
        raise ImageError(f"{where}: image name {name!r} is not a SHA-256 (64 lowercase hex digits)")
    url = f"{images_url.rstrip('/')}/{name}"
    try:
        with fsspec.open(url, "rb") as handle:
            data = handle.read(MAX_IMAGE_BYTES + 1)
    except OSError as error:
        raise ImageError(f"{where}: cannot read image {name} at {url} ({type(error).__name__})") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"{where}: image {name} is over {MAX_IMAGE_BYTES // 2**20} MiB")
    if hashlib.sha256(data).hexdigest() != name:
        raise ImageError(f"{where}: image {name}'s bytes at {url} do not have that SHA-256")
    return data


def on_white(data: bytes, where: str = "image"):
    """The decoded image in RGB, transparent pixels composited on white as vLLM composites them.

    >>> from PIL import Image
    >>> clear = io.BytesIO(); Image.new("RGBA", (2, 1), (0, 0, 0, 0)).save(clear, "PNG")
    >>> on_white(clear.getvalue()).getpixel((0, 0)), Image.open(clear).convert("RGB").getpixel((0, 0))
    ((255, 255, 255), (0, 0, 0))
    """
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_IMAGE_PIXELS:
            raise ImageError(f"{where}: {image.width}x{image.height} pixels is over {MAX_IMAGE_PIXELS} pixels")
        image.load()
    except (OSError, Image.DecompressionBombError, ValueError) as error:
        if isinstance(error, ImageError):
            raise
        raise ImageError(f"{where}: not a decodable image ({error})") from None
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def image_tokens(grid: torch.Tensor, merge_size: int) -> list[int]:
    """The image tokens each image of these grids takes in a prompt: one per merged patch.

    >>> image_tokens(torch.tensor([[1, 36, 28], [1, 4, 4]]), 2)
    [252, 4]
    """
    return [int(count) // merge_size**2 for count in grid.prod(-1)]


def image_runs(ids: list[int], image_token_id: int) -> list[int]:
    """The lengths of the runs of image tokens in `ids`, in order: one run per image.

    >>> image_runs([1, 9, 9, 2, 9, 3], 9)
    [2, 1]
    """
    runs, previous = [], None
    for token in ids:
        if token == image_token_id:
            if previous == image_token_id:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = token
    return runs


def text_position_ids(length: int) -> torch.Tensor:
    """A text sample's (4, length) positions in a vision model's batch: `arange` in every row (what
    `get_rope_index` gives a sequence without images)."""
    return torch.arange(length).expand(4, length).clone()


def position_ids(model: VisionModel, ids: list[int], grid: torch.Tensor) -> torch.Tensor:
    """veRL's (4, length) position ids of a sample with images: the text `arange` row, then the model class's
    `get_rope_index` rows (temporal, height, width)."""
    input_ids = torch.tensor([ids])
    token_type = (input_ids == model.image_token_id).int()
    rope, _ = model.rope.get_rope_index(input_ids=input_ids, mm_token_type_ids=token_type, image_grid_thw=grid,
                                        attention_mask=torch.ones_like(input_ids))
    return torch.cat([torch.arange(len(ids))[None], rope[:, 0]], dim=0)


def sample_inputs(model: VisionModel, ids: list[int], images: list[bytes], where: str) -> tuple[dict, torch.Tensor]:
    """A sample's `multi_modal_inputs` (pixel_values, image_grid_thw) and (4, length) position ids, from its
    ids (prompt then response) and its images' bytes in prompt order; an `ImageError` when the ids do not
    hold one image token per merged patch of the images' grids."""
    pictures = [on_white(data, f"{where} image {number}") for number, data in enumerate(images)]
    features = model.processor(images=pictures, return_tensors="pt")
    grid = features["image_grid_thw"]
    wanted, held = image_tokens(grid, model.merge_size), image_runs(ids, model.image_token_id)
    if held != wanted:
        raise ImageError(f"{where}: its token ids hold image token runs of {held} but its {len(images)} image(s) "
                         f"make {wanted} (grids {grid.tolist()}, merge {model.merge_size}); the update trains only "
                         "on samples whose image tokens match their images")
    inputs = {"pixel_values": features["pixel_values"], "image_grid_thw": grid}
    return inputs, position_ids(model, ids, grid)


def batch_inputs(samples: list[Sample], checkpoint: Path, images_url: str | None, max_pixels: int = 0) -> list | None:
    """Each sample's (`multi_modal_inputs`, (4, length) position ids) for a vision checkpoint ({} and `arange`
    rows for a text sample), its images gridded at `max_pixels` where serving set it (`load`); None for a text
    checkpoint, whose batch stays as it was. Refuses (an `ImageError`) a sample with images that a text
    checkpoint or a missing image folder cannot train on."""
    with_images = next((sample for sample in samples if sample.images), None)
    model = load(checkpoint, max_pixels)
    if with_images is not None and model is None:
        raise ImageError(f"{describe(with_images)} has images but --checkpoint {checkpoint} is a text model (no "
                         "vision_config or preprocessor_config.json); train it on a vision-language checkpoint")
    if with_images is not None and not images_url:
        raise ImageError(f"{describe(with_images)} has images but no image folder was given; pass --images "
                         "(the run's calls/images, steps.contracts.layout.images_url)")
    if model is None:
        return None
    out = []
    for sample in samples:
        ids = sample.prompt_token_ids + sample.response_token_ids
        if not sample.images:
            if model.image_token_id in ids:
                raise ImageError(f"{describe(sample)}: its token ids hold image tokens but it names no images; "
                                 "the update trains only on samples whose image tokens match their images")
            out.append(({}, text_position_ids(len(ids))))
            continue
        where = describe(sample)
        data = [read_image(images_url, name, where) for name in sample.images]
        out.append(sample_inputs(model, ids, data, where))
    return out


def patch_text_only_batches() -> None:
    """Lets veRL train a vision checkpoint on a micro-batch without images (a first call before any screenshot,
    a rank's filler rows).

    veRL 0.9.1 sends such a micro-batch's placeholder image through the vision tower (so that every rank's tower
    takes part in the backward pass) and takes `.mean()` of what the tower returns; transformers >= 5 returns an
    output object there, so the update failed. This wraps veRL's embedding step (Qwen2-VL and Qwen2.5-VL) so that
    on such a micro-batch the tower's output is unpacked to its tensor first, as veRL does for real images."""
    from verl.models.transformers import qwen2_vl
    from verl.utils.transformers_compat import unpack_visual_output

    original = qwen2_vl._get_input_embeds
    if getattr(original, "text_only_unpacked", False):
        return

    def get_input_embeds(model, input_ids, attention_mask=None, pixel_values=None, pixel_values_videos=None, *args, **kwargs):
        if pixel_values is not None or pixel_values_videos is not None:
            return original(model, input_ids, attention_mask, pixel_values, pixel_values_videos, *args, **kwargs)
        visual, own = model.visual, model.visual.__dict__.get("forward")
        forward = visual.forward
        visual.forward = lambda *args, **kw: unpack_visual_output(forward(*args, **kw))[0]
        try:
            return original(model, input_ids, attention_mask, pixel_values, pixel_values_videos, *args, **kwargs)
        finally:
            if own is None:
                del visual.forward
            else:
                visual.forward = own

    get_input_embeds.text_only_unpacked, get_input_embeds.original = True, original
    qwen2_vl._get_input_embeds = get_input_embeds
