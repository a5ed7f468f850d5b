"""Harbor task folders: loading one task, or a dataset of them, into typed `Task`s.

A task is a folder (the Harbor format, the successor of Terminal-Bench's):

    my-task/
      task.toml          timeouts, resources, metadata (ill-typed or misspelt fields are errors)
      instruction.md     all the agent sees
      environment/       Dockerfile + build context (the agent's container)
      tests/test.sh      the verifier; writes /logs/verifier/reward.txt or reward.json
      solution/solve.sh  the oracle (optional)

A dataset is a folder of task folders, a text/YAML file listing task folders, or a Python list of them.
A broken task gets one `TaskError` naming it and its problem; the rest of the dataset still loads:

    from steps.tasks import load_dataset
    tasks, errors = load_dataset("steps/tasks/builtin")

From the shell (see `steps/tasks/__main__.py`):

    .venv/bin/python -m steps.tasks list steps/tasks/builtin
    .venv/bin/python -m steps.tasks check steps/tasks/builtin --jobs 2
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from steps.tasks.schema import check_config, unknown_fields

BUILTIN_DATASET = Path(__file__).parent / "builtin"

# Harbor's defaults for fields a task.toml leaves out.
DEFAULT_TIMEOUT_S = 600.0
# Leading comment lines that mark a benchmark file for contamination tracking are not for the agent.
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


class TaskError(ValueError):
    """A task folder that cannot be used; `task` names it, `message` says what is wrong in one sentence."""

    def __init__(self, task: str, message: str) -> None:
        super().__init__(f"{task}: {message}")
        self.task = task
        self.message = message


class DatasetError(ValueError):
    """A dataset path or list file that cannot be read at all (as opposed to one broken task in it)."""


@dataclass(frozen=True)
class Resources:
    """What the task asks of its container. Recorded for Kubernetes; not enforced in local mode."""

    cpus: int = 1
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0


@dataclass(frozen=True)
class TaskConfig:
    """The parts of `task.toml` OpenForge uses, with Harbor's defaults."""

    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    build_timeout_s: float = DEFAULT_TIMEOUT_S
    resources: Resources = field(default_factory=Resources)
    metadata: dict = field(default_factory=dict)
    schema_version: str = "1.0"
    docker_image: str | None = None  # a prebuilt image instead of environment/Dockerfile
    workdir: str | None = None  # [environment] workdir: the agent's working folder, instead of the WORKDIR
    app: str | None = None  # [environment] app (OpenForge's): the task's server, run beside the agent (steps/sandbox/app.py)
    allow_internet: bool = True
    environment_env: dict[str, str] = field(default_factory=dict)  # [environment] env
    verifier_env: dict[str, str] = field(default_factory=dict)  # [verifier] env
    graded_paths: tuple[str, ...] = ()  # [verifier] graded_paths (OpenForge's): what the verifier sees of the agent's work
    judge: bool = False  # [verifier] judge (OpenForge's): the verifier asks the run's judge (steps/proxy/judge.py)
    solution_env: dict[str, str] = field(default_factory=dict)  # [solution] env
    ignored_fields: tuple[str, ...] = ()  # fields of a newer Harbor schema that OpenForge does not read


@dataclass(frozen=True)
class Task:
    """One loaded task folder."""

    name: str
    path: Path
    instruction: str
    config: TaskConfig
    environment_dir: Path
    tests_dir: Path
    solution_dir: Path | None  # None when the task ships no oracle

    @property
    def dockerfile(self) -> Path | None:
        """`environment/Dockerfile`, or None for a task that only names `docker_image`."""
        path = self.environment_dir / "Dockerfile"
        return path if path.is_file() else None

    @property
    def image_tag(self) -> str:
        """The tag of the image built from `environment/`: its content hash (`environment_hash`)."""
        return environment_hash(self.environment_dir)

    @property
    def test_script(self) -> Path:
        """The verifier's entry point, `tests/test.sh`."""
        return self.tests_dir / "test.sh"

    @property
    def solve_script(self) -> Path | None:
        """The oracle's entry point, `solution/solve.sh`, when the task has one."""
        return None if self.solution_dir is None else self.solution_dir / "solve.sh"

    @property
    def difficulty(self) -> str:
        """`[metadata] difficulty`, or "" when unset."""
        return str(self.config.metadata.get("difficulty", ""))

    @property
    def category(self) -> str:
        """`[metadata] category`, or "" when unset."""
        return str(self.config.metadata.get("category", ""))


