"""The images of a call: found in the chat body the proxy sends vLLM, checked, and named by their bytes.

Every dialect translates its image parts into chat `image_url` parts holding a data URL (vLLM only ever
sees data URLs: the proxy fetches nothing, so a rollout stays off the internet and the image trained on
is the one the model saw). Each such part is an `ImagePart`, which remembers the field of the harness's
request it came from, so that every error about an image names that field. `place` applies the run's
image settings to the body (the limit per request; images of tool results moved into a user message
for a model whose chat template renders none in tool turns). `collect` gives a body's images in prompt order (the order
of its messages and their parts, which is the order vLLM expands them into image tokens), each named
by the SHA-256 of its decoded bytes: the store writes an image once under that name and a call keeps
only the names (steps.proxy.store), so a screenshot is not stored again with every later call.

An image is checked without being decoded: its size is read from its header (`header_size`), so one that
claims 50,000 x 50,000 pixels is refused (the run's `image_pixel_limit`) before anything, here or in vLLM,
would allocate its pixels; so are a request's images past `request_image_mb` bytes in all. PIL is not used
on this path at all, so its decompression-bomb error or warning can never reach a harness as a 500.
"""

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, replace

import msgspec

from steps.proxy.errors import ProxyError

_DATA_URL = re.compile(r"^data:(?P<type>image/[A-Za-z0-9.+-]+);base64,(?P<data>.*)$", re.S)
_DATA_URL_HEAD = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,")
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # what `header_size` reads and vLLM takes
_TOOL_PROBE_TEXT = "openforge-tool-text"
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


class ImagePart(dict):
    """A chat `image_url` part for vLLM that remembers the request field it came from and the string the
    request carried it as (`field`, `sent`: attributes, not keys, so vLLM is sent the dict alone)."""

    __slots__ = ("field", "sent")


def image_part(url, field: str) -> ImagePart:
    """The chat part for vLLM of an image sent as `url`; 400 naming `field` unless it is a base64 image data
    URL (only its head is read here: `collect` decodes the image).

    >>> image_part("data:image/png;base64,iVBO", "input.0.content.1.image_url")
    {'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,iVBO'}}
    >>> image_part("https://example.com/a.png", "f")
    Traceback (most recent call last):
    ...
    steps.proxy.errors.ProxyError: invalid request field 'f': an image must be a base64 data URL (data:image/png;base64,...); the proxy fetches no URL, so a remote image cannot be sent
    """
    if not isinstance(url, str) or _DATA_URL_HEAD.match(url) is None:
        raise ProxyError(400, f"invalid request field '{field}': an image must be a base64 data URL "
                              "(data:image/png;base64,...); the proxy fetches no URL, so a remote image cannot be "
                              "sent", param=field)
    part = ImagePart(type="image_url", image_url={"url": url})
    part.field, part.sent = field, url
    return part


def base64_part(media_type, data, field: str) -> ImagePart:
    """The chat part for vLLM of an image sent as base64 `data` of `media_type` (an Anthropic source); 400
    naming `field` if the type is not one of MEDIA_TYPES or the data is not a string."""
    if media_type not in MEDIA_TYPES:
        raise ProxyError(400, f"invalid request field '{field}.media_type': must be one of {', '.join(MEDIA_TYPES)}",
                         param=f"{field}.media_type")
    if not isinstance(data, str):
        raise ProxyError(400, f"invalid request field '{field}.data': must be a base64 string", param=f"{field}.data")
    part = image_part(f"data:{media_type};base64,{data}", field)
    part.sent = data  # the request holds the base64 alone: that is what a stored request's reference replaces
    return part


def from_data_url(url: str, field: str, pixel_limit: int = 0) -> Image:
    """The image a data URL holds; 400 naming `field` if it is not a base64 image data URL, not an image
    that can be read, or one of more than `pixel_limit` pixels (0: no limit)."""
    match = _DATA_URL.match(url) if isinstance(url, str) else None
    if match is None:
        raise ProxyError(400, f"invalid request field '{field}': an image must be a base64 data URL "
                              "(data:image/png;base64,...); the proxy fetches no URL", param=field)
    return from_base64(match["data"], match["type"], field, sent=url, pixel_limit=pixel_limit)


