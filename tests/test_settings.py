"""The one config loader (`steps.settings`) behind the run's config and the update's: files, overrides,
strict types, renamed keys and one-sentence errors. Pure Python: no vLLM, no veRL."""

import doctest
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import steps.settings
import steps.update.config
from steps.settings import ConfigError, coerce, load
from steps.update.config import UpdateConfig, load_config as load_update
from steps.contracts.config import RunConfig

from workflows.config import from_dict, load_config as load_run

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Example:
    """Every kind of field the loader knows."""

    count: int = 1
    rate: float = 0.5
    name: str = "x"
    flag: bool = False
    sizes: list[float] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    limit: int | None = None
    flags: tuple[str, ...] = ()


@pytest.mark.parametrize("key, value, expected", [
    ("count", 3, 3),
    ("rate", 2, 2.0),
    ("rate", "1e-5", 1e-5),  # YAML 1.1 reads an exponent without a dot as a string
    ("name", None, ""),
    ("flag", False, False),
    ("sizes", [0.9, 1], [0.9, 1.0]),
    ("args", ["--enforce-eager", "--max-num-seqs", "4"], ["--enforce-eager", "--max-num-seqs", "4"]),
    ("args", None, []),
    ("flags", ["--enforce-eager"], ("--enforce-eager",)),
    ("flags", "--enforce-eager", ("--enforce-eager",)),  # one word on a command line
    ("limit", None, None),
    ("limit", 7, 7),
])
def test_values_of_each_type_load(key: str, value, expected) -> None:
    """Control for the refusals below: the same keys written as their types want them."""
    loaded = getattr(steps.settings.from_dict(Example, {key: value}), key)
    assert loaded == expected and type(loaded) is type(expected)


@pytest.mark.parametrize("key, value, message", [
    ("count", "2", "config key 'count' must be a whole number, got '2'; write it without quotes"),
    ("count", 2.0, "config key 'count' must be a whole number, got 2.0"),
    ("count", True, "config key 'count' must be a whole number, got True"),
    ("rate", "fast", "config key 'rate' must be a number, got 'fast'"),
    ("rate", float("nan"), "config key 'rate' must be a finite number, got nan"),
    ("rate", "inf", "config key 'rate' must be a finite number, got 'inf'"),
    ("rate", False, "config key 'rate' must be a number, got False"),
    ("name", 1.0, "config key 'name' must be a string, got 1.0; put it in quotes to mean text"),
    ("flag", "no", "config key 'flag' must be true or false, got 'no'; write it without quotes"),
    ("flag", "yes please", "config key 'flag' must be true or false, got 'yes please'"),
    ("flag", 1, "config key 'flag' must be true or false, got 1"),
    ("sizes", [0.9, "a"], "config key 'sizes' must be a list of numbers, e.g. [1, 2], got [0.9, 'a']"),
    ("sizes", 0.9, "config key 'sizes' must be a list of numbers, e.g. [1, 2], got 0.9"),
    ("args", ["--max-num-seqs", 4], "config key 'args' must be a list of strings, e.g. ['--enforce-eager', '4']"),
    ("limit", "7", "config key 'limit' must be a whole number, got '7'; write it without quotes"),
    ("flags", 4, "config key 'flags' must be a list of strings, e.g. ['--enforce-eager', '4'], got"),
])
def test_a_value_of_another_type_is_refused_in_one_sentence(key: str, value, message: str) -> None:
    """Each type's refusal names the key, what it accepts and the value as written."""
    with pytest.raises(ConfigError) as refused:
        steps.settings.from_dict(Example, {key: value})
    assert str(refused.value).startswith(message) and len(str(refused.value).splitlines()) == 1


def test_ranges_and_choices() -> None:
    """A range's words replace the type's; a misspelt choice gets its closest match; in range loads."""
    accepted = (lambda v: v >= 1, "a whole number >= 1")
    with pytest.raises(ConfigError, match=r"^config key 'count' must be a whole number >= 1, got 0$"):
        coerce("count", int, 0, accepted)
    with pytest.raises(ConfigError, match=r"must be a whole number >= 1, got '3'; write it without quotes$"):
        coerce("count", int, "3", accepted)
    with pytest.raises(ConfigError, match=r"^config key 'name' must be one of grpo, rloo, got 'rlo' \(did you mean"):
        coerce("name", str, "rlo", choices=("grpo", "rloo"))
    assert coerce("count", int, 3, accepted) == 3 and coerce("name", str, "rloo", choices=("grpo", "rloo")) == "rloo"