def environment_hash(folder: Path) -> str:
    """The content hash of a task's environment folder: 16 hex digits of SHA-256 over every file's relative path,
    executable bit and bytes (a symlink's target text), in sorted path order; mtimes and owners do not count, so
    a copy or a fresh checkout hashes the same, and the task image tagged with it is rebuilt only when what goes
    into it changes. Only the executable bit of a mode counts: it is all git keeps, so the driver's checkout and
    the steps image's copy (whose other bits follow each machine's umask) agree. A missing folder hashes as empty.

    >>> import os, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "Dockerfile").write_text("FROM python:3.11-slim\\n")
    >>> before = environment_hash(folder)
    >>> os.utime(folder / "Dockerfile", (0, 0)); environment_hash(folder) == before   # mtime: the same
    True
    >>> os.chmod(folder / "Dockerfile", 0o755); environment_hash(folder) == before    # executable: another
    False
    >>> len(before), environment_hash(folder / "missing")
    (16, 'e3b0c44298fc1c14')
    """
    digest = hashlib.sha256()
    paths = sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()) if folder.is_dir() else []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            continue
        content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        executable = "x" if not path.is_symlink() and path.stat().st_mode & 0o100 else "-"
        name = path.relative_to(folder).as_posix()
        # Lengths first: no two different folders can write the same stream of bytes.
        digest.update(f"{len(name.encode())}:{name}:{executable}:{len(content)}:".encode() + content)
    return digest.hexdigest()[:16]


def load_task(path: Path | str) -> Task:
    """Load and validate one task folder; raise `TaskError` naming the task and its first problem."""
    path = Path(path).absolute()
    name = path.name
    if not path.is_dir():
        raise TaskError(name, f"task folder {path} does not exist")
    raw = _read_toml(name, path / "task.toml")
    problem = check_config(raw)
    if problem:
        raise TaskError(name, f"task.toml: {problem}")
    name = raw.get("task", {}).get("name", name)
    config = _config(raw)
    instruction = _read_instruction(name, path / "instruction.md")
    if not (path / "tests" / "test.sh").is_file():
        raise TaskError(name, "tests/test.sh (the verifier) is missing")
    environment_dir = path / "environment"
    if not (environment_dir / "Dockerfile").is_file() and config.docker_image is None:
        compose = (environment_dir / "docker-compose.yaml").is_file()
        raise TaskError(name, "multi-container environments (docker-compose.yaml) are not supported" if compose
                        else "environment/Dockerfile is missing and [environment] docker_image is not set")
    solution_dir = path / "solution"
    return Task(name=name, path=path, instruction=instruction, config=config, environment_dir=environment_dir,
                tests_dir=path / "tests", solution_dir=solution_dir if (solution_dir / "solve.sh").is_file() else None)


