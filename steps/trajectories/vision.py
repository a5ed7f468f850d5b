"""Checking a call's image tokens against its images, with the served checkpoint's own configuration.

vLLM expands each image of a Qwen-VL prompt into one run of `image_token_id`, one id per merged patch of
the image as its processor resizes it (`smart_resize`): grid_t * grid_h * grid_w / merge^2 ids. A call
whose runs do not match its images one for one (another processor, a pixel cap the trainer does not know,
a record whose images are not the ones sent) would train on features misaligned with their tokens, so it
is trained on not at all: `mismatch` says why.
"""

import json
import math
from dataclasses import dataclass

import fsspec


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) Qwen's image processor resizes an image to: each a multiple of `factor`
    (patch x merge), the area within [min_pixels, max_pixels], the aspect ratio kept as closely as can be.
    (transformers' `smart_resize`, without the library: the trajectories step loads no image processor.)

    >>> smart_resize(720, 1280, 28, 4 * 28 * 28, 256 * 28 * 28)  # the tiny model's cap: 252 image tokens
    (336, 588)
    >>> smart_resize(720, 1280, 28, 56 * 56, 28 * 28 * 1280)     # Qwen2.5-VL's default cap
    (728, 1288)
    >>> smart_resize(10, 10, 28, 4 * 28 * 28, 256 * 28 * 28)      # too small: scaled up to min_pixels
    (56, 56)
    """
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image's aspect ratio must be under 200, got {width}x{height}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageGrid:
    """What a checkpoint's config.json and preprocessor_config.json say of its image tokens."""

    image_token_id: int
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    def tokens(self, width: int, height: int) -> int:
        """Image tokens of one image of that size: grid_h * grid_w / merge^2 (grid_t is 1 for an image).

        >>> ImageGrid(151655, 14, 2, 4 * 28 * 28, 256 * 28 * 28).tokens(1280, 720)
        252
        """
        h, w = smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
        return (h // self.patch_size) * (w // self.patch_size) // self.merge_size ** 2

    def mismatch(self, prompt: list[int], images: list[dict]) -> str | None:
        """Why the prompt's image-token runs do not match `images` (references, in prompt order), or None.

        >>> grid = ImageGrid(9, 14, 2, 4 * 28 * 28, 256 * 28 * 28)
        >>> grid.mismatch([1, 9, 9, 9, 9, 2], [{"width": 56, "height": 56}]), grid.mismatch([1, 2], [])
        (None, None)
        >>> grid.mismatch([1, 9, 9, 2], [{"width": 56, "height": 56}])
        'image 0 (56x56) has 2 image tokens in the prompt where its grid gives 4'
        """
        runs, at = [], None
        for i, token in enumerate(prompt):
            if token == self.image_token_id:
                if at is None:
                    at = i
            elif at is not None:
                runs.append(i - at)
                at = None
        if at is not None:
            runs.append(len(prompt) - at)
        if len(runs) != len(images):
            return f"its prompt has {len(runs)} runs of image tokens for {len(images)} images"
        for n, (run, image) in enumerate(zip(runs, images)):
            try:
                expected = self.tokens(image["width"], image["height"])
            except ValueError as exc:
                return f"image {n}: {exc}"
            if run != expected:
                return (f"image {n} ({image['width']}x{image['height']}) has {run} image tokens in the prompt "
                        f"where its grid gives {expected}")
        return None


def load_grid(model: str, max_pixels: int = 0) -> ImageGrid | None:
    """The image grid of the checkpoint at `model` (a folder or URL); None for a model without images (no
    `image_token_id`). `max_pixels` > 0: the cap serving gave the processor instead of the checkpoint's.
    Raises ValueError naming the file and field that cannot be read."""
    fs, root = fsspec.core.url_to_fs(model)
    config = _json(fs, f"{root.rstrip('/')}/config.json", model)
    token = config.get("image_token_id", config.get("image_token_index"))
    if token is None:
        return None
    pre = _json(fs, f"{root.rstrip('/')}/preprocessor_config.json", model)
    size = pre.get("size") or {}
    try:
        grid = ImageGrid(int(token), int(pre["patch_size"]), int(pre["merge_size"]),
                         int(pre.get("min_pixels") or size["shortest_edge"]),
                         int(max_pixels or pre.get("max_pixels") or size["longest_edge"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{model}/preprocessor_config.json lacks {exc} (patch_size, merge_size, and min_pixels/"
                         "max_pixels or size.shortest_edge/longest_edge are needed)") from None
    return grid


def _json(fs, path: str, model: str) -> dict:
    try:
        loaded = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: --model must be the served checkpoint's folder ({model})") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a JSON object")
    return loaded
