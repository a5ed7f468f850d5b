"""Images that would blow up whoever decodes them are refused with a 400 naming the limit, in every dialect
(docs/proxy.md, "Images"), never a 500, and nothing of the call goes upstream or into the store.

The bombs are built here: headers that claim 50,000 x 50,000 pixels (and 20,000 x 20,000) of PNG, a 65,535 x
65,535 GIF frame, a 60,000 x 60,000 JPEG, a 16,384 x 16,384 WebP canvas, each with almost no data, and a real
12,000 x 12,000 PNG of one colour (144 megapixels, ~150 KB). PIL's own check raises DecompressionBombError on the
first ones and only warns on the last: the control that shows each is a bomb to a decoder, which is what
reached harnesses as `500 internal proxy error (DecompressionBombError)` before. The proxy reads an image's
size from its header and never opens it with PIL. The proxy is the real process in front of the scripted vLLM
double (tests/scripted_model.py), which keeps every body it is sent.
"""

import io
import json
import secrets
import struct
import subprocess
import sys
import zlib

import pytest
from PIL import Image as PILImage

from steps.proxy.images import header_size
from test_dialect_images import BODIES, error_text, png, send


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims `width` x `height` (RGB), with one tiny IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + _chunk(b"IEND", b""))


def gif_bomb(width: int, height: int) -> bytes:
    """A GIF with a 1 x 1 screen and one `width` x `height` frame (PIL grows the screen to it) of almost no data."""
    return (b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0, 0, 0) + b"," + struct.pack("<HHHHB", 0, 0, width, height, 0)
            + b"\x02\x02D\x01\x00;")


def jpeg_bomb(width: int, height: int) -> bytes:
    """A baseline JPEG frame header of `width` x `height` and three components, then a scan of 16 bytes."""
    frame = struct.pack(">BHHB", 8, height, width, 3) + b"".join(bytes([i, 0x11, 0]) for i in (1, 2, 3))
    scan = bytes([3]) + b"".join(bytes([i, 0]) for i in (1, 2, 3)) + bytes([0, 63, 0])
    return (b"\xff\xd8\xff\xc0" + struct.pack(">H", len(frame) + 2) + frame + b"\xff\xda" + struct.pack(">H", len(scan) + 2)
            + scan + b"\x00" * 16 + b"\xff\xd9")


def webp_bomb(width: int, height: int) -> bytes:
    """An extended WebP whose canvas is `width` x `height`, with no image in it."""
    canvas = bytes([0x10, 0, 0, 0]) + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = b"WEBP" + b"VP8X" + struct.pack("<I", len(canvas)) + canvas
    return b"RIFF" + struct.pack("<I", len(body)) + body


def one_colour_png(width: int, height: int) -> bytes:
    """A real PNG of one colour: decoding it allocates every pixel, though its file is small."""
    out = io.BytesIO()
    PILImage.new("L", (width, height), 200).save(out, format="PNG")
    return out.getvalue()


BOMBS = {"png-50k": lambda: png_bomb(50_000, 50_000), "png-20k": lambda: png_bomb(20_000, 20_000),
         "gif-65k": lambda: gif_bomb(65_535, 65_535), "jpeg-60k": lambda: jpeg_bomb(60_000, 60_000),
         "webp-16k": lambda: webp_bomb(16_384, 16_384)}
SIZES = {"png-50k": (50_000, 50_000), "png-20k": (20_000, 20_000), "gif-65k": (65_535, 65_535),
         "jpeg-60k": (60_000, 60_000), "webp-16k": (16_384, 16_384), "png-144mp": (12_000, 12_000)}
# Where the tool result's image is in each dialect's body (test_dialect_images.BODIES): the field the 400 names.
RESULT_FIELDS = {"chat": "messages.3.content.1.image_url.url", "responses": "input.2.output.1.image_url",
                 "messages": "messages.2.content.0.content.1.source"}


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {**{name: make() for name, make in BOMBS.items()}, "png-144mp": one_colour_png(12_000, 12_000)}


@pytest.fixture(scope="module")
def proxies(proxy, scripted):
    """The proxy with the run's defaults (40,000,000 pixels, 32 MiB of images per request), one without a pixel
    limit (the control), and one that takes 1 MiB of images per request."""
    return {"default": proxy(scripted.url), "unlimited": proxy(scripted.url, extra=["--image-pixel-limit", "0"]),
            "small": proxy(scripted.url, extra=["--request-image-mb", "1"])}


def test_each_bomb_is_one_to_pil(bombs):
    """The control: PIL's own check refuses each crafted bomb with an error, and warns on 144 megapixels."""
    for name in BOMBS:
        with pytest.raises(PILImage.DecompressionBombError):
            PILImage.open(io.BytesIO(bombs[name]))
    with pytest.warns(PILImage.DecompressionBombWarning):
        PILImage.open(io.BytesIO(bombs["png-144mp"])).close()


