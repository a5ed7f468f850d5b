"""The screenshots a harness sent, on its rollout's page: each copied once from the run's image store into the
report, and shown only as an image, only when its bytes are one.

    assets/images/<sha256>.<png|jpg|gif|webp>     one file per image, whatever number of pages show it

An image's bytes are the agent's, so they are treated as hostile: the store's name for them is checked against
them (its SHA-256, `steps.proxy.image_store.ImageStore.read`), the file's extension (and, in S3, its content
type) comes from the magic bytes of a PNG, JPEG, GIF or WebP whose header can be read (the proxy's own
`header_size`), never from the record's `media_type`, and its file name from the checked SHA-256 alone. Anything
else (an SVG, HTML, a name the store lacks) is named on the page as text, never copied nor linked. A page shows
at most `MAX_INLINE_IMAGES` thumbnails of at most `MAX_INLINE_BYTES` and `MAX_INLINE_PIXELS` each and
`MAX_PAGE_IMAGE_BYTES` in all; every other image is a link, loaded only when followed.
"""

import re
from dataclasses import dataclass

from steps.proxy.image_store import ImageStore, ImageUnreadable
from steps.proxy.images import header_size

FOLDER = "assets/images"  # in the report's site
MAX_INLINE_IMAGES = 50  # thumbnails on one page (distinct images); the rest are linked
MAX_INLINE_BYTES = 2_000_000  # of one image shown as a thumbnail (a 1280x720 screenshot is ~50-500 KB)
MAX_INLINE_PIXELS = 4096 * 4096  # of one image shown as a thumbnail (the browser decodes every pixel)
MAX_PAGE_IMAGE_BYTES = 25_000_000  # of one page's thumbnails in all
_SHA256 = re.compile(r"[0-9a-f]{64}")


def image_format(raw: bytes) -> tuple[str, str, int, int] | None:
    r"""(extension, content type, width, height) of an image by its magic bytes, when it is a PNG, JPEG, GIF or WebP
    whose header can be read; None for anything else (an SVG, HTML, a truncated header).

    >>> image_format(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x02\x00\x00\x00\x01\x08\x02\x00\x00\x00")
    ('png', 'image/png', 2, 1)
    >>> image_format(b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>') is None
    True
    >>> image_format(b"\x89PNG\r\n\x1a\n<html>") is None  # the magic alone is not enough
    True
    """
    size = header_size(raw)
    if size is None:
        return None
    if raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png", "image/png", *size
    if raw.startswith(b"\xff\xd8"):
        return "jpg", "image/jpeg", *size
    if raw[:6] in (b"GIF87a", b"GIF89a"):
        return "gif", "image/gif", *size
    return "webp", "image/webp", *size  # header_size reads no other format


@dataclass(frozen=True)
class Shot:
    """One image as the report has it: its path in the site (None when it is not shown: `problem` says why, as what
    follows "image <name>"), its size in pixels and bytes."""

    name: str
    path: str | None
    width: int = 0
    height: int = 0
    size: int = 0
    problem: str | None = None


class ReportImages:
    """Copies images from the run's image store (`images_url`, `steps.contracts.layout.images_url`) into the site,
    each once per report: the folder is listed once, an image already there is not written again, and each image
    is read (and hashed) at most once per report."""

    def __init__(self, site, images_url: str):
        self.site, self.images_url = site, images_url
        self._store: ImageStore | None = None
        self._shots: dict[str, Shot] = {}
        self._present: set[str] | None = None

    def shot(self, name: str) -> Shot:
        """The image named `name` (a SHA-256) in the site, copied there the first time it is asked for."""
        if name not in self._shots:
            self._shots[name] = self._copy(name)
        return self._shots[name]

    def _copy(self, name: str) -> Shot:
        if not _SHA256.fullmatch(name):
            return Shot(name, None, problem="is named by no SHA-256: not read")
        if self._store is None:
            self._store = ImageStore.reader(self.images_url, cache_bytes=0)  # each image is read once here anyway
        try:
            raw = self._store.read(name)
        except ImageUnreadable as exc:  # "image <name> is not in the store (<path>)", or stored with other bytes
            return Shot(name, None, problem=str(exc).removeprefix(f"image {name} "))
        except OSError as exc:
            return Shot(name, None, problem=f"cannot be read from the store ({exc})")
        found = image_format(raw)
        if found is None:
            return Shot(name, None, size=len(raw), problem="is not a PNG, JPEG, GIF or WebP image: not shown")
        extension, content_type, width, height = found
        path = f"{FOLDER}/{name}.{extension}"
        if self._present is None:
            self._present = self.site.listing(FOLDER)
        if path not in self._present:
            self.site.write_bytes(path, raw, content_type)
            self._present.add(path)
        return Shot(name, path, width, height, len(raw))


class PageImages:
    """One page's share of the report's images: which are thumbnails (the first `MAX_INLINE_IMAGES` distinct ones
    within the byte and pixel bounds) and which only links."""

    def __init__(self, images: ReportImages | None):
        self.images, self.inline, self.inline_bytes = images, set(), 0

    def place(self, name: str) -> tuple[Shot | None, str | None]:
        """The image and, when it is a link rather than a thumbnail, why (None: a thumbnail)."""
        if self.images is None:
            return None, None
        shot = self.images.shot(name)
        if shot.path is None or name in self.inline:
            return shot, None
        if shot.size > MAX_INLINE_BYTES or shot.width * shot.height > MAX_INLINE_PIXELS:
            return shot, f"over {MAX_INLINE_BYTES // 10**6} MB or {MAX_INLINE_PIXELS:,} pixels"
        if len(self.inline) >= MAX_INLINE_IMAGES or self.inline_bytes + shot.size > MAX_PAGE_IMAGE_BYTES:
            return shot, f"past the page's {MAX_INLINE_IMAGES} images or {MAX_PAGE_IMAGE_BYTES // 10**6} MB shown"
        self.inline.add(name)
        self.inline_bytes += shot.size
        return shot, None
