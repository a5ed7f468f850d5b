"""Flat YAML configs loaded into dataclasses: the one reader of the run's and the update's settings.

    config = load(UpdateConfig, ["configs/update.yaml"], ["learning_rate=3e-6", "correction=tis"])

A config is a flat YAML mapping of a dataclass's fields; the files are read in order, then `key=value`
overrides (each value read as YAML, so `betas=[0.9,0.95]` and `carry_optimizer=false` work). Every
value is checked against its field's type, strictly:

- a whole number (`int`) is written without quotes: '2' is refused, and so is 2.0;
- a number (`float`) takes whole numbers too, and a plain string that reads as one ("3e-6": YAML 1.1
  reads an exponent without a dot as a string), never NaN or infinity;
- a boolean is YAML's unquoted true/false (or yes/no, on/off), never a quoted string such as 'no';
- text (`str`) is a string; an empty value is "";
- a list (`list[float]`, `list[int]`, `list[str]`, or `tuple[str, ...]` in a frozen dataclass) holds values
  of that type; an empty value is an empty list, and a list of strings also takes one string as a one-item
  list (`vllm_args=--enable-prefix-caching` on a command line);
- a field typed `X | None` also takes an empty value, as None;
- a mapping (`dict[str, str]`) has string keys and values of that type; a Kubernetes quantity (`Quantity`, text)
  also takes a plain number (`cpu: 8`);
- a field whose type is a dataclass is a mapping of that dataclass's fields, each checked the same way and
  named `group.field`: the fields it leaves out keep the field's default (a later file, or an override
  `serve_pod.cpu=8`, changes only the fields it names). One level, for settings that are mappings by nature
  (a pod's node selector and tolerations): configs stay flat otherwise.

A field may have a range (a test and the words for what it accepts) and a set of choices. Every
problem is a `ConfigError`: one sentence naming the key and what it accepts, a close match for a
misspelt key or choice, and for a key in `RENAMED` the name it has now.
"""

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
# A range: the test a value must pass, and the words for what it accepts ("a number > 0").
Range = tuple[Callable[[Any], bool], str]
# Keys that had another name; a config or override using the old one is told the new one. One name per
# concept across the run's and the update's configs.
RENAMED = {"lr": "learning_rate", "algorithm": "adv_estimator"}
WORDS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}


class ConfigError(ValueError):
    """A bad config: the message is one sentence naming the key and what would be accepted."""


def load(cls: type[T], paths: Iterable[str | Path], overrides: Iterable[str] = (),
         ranges: Mapping[str, Range] | None = None, choices: Mapping[str, tuple] | None = None) -> T:
    """`cls` from the YAML files at `paths` (later ones win), then the `key=value` overrides.

    >>> @dataclasses.dataclass
    ... class Example:
    ...     learning_rate: float = 1e-6
    ...     epochs: int = 1
    >>> load(Example, [], ["learning_rate=1e-5", "epochs=2"])
    Example(learning_rate=1e-05, epochs=2)
    """
    values: dict = {}
    sources: dict[str, str] = {}
    for path in paths:
        for key, value in read_yaml(Path(path)).items():
            put(values, key, value)
            sources[key] = str(path)
    for item in overrides:
        key, value = parse_override(item)
        put(values, key, value)
        sources[key.partition(".")[0]] = f"the override {item}"
    return from_dict(cls, values, sources, ranges, choices)


def put(values: dict, key: str, value: Any) -> None:
    """`value` into `values` at `key`: a mapping merged key by key into the mapping already there, and
    `group.field` into the mapping `group`, so that a later file or override changes only what it names.

    >>> values = {"serve_pod": {"cpu": "4", "memory": "32Gi"}}
    >>> put(values, "serve_pod", {"cpu": "8"}); put(values, "serve_pod.memory", "64Gi"); values
    {'serve_pod': {'cpu': '8', 'memory': '64Gi'}}
    """
    group, dot, name = key.partition(".")
    if dot:
        value, key = {name: value}, group
    if isinstance(value, dict) and isinstance(values.get(key), dict):
        value = {**values[key], **value}
    values[key] = value