def _read_toml(name: str, path: Path) -> dict:
    if not path.is_file():
        raise TaskError(name, "task.toml is missing")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(name, f"task.toml is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise TaskError(name, "task.toml is not UTF-8 text") from None


def _read_instruction(name: str, path: Path) -> str:
    if not path.is_file():
        raise TaskError(name, "instruction.md is missing")
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    while lines and _CANARY.match(lines[0].strip()):
        lines.pop(0)
    text = "\n".join(lines).strip()
    if not text:
        raise TaskError(name, "instruction.md is empty")
    return text + "\n"


def _config(raw: dict) -> TaskConfig:
    """Build `TaskConfig` from a task.toml already accepted by `check_config`."""
    agent, verifier, env = raw.get("agent", {}), raw.get("verifier", {}), raw.get("environment", {})
    resources = Resources(
        cpus=env.get("cpus", 1),
        memory_mb=env.get("memory_mb", _size_mb(env.get("memory", "2048M"))),
        storage_mb=env.get("storage_mb", _size_mb(env.get("storage", "10240M"))),
        gpus=env.get("gpus", 0))
    return TaskConfig(
        agent_timeout_s=float(agent.get("timeout_sec", DEFAULT_TIMEOUT_S)),
        verifier_timeout_s=float(verifier.get("timeout_sec", DEFAULT_TIMEOUT_S)),
        build_timeout_s=float(env.get("build_timeout_sec", DEFAULT_TIMEOUT_S)),
        resources=resources,
        metadata=dict(raw.get("metadata", {})),
        schema_version=str(raw.get("schema_version", raw.get("version", "1.0"))),
        docker_image=env.get("docker_image"),
        workdir=env.get("workdir"),
        app=env.get("app") or None,
        allow_internet=env.get("allow_internet", True) and env.get("network_mode", "public") != "no-network",
        environment_env=dict(env.get("env", {})),
        verifier_env=dict(verifier.get("env", {})),
        graded_paths=tuple(verifier.get("graded_paths", ())),
        judge=verifier.get("judge", False),
        solution_env=dict(raw.get("solution", {}).get("env", {})),
        ignored_fields=tuple(unknown_fields(raw)))


def _size_mb(size: str) -> int:
    """Harbor's deprecated `memory = "2G"` spelling in MiB (already validated by the schema)."""
    number, unit = float(size[:-1]), size[-1].upper()
    return int(number * {"G": 1024, "M": 1, "K": 1 / 1024}[unit])


def load_dataset(source: Path | str | Sequence[Path | str]) -> tuple[list[Task], list[TaskError]]:
    """Load every task of a dataset; return (tasks that loaded, one `TaskError` per broken task).

    `source` is a task folder, a folder of task folders, a `.txt` file with one task path per line
    (`#` comments allowed) or a `.yaml` file holding a list of paths (or `{tasks: [...]}`), relative
    paths being relative to the file; or a Python list of task folders. Raises `DatasetError` when
    the source itself cannot be read.
    """
    tasks: list[Task] = []
    errors: list[TaskError] = []
    seen: dict[str, Path] = {}
    for path in _task_paths(source):
        try:
            task = load_task(path)
        except TaskError as exc:
            errors.append(exc)
            continue
        except OSError as exc:  # e.g. a file without read permission
            errors.append(TaskError(Path(path).name, f"cannot be read: {exc.strerror} ({exc.filename})"))
            continue
        if task.name in seen:
            errors.append(TaskError(task.name, f"{path} has the same task name as {seen[task.name]}"))
            continue
        seen[task.name] = task.path
        tasks.append(task)
    return tasks, errors


def _task_paths(source: Path | str | Sequence[Path | str]) -> list[Path]:
    if not isinstance(source, (str, Path)):
        return [Path(p) for p in source]
    source = Path(source)
    if source.is_file():
        return _list_file(source)
    if not source.is_dir():
        raise DatasetError(f"dataset {source} does not exist")
    if (source / "task.toml").is_file():
        return [source]
    return sorted(p for p in source.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def _list_file(path: Path) -> list[Path]:
    """Task paths from a `.txt` (one per line) or `.yaml` (a list, or `tasks:` list) file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise DatasetError(f"dataset list {path} is not valid YAML: {exc}") from None
        entries = data.get("tasks") if isinstance(data, dict) else data
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise DatasetError(f"dataset list {path} must be a YAML list of task paths (or tasks: [...])")
    else:
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [path.parent / entry for entry in entries if entry]