def from_base64(data: str, media_type: str, field: str, sent: str | None = None, pixel_limit: int = 0) -> Image:
    """The image `data` (base64) holds; 400 naming `field` if it is not base64 of a PNG, JPEG, GIF or WebP whose
    header can be read, or if that header declares more than `pixel_limit` pixels (0: no limit). Nothing beyond
    the header is read, so no image is decompressed here, whatever size it claims."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProxyError(400, f"invalid request field '{field}': the image is not valid base64", param=field) from None
    size = header_size(raw)
    if size is None:
        raise ProxyError(400, f"invalid request field '{field}': the data is not an image that can be read "
                              "(PNG, JPEG, GIF or WebP)", param=field)
    width, height = size
    if pixel_limit and width * height > pixel_limit:
        raise ProxyError(400, f"invalid request field '{field}': the image is {width}x{height} pixels, over the "
                              f"proxy's limit of {pixel_limit:,} pixels per image (image_pixel_limit)", param=field)
    return Image(hashlib.sha256(raw).hexdigest(), media_type, raw, width, height, data if sent is None else sent)


def header_size(raw: bytes) -> tuple[int, int] | None:
    r"""(width, height) as an image's header declares them, the size PIL opens it at, read without decoding
    anything: a PNG's IHDR, a JPEG's frame header, a GIF's screen grown to hold its first frame (as PIL grows
    it), a WebP's canvas or bitstream header. None if `raw` is none of these four, or its header is cut short
    or declares no pixels, or (a JPEG) declares two frames, which libjpeg refuses to decode.

    >>> header_size(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\xc3P\x00\x00\xc3P\x08\x02\x00\x00\x00")
    (50000, 50000)
    >>> header_size(b"GIF89a\x01\x00\x01\x00\x00\x00\x00,\x00\x00\x00\x00\xff\xff\xff\xff\x00\x02\x02D\x01\x00;")
    (65535, 65535)
    >>> header_size(b"BM:\x00\x00\x00\x00\x00\x00\x006\x00\x00\x00(\x00\x00\x00\x01\x00\x00\x00") is None  # a BMP
    True
    """
    try:
        if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR" and len(raw) >= 24:
            size = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
        elif raw.startswith(b"\xff\xd8"):
            size = _jpeg_size(raw)
        elif raw[:6] in (b"GIF87a", b"GIF89a"):
            size = _gif_size(raw)
        elif raw.startswith(b"RIFF") and raw[8:12] == b"WEBP" and len(raw) >= 30:
            size = _webp_size(raw[12:16], raw[20:30])
        else:
            return None
    except IndexError:  # the header is cut short
        return None
    return size if size is not None and min(size) > 0 else None


_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0-SOF15, less DHT, JPG and DAC
_JPEG_BARE = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}  # markers without a length: RSTn, TEM, SOI


def _jpeg_size(raw: bytes) -> tuple[int, int] | None:
    """The size in a JPEG's frame header; its segments are skipped by their lengths up to the first scan."""
    at, size = 2, None
    while True:
        if raw[at] != 0xFF:
            return None
        while raw[at + 1] == 0xFF:  # fill bytes before a marker
            at += 1
        marker = raw[at + 1]
        if marker == 0xDA:  # start of scan: the image data follows
            return size
        if marker in _JPEG_BARE:
            at += 2
            continue
        if marker in _JPEG_FRAMES:
            if size is not None:
                return None
            size = int.from_bytes(raw[at + 7:at + 9], "big"), int.from_bytes(raw[at + 5:at + 7], "big")
        at += 2 + int.from_bytes(raw[at + 2:at + 4], "big")


def _gif_size(raw: bytes) -> tuple[int, int] | None:
    """A GIF's logical screen, grown to hold its first frame; the extensions before that frame are skipped
    block by block."""
    width, height, flags = int.from_bytes(raw[6:8], "little"), int.from_bytes(raw[8:10], "little"), raw[10]
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # past the global colour table
    while raw[at] == 0x21:  # an extension: its label, then blocks of data up to an empty one
        at += 2
        while raw[at]:
            at += raw[at] + 1
        at += 1
    if raw[at] != 0x2C or len(raw) < at + 10:  # no (whole) image descriptor: no frame to show
        return None
    left, top = int.from_bytes(raw[at + 1:at + 3], "little"), int.from_bytes(raw[at + 3:at + 5], "little")
    frame = int.from_bytes(raw[at + 5:at + 7], "little"), int.from_bytes(raw[at + 7:at + 9], "little")
    return max(width, left + frame[0]), max(height, top + frame[1])


def _webp_size(chunk: bytes, head: bytes) -> tuple[int, int] | None:
    """A WebP's size from its first chunk: the extended format's canvas, else the lossy or lossless bitstream's."""
    if chunk == b"VP8X":
        return int.from_bytes(head[4:7], "little") + 1, int.from_bytes(head[7:10], "little") + 1
    if chunk == b"VP8 " and head[3:6] == b"\x9d\x01\x2a":
        return int.from_bytes(head[6:8], "little") & 0x3FFF, int.from_bytes(head[8:10], "little") & 0x3FFF
    if chunk == b"VP8L" and head[0] == 0x2F:
        bits = int.from_bytes(head[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def collect(messages, pixel_limit: int = 0, bytes_limit: int = 0) -> list[Image]:
    """The images of chat `messages` in prompt order; 400 naming the part of one that is not a readable base64
    data URL, that declares more than `pixel_limit` pixels, or whose bytes take the request's images past
    `bytes_limit` (0: no limit). Messages kept as raw JSON hold none: the chat dialect forwards them raw only
    when every content part is text (`chat.to_upstream`), so a text-only call is not read again here."""
    if isinstance(messages, msgspec.Raw):
        return []
    images, total = [], 0
    for i, message in enumerate(messages or []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                field = getattr(part, "field", f"messages.{i}.content.{j}.image_url.url")
                image = from_data_url(url, field, pixel_limit)
                total += len(image.data)
                if bytes_limit and total > bytes_limit:
                    raise ProxyError(400, f"invalid request field '{field}': with this image the request's images "
                                          f"come to {total:,} bytes, over the proxy's limit of {bytes_limit:,} bytes "
                                          f"of images per request (request_image_mb)", param=field)
                images.append(replace(image, sent=getattr(part, "sent", image.sent)))
    return images


def _parts(messages: list) -> list[tuple[int, int, dict]]:
    """(message index, part index, part) of every image part of chat messages, in prompt order."""
    return [(i, j, part) for i, message in enumerate(messages) if isinstance(message.get("content"), list)
            for j, part in enumerate(message["content"]) if isinstance(part, dict) and part.get("type") == "image_url"]


def place(messages: list, limit: int | None, tool_images: bool) -> list:
    """Chat messages with the run's image settings applied: 400 naming the first image over `limit` images per
    request (None: no limit of the proxy's; 0: the served model takes none); unless `tool_images` (the model's
    chat template renders images in tool turns), a tool result's images move out of its tool message into a
    user message right after that run of tool messages, in the same order.

    >>> tool = {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "shot"},
    ...         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}
    >>> place([tool], None, tool_images=False)
    [{'role': 'tool', 'tool_call_id': 'c', 'content': 'shot'}, {'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,AA=='}}]}]
    """
    found = _parts(messages)
    if limit is not None and len(found) > limit:
        i, j, part = found[limit]
        field = getattr(part, "field", f"messages.{i}.content.{j}")
        why = ("the served model takes no images (image_limit 0)" if limit == 0 else
               f"it is image {limit + 1} of this request, and the proxy takes at most {limit} per request (image_limit)")
        raise ProxyError(400, f"invalid request field '{field}': {why}", param=field)
    if tool_images or not any(messages[i]["role"] == "tool" for i, _, _ in found):
        return messages
    placed, moved = [], []
    for message in messages:
        if message["role"] != "tool" and moved:
            placed.append({"role": "user", "content": moved})
            moved = []
        if message["role"] == "tool" and isinstance(message.get("content"), list):
            content = message["content"]
            moved += [part for part in content if isinstance(part, dict) and part.get("type") == "image_url"]
            text = "".join(part if isinstance(part, str) else part.get("text") or "" for part in content
                           if not isinstance(part, dict) or part.get("type") != "image_url")
            message = {**message, "content": text}
        placed.append(message)
    if moved:
        placed.append({"role": "user", "content": moved})
    return placed


def renders_tool_images(template: str) -> bool:
    """Whether a chat template (Jinja text) renders an image part of a tool message: it is rendered once with a
    tool message holding an image and once without, and the two must differ. Decided once per model (the serve
    step passes the proxy `--tool-images` from it).

    >>> renders_tool_images("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
    ...     "{% for p in m.content %}{% if p.type == 'image' %}<img>{% else %}{{ p.text }}{% endif %}{% endfor %}"
    ...     "{% endif %}{% endfor %}")
    True
    >>> renders_tool_images("{% for m in messages %}{% if m.role == 'tool' %}{{ m.content[0].text }}"
    ...     "{% else %}{{ m.content }}{% endif %}{% endfor %}")
    False
    """
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def fail(message):
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    environment.globals["raise_exception"] = fail
    compiled = environment.from_string(template)
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": {}}}

    def render(parts: list) -> str:
        messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c0", "content": parts}]
        return compiled.render(messages=messages, tools=None, add_generation_prompt=True)

    text = {"type": "text", "text": _TOOL_PROBE_TEXT}
    try:
        return render([text, {"type": "image"}]) != render([text])
    except TemplateError:  # a template that refuses an image in a tool turn renders none there
        return False