def read_yaml(path: Path) -> dict:
    """A flat YAML mapping with string keys, or a ConfigError naming the file."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a flat mapping of key: value, got {type(data).__name__}")
    return {str(key): value for key, value in data.items()}


def parse_override(item: str) -> tuple[str, Any]:
    """`"key=value"` as (key, value), the value read as YAML (an empty one is None).

    >>> parse_override("learning_rate=1e-5"), parse_override("betas=[0.9, 0.95]"), parse_override("run=")
    (('learning_rate', '1e-5'), ('betas', [0.9, 0.95]), ('run', None))
    """
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"an override must look like key=value, got {item!r}")
    try:
        return key.strip(), yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"the override {item!r} has a value that is not valid YAML; quote it") from None


def from_dict(cls: type[T], raw: Mapping[str, Any], sources: Mapping[str, str] | None = None,
              ranges: Mapping[str, Range] | None = None, choices: Mapping[str, tuple] | None = None) -> T:
    """`cls` from a flat dict, every value checked (`coerce`); `sources` says where each key was written."""
    kinds = field_types(cls)
    values = {}
    for key, value in raw.items():
        if key not in kinds:
            raise ConfigError(unknown_key(key, list(kinds), (sources or {}).get(key)))
        if dataclasses.is_dataclass(kinds[key]):
            values[key] = group(key, kinds[key], value, field_default(cls, key), (sources or {}).get(key))
        else:
            values[key] = coerce(key, kinds[key], value, (ranges or {}).get(key), (choices or {}).get(key))
    return cls(**values)


def field_default(cls: type, name: str) -> Any:
    """The default of the dataclass's field `name` (from its default_factory if it has one)."""
    (item,) = [item for item in dataclasses.fields(cls) if item.name == name]
    return item.default if item.default is not dataclasses.MISSING else item.default_factory()


def group(key: str, cls: type, value: Any, default: Any, source: str | None = None) -> Any:
    """The mapping `value` of field `key` as the dataclass `cls`, over the field's `default`: each of its fields
    checked as `key.field`, those it leaves out the default's (an empty value: all of them)."""
    value = {} if value is None or value == "" else value
    if not isinstance(value, dict):
        raise ConfigError(f"config key {key!r} must be a mapping of {', '.join(field_types(cls))}, got {value!r}")
    kinds, values = field_types(cls), {}
    for name, item in value.items():
        if name not in kinds:
            raise ConfigError(unknown_key(f"{key}.{name}", [f"{key}.{known}" for known in kinds], source))
        values[name] = coerce(f"{key}.{name}", kinds[name], item)
    return dataclasses.replace(default, **values)


def field_types(cls: type) -> dict[str, Any]:
    """The dataclass's fields and their types, in order (annotations written as strings resolved)."""
    hints = typing.get_type_hints(cls)
    return {item.name: hints[item.name] for item in dataclasses.fields(cls)}


def unknown_key(key: str, names: list[str], source: str | None = None) -> str:
    """The sentence for a key that is not a field: its new name if it was renamed, else a close match.

    >>> unknown_key("lr", ["learning_rate", "epochs"], "the override lr=1e-5")
    "config key 'lr' (in the override lr=1e-5) was renamed to 'learning_rate'"
    >>> unknown_key("epoch", ["learning_rate", "epochs"])
    "unknown config key 'epoch' (did you mean epochs?)"
    """
    where = f" (in {source})" if source else ""
    if RENAMED.get(key) in names:
        return f"config key {key!r}{where} was renamed to {RENAMED[key]!r}"
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else f"; known keys: {', '.join(names)}"
    return f"unknown config key {key!r}{where}{hint}"


def with_new_names(raw: Mapping[str, Any]) -> dict:
    """`raw` with renamed keys under their new names: for a config the program wrote (a run's manifest).

    >>> with_new_names({"algorithm": "grpo", "epochs": 1})
    {'adv_estimator': 'grpo', 'epochs': 1}
    """
    return {RENAMED.get(key, key): value for key, value in raw.items()}


