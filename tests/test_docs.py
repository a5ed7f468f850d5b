"""The docs agree with the code: every config key is in the reference with its default, every link resolves.

    .venv/bin/python -m pytest -q tests/test_docs.py      # a second; no vLLM, no harness

`docs/config.md` documents the run's keys (`workflows.config.RunConfig`) in tables headed
`| key | type | default | meaning |`, and the update's (`steps.update.config.UpdateConfig`) in the table under
"The update's own file". A key in the code and not in the reference, or in the reference and not in the
code, fails; so does a written default (a literal, a number, true/false, "empty") that differs from the
code's. Defaults said in words ("chosen by the checkpoint's family") are not compared. Relative links in
README.md and docs/*.md must reach a file, and a `#anchor` a heading of it; the README's `make` targets
must be the Makefile's.
"""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from steps.update.config import UpdateConfig
from steps.contracts.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
CONFIG_DOC = REPO / "docs" / "config.md"
UPDATE_SECTION = "The update's own file"
TABLE_HEADER = re.compile(r"^\|\s*key\s*\|\s*type\s*\|\s*default\s*\|\s*meaning\s*\|$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NO_DEFAULT = object()  # a default written in words: not compared


def documented_keys(text: str) -> dict[str, dict[str, str]]:
    """{"run": {key: default cell}, "update": {...}} from the reference's key tables.

    >>> documented_keys("## Run\\n| key | type | default | meaning |\\n|---|---|---|---|\\n| `a`, `b` | int | 1, 2 | x |\\n")
    {'run': {'a': '1', 'b': '2'}, 'update': {}}
    """
    found: dict[str, dict[str, str]] = {"run": {}, "update": {}}
    section, in_table = "run", False
    for line in text.splitlines():
        if line.startswith("#"):
            section, in_table = ("update" if UPDATE_SECTION in line else "run"), False
        elif TABLE_HEADER.match(line.strip()):
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            keys = re.findall(r"`([a-z0-9_]+)`", cells[0])
            defaults = cells[2].split(", ") if len(keys) > 1 else [cells[2]]
            for key, default in zip(keys, defaults if len(defaults) == len(keys) else [cells[2]] * len(keys)):
                found[section][key] = default
        elif not line.startswith("|"):
            in_table = False
    return found


def written_default(cell: str) -> object:
    """The value a default cell states, or NO_DEFAULT when it says it in words.

    >>> written_default("`codex`"), written_default("1e-6"), written_default("0 (off)"), written_default("empty (AWS)")
    ('codex', 1e-06, 0, '')
    >>> written_default("chosen by the checkpoint's family") is NO_DEFAULT
    True
    """
    cell = re.sub(r"\s*\(.*\)$", "", cell).strip()
    if cell == "empty":
        return ""
    if re.fullmatch(r"`[^`]*`", cell):
        value = yaml.safe_load(cell.strip("`"))
        return value if isinstance(value, list) else cell.strip("`")
    if cell in ("true", "false"):
        return cell == "true"
    try:
        number = float(cell)
    except ValueError:
        return NO_DEFAULT
    return int(number) if re.fullmatch(r"-?\d+", cell) else number


def code_defaults(config_class: type) -> dict[str, object]:
    """Each field of a config dataclass with its default (a tuple as the list YAML writes)."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(config_class)}
    return {name: list(value) if isinstance(value, tuple) else value for name, value in defaults.items()}


def key_problems(documented: dict[str, str], defaults: dict[str, object], where: str) -> list[str]:
    """What a section of the reference gets wrong against the code: missing keys, unknown keys, defaults."""
    problems = [f"{where}: `{key}` is not documented" for key in defaults if key not in documented]
    problems += [f"{where}: `{key}` is documented but is no field" for key in documented if key not in defaults]
    for key in documented.keys() & defaults.keys():
        stated = written_default(documented[key])
        if stated is not NO_DEFAULT and stated != defaults[key]:
            problems.append(f"{where}: `{key}` is documented with default {documented[key]!r}, the code's is "
                            f"{defaults[key]!r}")
    return problems


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it.

    >>> slug("The update's own file"), slug("Images (`images/`, build context = repository root)")
    ('the-updates-own-file', 'images-images-build-context--repository-root')
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown text (code blocks left out)."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def link_problems(page: Path, root: Path = REPO) -> list[str]:
    """Relative links of `page` that reach no file, or no heading of it (pages named relative to `root`)."""
    problems = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{page.relative_to(root)}: link {target!r} reaches no file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            problems.append(f"{page.relative_to(root)}: link {target!r}: {file.name} has no heading #{anchor}")
    return problems


def test_every_run_config_key_is_documented_with_its_default() -> None:
    documented = documented_keys(CONFIG_DOC.read_text())
    assert key_problems(documented["run"], code_defaults(RunConfig), "run config") == []


def test_every_update_config_key_is_documented_with_its_default() -> None:
    documented = documented_keys(CONFIG_DOC.read_text())
    assert key_problems(documented["update"], code_defaults(UpdateConfig), "update config") == []


def test_a_missing_unknown_or_stale_key_is_caught() -> None:
    """The control: the checks above can fail."""
    doc = ("## Run\n| key | type | default | meaning |\n|---|---|---|---|\n"
           "| `harness` | string | `claude-code` | x |\n| `algorithm` | string | `grpo` | x |\n")
    problems = key_problems(documented_keys(doc)["run"], {"harness": "codex", "iterations": 2}, "run config")
    assert problems == ["run config: `iterations` is not documented",
                        "run config: `algorithm` is documented but is no field",
                        "run config: `harness` is documented with default '`claude-code`', the code's is 'codex'"]


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    assert link_problems(page) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path) -> None:
    """The control: a link to a missing file and to a missing heading are both named."""
    (tmp_path / "a.md").write_text("# Title\n\n## Some part\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#some-part) [gone](missing.md) [no heading](a.md#nothing) [web](https://x.org)\n")
    assert link_problems(page, root=tmp_path) == ["b.md: link 'missing.md' reaches no file",
                                                  "b.md: link 'a.md#nothing': a.md has no heading #nothing"]


def test_the_readmes_make_targets_exist() -> None:
    readme = (REPO / "README.md").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))
    named = set(re.findall(r"`make ([a-z][\w-]*)", readme)) | set(re.findall(r"^make ([a-z][\w-]*)", readme, flags=re.M))
    assert named >= {"run", "test"}
    assert named - targets == set()