def test_files_then_overrides(tmp_path: Path) -> None:
    """Later files win, overrides win over files; each refusal of a file names the file."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("count: 2\nname: first\n")
    second.write_text("name: second\n")
    assert load(Example, [first, second], ["rate=0.25", "args=[--enforce-eager]"]) == Example(
        count=2, name="second", rate=0.25, args=["--enforce-eager"])
    (tmp_path / "list.yaml").write_text("- count\n")
    (tmp_path / "bad.yaml").write_text("count: [\n")
    for path, message in [(tmp_path / "missing.yaml", "cannot read config file {}: No such file or directory"),
                          (tmp_path / "bad.yaml", "config file {} is not valid YAML: "),
                          (tmp_path / "list.yaml", "config file {} must be a flat mapping of key: value, got list")]:
        with pytest.raises(ConfigError) as refused:
            load(Example, [path])
        assert str(refused.value).startswith(message.format(path)) and len(str(refused.value).splitlines()) == 1
    for item, message in [("count", "an override must look like key=value, got 'count'"),
                          ("name=[", "the override 'name=[' has a value that is not valid YAML; quote it")]:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            load(Example, [], [item])


def test_an_unknown_key_names_where_it_was_written_and_its_closest_match(tmp_path: Path) -> None:
    """Misspelt: the closest key; far from every key: the list of keys."""
    path = tmp_path / "a.yaml"
    path.write_text("cuont: 2\n")
    with pytest.raises(ConfigError, match=rf"^unknown config key 'cuont' \(in {path}\) \(did you mean count\?\)$"):
        load(Example, [path])
    with pytest.raises(ConfigError, match=r"^unknown config key 'zzz' \(in the override zzz=1\); known keys: count, "):
        load(Example, [], ["zzz=1"])


@pytest.mark.parametrize("loader, old, new, value", [
    (load_run, "algorithm", "adv_estimator", "rloo"),
    (load_update, "lr", "learning_rate", 3e-6),
])
def test_an_old_name_is_told_its_new_one(loader, old: str, new: str, value, tmp_path: Path) -> None:
    """In a file and as an override, the run's and the update's: "X was renamed to Y"; the new name loads."""
    path = tmp_path / "config.yaml"
    path.write_text(f"{old}: {value}\n")
    with pytest.raises(ConfigError, match=rf"^config key '{old}' \(in {path}\) was renamed to '{new}'$"):
        loader(path, [])
    with pytest.raises(ConfigError, match=rf"^config key '{old}' \(in the override {old}={value}\) was renamed to"):
        loader(None, [f"{old}={value}"])
    assert getattr(loader(None, [f"{new}={value}"]), new) == value


def test_a_stored_run_with_an_old_name_still_loads() -> None:
    """`submit.py resume` reads the config a run started with; one stored before the rename still resumes."""
    stored = RunConfig(run="old", adv_estimator="rloo").to_dict()
    stored["algorithm"] = stored.pop("adv_estimator")
    assert from_dict(stored).adv_estimator == "rloo"


def test_the_run_and_the_update_share_one_loader_and_one_error() -> None:
    """One ConfigError class: the run catches the update's refusals without translating them."""
    import workflows.config

    assert workflows.config.ConfigError is steps.update.config.ConfigError is ConfigError
    with pytest.raises(ConfigError, match=r"^config key 'epochs' must be a whole number >= 1, got 0$"):
        UpdateConfig(epochs=0)  # checked when made, not only when loaded
    with pytest.raises(ConfigError, match=r"config key 'learning_rate' must be a finite number, got nan"):
        load_run(None, ["learning_rate=.nan", "run=x"])
    assert load_update(REPO / "configs" / "update.yaml") == UpdateConfig()  # the file holds the defaults


@pytest.mark.parametrize("module", [steps.settings, steps.update.config])
def test_doctests(module) -> None:
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