def coerce(key: str, annotation: Any, value: Any, accepted: Range | None = None, choices: tuple | None = None):
    """`value` as field `key` of type `annotation` wants it, or a ConfigError naming what is accepted.

    >>> coerce("learning_rate", float, "1e-5"), coerce("epochs", int, 2), coerce("betas", list[float], [0.9, 1])
    (1e-05, 2, [0.9, 1.0])
    >>> coerce("epochs", int, "2")
    Traceback (most recent call last):
    steps.settings.ConfigError: config key 'epochs' must be a whole number, got '2'; write it without quotes
    """
    kind, optional = _unwrap(annotation)
    if value is None and optional:
        return None
    typed = _typed(key, kind, value, accepted[1] if accepted else None)
    if accepted and not accepted[0](typed):
        raise ConfigError(f"config key {key!r} must be {accepted[1]}, got {value!r}")
    if choices and typed not in choices:
        close = difflib.get_close_matches(str(typed), [str(choice) for choice in choices], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"config key {key!r} must be one of {', '.join(map(str, choices))}, got {value!r}{hint}")
    return typed


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed): `int | None` is (int, True)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return rest[0], len(rest) < len(typing.get_args(annotation))
    return annotation, False


def _typed(key: str, kind: Any, value: Any, words: str | None):
    """`value` as `kind` (int, float, str, bool, list[...] or tuple[..., ...]); `words` override the type's in
    a message."""
    container = typing.get_origin(kind)
    if getattr(kind, "__supertype__", None) is str:  # a Quantity: text, or a plain number as its text
        return _typed(key, str, value if isinstance(value, bool) or not isinstance(value, int | float) else
                      format(value, "g"), words)
    if container is dict:
        if value is None or value == "":
            return {}
        if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
            raise ConfigError(f"config key {key!r} must be {words or 'a mapping of names to values'}, got {value!r}")
        return {name: _typed(f"{key}.{name}", typing.get_args(kind)[1], item, None) for name, item in value.items()}
    if container in (list, tuple):  # a frozen config may hold a tuple[str, ...]; YAML writes both as a list
        item = typing.get_args(kind)[0]
        if value is None or value == "":
            return container()
        if item is str and isinstance(value, str):  # one word on a command line: vllm_args=--enforce-eager
            return container([value])
        if isinstance(value, list | tuple):
            try:
                return container(_typed(key, item, element, None) for element in value)
            except ConfigError:
                pass
        raise ConfigError(f"config key {key!r} must be {words or _list_words(item)}, got {value!r}")
    if kind is str and value is None:
        return ""
    if kind is dict and value in (None, ""):  # any mapping, its values left to the field's own check
        return {}
    number = value
    if kind is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-5 (no dot) as a string
            number = float(value)
        except ValueError:
            pass
    if kind is float and isinstance(number, int | float) and not isinstance(number, bool):
        if not math.isfinite(number):  # YAML's .nan and .inf, and float() reads "nan"
            raise ConfigError(f"config key {key!r} must be {words or 'a finite number'}, got {value!r}")
        return float(number)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ConfigError(f"config key {key!r} must be {words or WORDS[kind]}, got {value!r}{_quoting(kind, value)}")


def _list_words(item: Any) -> str:
    """'a list of numbers', 'a list of strings', ..."""
    plural = {int: "whole numbers", float: "numbers", str: "strings", bool: "booleans", dict: "mappings"}[item]
    examples = {str: "['--enforce-eager', '4']", bool: "[true, false]", dict: "[{key: a, operator: Exists}]"}
    return f"a list of {plural}, e.g. " + examples.get(item, "[1, 2]")


def _quoting(kind: Any, value: Any) -> str:
    """Advice when only quotes were wrong: '2' for a whole number, 'no' for a boolean, 1.0 for text."""
    if isinstance(value, str) and kind in (int, bool):
        try:
            unquoted = yaml.safe_load(value)
        except yaml.YAMLError:
            return ""
        if isinstance(unquoted, kind) and (kind is bool or not isinstance(unquoted, bool)):
            return "; write it without quotes"
    if kind is str and isinstance(value, int | float | bool):
        return "; put it in quotes to mean text"
    return ""
