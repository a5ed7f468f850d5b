"""Wheels rebuilt offline from the distributions installed in this Python, for tasks that `pip install`.

Real Harbor tasks install their test tools in the Dockerfile (`RUN pip3 install --break-system-packages
pytest`). Tests may download nothing, so a sandbox build is pointed at a folder of wheels instead
(`OPENFORGE_BUILD_WHEELS=DIR`: pip then installs with `--no-index --find-links DIR`), and this module
fills that folder from what is already installed here.

A wheel is a zip of a distribution's files, as its installed `RECORD` lists them, plus its
`.dist-info` folder with a `RECORD` rewritten to match (PEP 427). `repack_wheel` rebuilds one from the
installed files; `build_wheels` does it for some requirements and everything they require on this
interpreter. Only pure-Python distributions (tag `py3-none-any`) are repacked, since the sandbox's
python is the host's `/usr/bin/python3`, not necessarily this one. Console scripts (`../../bin/...` in
`RECORD`) and byte code are left out: pip writes both anew from `entry_points.txt` and the sources.
The zip entries carry a fixed date, so the same installed files always give the same wheel bytes.

    from tests.offline_packages import build_wheels
    build_wheels(["pytest"], Path("/tmp/wheels"))   # pytest, iniconfig, packaging, pluggy, pygments
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import zipfile
from collections.abc import Iterable
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# Installer bookkeeping, not part of a wheel (pip writes INSTALLER, REQUESTED and direct_url.json itself).
SKIPPED_METADATA = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold: the bytes never depend on when


class WheelError(RuntimeError):
    """A distribution cannot be repacked as a wheel; the message names it and why."""


def build_wheels(requirements: Iterable[str], out_dir: Path) -> list[Path]:
    """Repack each requirement and its dependencies (markers evaluated here, extras ignored) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pending = [Requirement(text) for text in requirements]
    done: dict[str, Path] = {}
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in done:
            continue
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError:
            raise WheelError(f"{requirement.name} is not installed in this Python, so it cannot be repacked") from None
        done[name] = repack_wheel(dist, out_dir)
        for text in dist.requires or []:
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                pending.append(needed)
    return sorted(done.values())


def repack_wheel(dist: Distribution, out_dir: Path) -> Path:
    """Write `dist` as `NAME-VERSION-py3-none-any.whl` into `out_dir`; return the wheel's path."""
    name = dist.metadata["Name"]
    wheel_info = dist.read_text("WHEEL") or ""
    if "Root-Is-Purelib: true" not in wheel_info or "Tag: py3-none-any" not in wheel_info:
        raise WheelError(f"{name} is not a pure-Python (py3-none-any) distribution, so it cannot be repacked")
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        raise WheelError(f"{name} is an editable install: its files are a source folder, not a wheel's")
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{dist.version}"
    info_dir = next(str(path).split("/")[0] for path in dist.files if str(path).split("/")[0].endswith(".dist-info"))
    wheel_path = out_dir / f"{stem}-py3-none-any.whl"
    records: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for relative in sorted(str(path) for path in dist.files):
            if not _belongs_in_wheel(relative, info_dir):
                continue
            data = Path(dist.locate_file(relative)).read_bytes()
            _write(wheel, relative, data)
            records.append((relative, _record_hash(data), str(len(data))))
        records.append((f"{info_dir}/RECORD", "", ""))
        listing = io.StringIO()
        csv.writer(listing, lineterminator="\n").writerows(records)
        _write(wheel, f"{info_dir}/RECORD", listing.getvalue().encode())
    return wheel_path


def _belongs_in_wheel(relative: str, info_dir: str) -> bool:
    """Whether an installed file goes into the wheel: not a script outside site-packages, byte code, or bookkeeping."""
    if relative.startswith("../") or "__pycache__/" in relative or relative.endswith(".pyc"):
        return False
    folder, _, filename = relative.rpartition("/")
    return not (folder == info_dir and filename in SKIPPED_METADATA)


def _write(wheel: zipfile.ZipFile, name: str, data: bytes) -> None:
    entry = zipfile.ZipInfo(name, date_time=ZIP_DATE)
    entry.external_attr = 0o644 << 16
    entry.compress_type = zipfile.ZIP_DEFLATED
    wheel.writestr(entry, data)


def _record_hash(data: bytes) -> str:
    """A RECORD hash: `sha256=` and the urlsafe base64 digest without padding (PEP 376 / 427)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"