@pytest.mark.parametrize("dialect", list(BODIES))
@pytest.mark.parametrize("bomb", list(SIZES))
def test_an_image_bomb_is_a_400_naming_the_pixel_limit_in_every_dialect(proxies, scripted, bombs, dialect, bomb):
    scripted.set_commands(["echo ok"])
    before = len(scripted.exchanges)
    status, answer = send(proxies["default"], dialect, BODIES[dialect](png((1, 2, 3)), bombs[bomb]))
    width, height = SIZES[bomb]
    message = error_text(answer)
    assert status == 400, answer
    assert (f"'{RESULT_FIELDS[dialect]}'" in message and f"{width}x{height} pixels" in message
            and "40,000,000 pixels per image (image_pixel_limit)" in message), message
    if dialect == "messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    else:
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == RESULT_FIELDS[dialect]
    assert len(scripted.exchanges) == before  # nothing went upstream (and no index was taken: see below)


@pytest.mark.parametrize("dialect", list(BODIES))
def test_without_the_pixel_limit_the_same_bombs_go_upstream(proxies, scripted, bombs, dialect):
    """The control of the test above: the limit, not a failure to read them, refuses the bombs. (Sent on, a bomb
    would reach vLLM's decoder: which is why the limit is on by default.)"""
    scripted.set_commands(["echo ok"])
    for bomb in SIZES:
        before = len(scripted.exchanges)
        assert send(proxies["unlimited"], dialect, BODIES[dialect](png((1, 2, 3)), bombs[bomb]))[0] == 200, bomb
        assert len(scripted.exchanges) == before + 1


def test_a_refused_bomb_takes_no_index_and_stores_nothing(proxies, bombs):
    served = proxies["default"]
    assert send(served, "chat", BODIES["chat"](None, bombs["png-50k"]), rollout="bombed")[0] == 400
    assert served.calls("bombed") == []
    assert "Traceback" not in served.log_tail(200) and "DecompressionBomb" not in served.log_tail(200)


@pytest.mark.parametrize("dialect", list(BODIES))
def test_images_past_the_bytes_of_a_request_are_a_400_naming_the_limit(proxies, dialect):
    """1 MiB of images per request: two different 540 KB images are refused at the second, naming it; one of
    them alone (the control) is answered."""
    first, second = noise(), noise()
    assert len(first) + len(second) > 1 << 20 > len(first)
    status, answer = send(proxies["small"], dialect, BODIES[dialect](first, second))
    message = error_text(answer)
    assert status == 400 and f"'{RESULT_FIELDS[dialect]}'" in message, answer
    assert "1,048,576 bytes of images per request (request_image_mb)" in message, message
    assert send(proxies["small"], dialect, BODIES[dialect](first, None))[0] == 200


def noise(side: int = 735) -> bytes:
    """A PNG of random grey pixels (~540 KB: PNG cannot compress noise; one is still within the scripted model's
    context, which counts a token per 3 bytes of its data URL)."""
    out = io.BytesIO()
    PILImage.frombytes("L", (side, side), secrets.token_bytes(side * side)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("fmt, options", [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("GIF", {}),
                                          ("WEBP", {}), ("WEBP", {"lossless": True}), ("WEBP", {"save_all": True})])
def test_the_size_read_from_a_header_is_the_one_pil_opens_the_image_at(fmt, options):
    for width, height in ((1, 1), (37, 21), (1280, 720), (300, 2000)):
        out = io.BytesIO()
        mode = "RGBA" if fmt in ("PNG", "WEBP") else "RGB"
        PILImage.new(mode, (width, height), (10, 20, 30, 40)[:len(mode)]).save(out, format=fmt, **options)
        with PILImage.open(io.BytesIO(out.getvalue())) as opened:
            assert header_size(out.getvalue()) == opened.size == (width, height)
        assert header_size(out.getvalue()[:12]) is None  # control: a header cut short is not an image


CHECK_IN_A_FRESH_PROCESS = """
import json, sys
from steps.proxy import chat, images, messages, responses
from steps.proxy.errors import ProxyError
from steps.proxy.protocol import decode
bodies = json.loads(sys.stdin.read())
for dialect, module in (("chat", chat), ("responses", responses), ("messages", messages)):
    for name, body in bodies[dialect].items():
        req, raw = decode(json.dumps(body).encode(), module.Request, fields=module.RAW_FIELDS)
        try:
            found = images.collect(module.to_upstream(req, raw).get("messages"), 40_000_000, 32 << 20)
            assert name == "good" and len(found) == 2, name
        except ProxyError as err:
            assert err.status == 400 and "image_pixel_limit" in err.message and name != "good", (name, err)
print("PIL" in sys.modules)
import PIL.Image
print("PIL" in sys.modules)
"""


def test_the_image_path_never_imports_pil(bombs):
    """Every dialect's request path, run on the bombs and on good images in a fresh process with every warning
    an error, checks them all without importing PIL, so no PIL error or warning can reach a harness. Control:
    the same process does see PIL once it imports it."""
    bodies = {dialect: {**{name: BODIES[dialect](png((1, 2, 3)), data) for name, data in bombs.items()},
                        "good": BODIES[dialect](png((1, 2, 3)), png((4, 5, 6)))} for dialect in BODIES}
    done = subprocess.run([sys.executable, "-W", "error", "-c", CHECK_IN_A_FRESH_PROCESS], input=json.dumps(bodies),
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], done.stderr[-3000:]
