"""Checks /app/photos after renaming: exact file names, contents unchanged."""

import sys
import traceback
from pathlib import Path

PHOTOS = Path("/app/photos")
EXPECTED = {  # name after renaming -> original name (whose contents it must keep)
    "photo-0001.jpg": "IMG_0001.JPG",
    "photo-0002.jpg": "IMG_0002.jpeg",
    "photo-0013.jpg": "IMG_0013.jpg",
    "photo-0100.jpg": "IMG_0100.JPEG",
    "IMG_backup.txt": "IMG_backup.txt",
    "notes.txt": "notes.txt",
    "IMG_0007.png": "IMG_0007.png",
    "img_0005.jpg": "img_0005.jpg",
    "IMG_0042 copy.jpg": "IMG_0042 copy.jpg",
}


def check() -> None:
    names = sorted(p.name for p in PHOTOS.iterdir())
    assert names == sorted(EXPECTED), f"expected files {sorted(EXPECTED)}, found {names}"
    for name, original in EXPECTED.items():
        text = (PHOTOS / name).read_text()
        assert text == f"contents of {original}\n", f"{name} does not hold the contents of {original}"


def main() -> int:
    try:
        check()
    except (AssertionError, OSError, ValueError) as failure:
        print(f"FAIL: {failure}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in this checker: exit 3, so no reward is written
        traceback.print_exc()
        return 3
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
