"""The images of a call: found in the chat body the proxy sends vLLM, checked, and named by their bytes.

Every dialect translates its image parts into chat `image_url` parts holding a data URL (vLLM only ever
sees data URLs: the proxy fetches nothing). `collect` gives a body's images in prompt order (the order
of its messages and their parts, which is the order vLLM expands them into image tokens), each named
by the SHA-256 of its decoded bytes: the store writes an image once under that name and a call keeps
only the names (steps.proxy.store), so a screenshot is not stored again with every later call.
"""

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass

import msgspec

from steps.proxy.errors import ProxyError

_DATA_URL = re.compile(r"^data:(?P<type>image/[A-Za-z0-9.+-]+);base64,(?P<data>.*)$", re.S)
REFERENCE_PREFIX = "openforge-image:sha256:"  # what a stored request holds where it sent an image's bytes


@dataclass(frozen=True)
class Image:
    """One image of a call: its name (SHA-256 of `data`, hex), type, decoded bytes, pixel size, and the
    string the request carried it as (a data URL, or the base64 of an Anthropic source)."""

    sha256: str
    media_type: str
    data: bytes
    width: int
    height: int
    sent: str

    def reference(self) -> dict:
        """What a stored call keeps of the image, in prompt order."""
        return {"sha256": self.sha256, "media_type": self.media_type, "width": self.width, "height": self.height}


def from_data_url(url: str, field: str) -> Image:
    """The image a data URL holds; 400 naming `field` if it is not a base64 image data URL or not an image
    that can be read."""
    match = _DATA_URL.match(url) if isinstance(url, str) else None
    if match is None:
        raise ProxyError(400, f"invalid request field '{field}': an image must be a base64 data URL "
                              "(data:image/png;base64,...); the proxy fetches no URL", param=field)
    return from_base64(match["data"], match["type"], field, sent=url)


def from_base64(data: str, media_type: str, field: str, sent: str | None = None) -> Image:
    """The image `data` (base64) holds; 400 naming `field` if it is not base64 of an image PIL can read."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProxyError(400, f"invalid request field '{field}': the image is not valid base64", param=field) from None
    width, height = _size(raw, field)
    return Image(hashlib.sha256(raw).hexdigest(), media_type, raw, width, height, data if sent is None else sent)


def _size(raw: bytes, field: str) -> tuple[int, int]:
    from PIL import Image as PILImage, UnidentifiedImageError  # the serving image has Pillow (vLLM needs it)

    try:
        with PILImage.open(io.BytesIO(raw)) as image:  # reads the header only
            return image.size
    except (UnidentifiedImageError, OSError, ValueError):
        raise ProxyError(400, f"invalid request field '{field}': the data is not an image that can be read "
                              "(PNG, JPEG, GIF or WebP)", param=field) from None


def collect(messages) -> list[Image]:
    """The images of chat `messages` (a list of dicts, or raw JSON as the chat dialect forwards them) in
    prompt order; 400 naming the part of one that is not a readable base64 data URL."""
    if isinstance(messages, msgspec.Raw):
        if b"image_url" not in bytes(messages):
            return []
        messages = msgspec.json.decode(messages)
    images = []
    for i, message in enumerate(messages or []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, msgspec.Raw):
            content = msgspec.json.decode(content)
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                images.append(from_data_url(url, f"messages.{i}.content.{j}.image_url.url"))
    return images
