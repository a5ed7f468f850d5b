"""No file of the repository points at a file outside it (a style guide, notes or a folder kept beside a
checkout): a clone does not have them, so such a pointer tells its reader nothing. Say the rule or the fact itself."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A note or style file beside the checkout, by the names they have had; this file spells them, so it is left out.
OUTSIDE = re.compile(r"(\.\./|\b)shared/(notes|hooks)\b|\bSTYLE\.md\b|\bstyle file\b", re.IGNORECASE)


def outside_references(paths: list[Path], root: Path) -> list[str]:
    """`file:line: text` for each line of the text files among `paths` that points outside the repository."""
    found = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, FileNotFoundError):  # images, and files deleted but not yet committed
            continue
        found += [f"{path.relative_to(root)}:{number}: {line.strip()}" for number, line in enumerate(lines, 1)
                  if OUTSIDE.search(line)]
    return found


def test_no_file_refers_to_a_file_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    paths = [REPO / name for name in tracked if REPO / name != Path(__file__).resolve()]
    assert outside_references(paths, REPO) == []


def test_a_pointer_outside_is_caught(tmp_path: Path) -> None:
    """The control: the pointers this repository once had are found, the words they are made of are not."""
    planted = tmp_path / "module.py"
    planted.write_text('"""msgspec Structs (STYLE.md 6).\n\nWhat `shared/notes/vllm-cpu.md` checked.\n"""\n'
                       "# see ../shared/notes/verl.md\nshared_memory = '/dev/shm'  # the style of a file\n")
    assert [ref.split(": ")[0] for ref in outside_references([planted], tmp_path)] == [
        "module.py:1", "module.py:3", "module.py:5"]
