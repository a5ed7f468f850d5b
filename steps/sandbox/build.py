"""Preparing a sandbox's workspace from the task's `environment/Dockerfile`, without a container engine.

`apply_dockerfile(sandbox, task)` applies the instructions in order, inside the sandbox:
- FROM: the host system stands in for the image (said so in `sandbox.notes`); a second FROM
  (multi-stage build) is an error;
- WORKDIR, ENV, ARG, SHELL: as Docker does them, with `$VAR` / `${VAR:-default}` substitution;
- COPY / ADD: from the build context `environment/` (globs, `--chmod`, heredocs; ADD extracts local
  tar archives; ADD from a URL and COPY --from are errors);
- RUN: shell or exec form (and heredocs) run in the sandbox as root with a container's usual
  capabilities, under the task's build timeout, the output appended to `ROOT/build.log`; what they
  change (apt, pip, anything under /) lands in the task's layer; a failing RUN raises `SandboxError` quoting its output;
- USER is ignored (noted), and CMD, ENTRYPOINT, EXPOSE, LABEL, VOLUME, HEALTHCHECK... do not change
  files, so they are skipped. `.dockerignore` is not read.

Called by `LocalSandbox.create`; see `steps/sandbox/local.py` for the sandbox itself.
"""

from __future__ import annotations

import glob
import posixpath
import re
import shutil
import tarfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from steps.sandbox.dockerfile import DockerfileError, Instruction, expand, parse_dockerfile, parse_env, parse_flags, split_words
from steps.sandbox.common import WHEELS_DIR, SandboxError, copy_tree
from steps.tasks import Task



class BuildRoot(Protocol):
    """What the builder needs of the sandbox it builds in (`LocalSandbox`, which calls it): the root's files, the
    image's environment and notes, a command run in the root, and the build's own settings (`log`, `network`,
    `wheels`). Named here rather than imported: the sandbox imports the builder."""

    workdir: str
    env: dict[str, str]
    notes: list[str]
    build: dict

    def host_path(self, path: str) -> Path: ...

    def run(self, argv: list[str], **options) -> object: ...


# The host's Python stands in for the image's, and Debian marks its Python externally managed (PEP 668); an
# image's own pip (python:3.x-slim, most Harbor bases) installs system-wide, into what is here the task's layer.
PIP_IN_IMAGE = {"PIP_BREAK_SYSTEM_PACKAGES": "1"}


def apply_dockerfile(sandbox: BuildRoot, task: Task) -> None:
    """Apply `task.dockerfile` to a fresh sandbox; raise `SandboxError` naming the first line that fails."""
    _Build(sandbox, task).apply()


class _Build:
    """Applies a task's Dockerfile to a fresh sandbox, one instruction at a time."""

    # They describe how the container runs, not what is in its files.
    IGNORED = frozenset({"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK", "STOPSIGNAL", "MAINTAINER",
                         "ONBUILD"})

    def __init__(self, box: BuildRoot, task: Task) -> None:
        self.box = box
        self.task = task
        self.context = task.environment_dir.resolve()
        self.build_args: dict[str, str] = {}
        self.shell = ["/bin/sh", "-c"]
        self.deadline = time.monotonic() + task.config.build_timeout_s
        self.log_path = Path(box.build["log"])  # the rollout's build.log: the build's own folder goes away
        self.seen_from = False

    def apply(self) -> None:
        """Apply every instruction in order; raise `SandboxError` naming the first one that fails."""
        try:
            instructions = parse_dockerfile(self.task.dockerfile.read_text(encoding="utf-8"))
        except DockerfileError as exc:
            raise SandboxError(f"environment/Dockerfile: {exc}") from None
        for step in instructions:
            if step.keyword in self.IGNORED:
                continue
            handler = getattr(self, f"_{step.keyword.lower()}", None)
            if handler is None:
                raise self._error(step, f"{step.keyword} is not a Dockerfile instruction local mode knows")
            try:
                handler(step)
            except (OSError, ValueError) as exc:  # DockerfileError is a ValueError
                raise self._error(step, str(exc)) from None

    def _error(self, step: Instruction, message: str) -> SandboxError:
        return SandboxError(f"environment/Dockerfile line {step.line} ({step.keyword}): {message}")

    @property
    def variables(self) -> dict[str, str]:
        return {**self.build_args, **self.box.env}

    def _absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.box.workdir, path))

    def _from(self, step: Instruction) -> None:
        if self.seen_from:
            raise self._error(step, "multi-stage Dockerfiles are not supported in local mode")
        self.seen_from = True
        image = expand(step.text, self.build_args).split()[0]
        self.box.notes.append(f"FROM {image}: the host system stands in for this image in local mode")

    def _arg(self, step: Instruction) -> None:
        for name, value in parse_env(expand(step.text, self.variables)).items():
            self.build_args.setdefault(name, value)

    def _env(self, step: Instruction) -> None:
        self.box.env.update(parse_env(expand(step.text, self.variables)))

    def _workdir(self, step: Instruction) -> None:
        self.box.workdir = self._absolute(expand(step.text, self.variables))
        self.box.host_path(self.box.workdir).mkdir(parents=True, exist_ok=True)

    def _user(self, step: Instruction) -> None:
        self.box.notes.append(f"USER {step.text} is ignored: local mode runs everything as root")

    def _shell(self, step: Instruction) -> None:
        words = step.exec_form()
        if not words:
            raise self._error(step, 'SHELL must be a JSON list such as ["/bin/bash", "-c"]')
        self.shell = words

    def _run(self, step: Instruction) -> None:
        flags = re.match(r"((--\S+)\s+)*", step.text).group(0)
        if flags:
            self.box.notes.append(f"line {step.line}: RUN {flags.strip()} is ignored in local mode")
            step = replace(step, text=step.text[len(flags):])
        argv = step.exec_form() or [*self.shell, step.script()]
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._error(step, f"the build timeout of {self.task.config.build_timeout_s:g} s ran out")
        with open(self.log_path, "a") as build_log:
            build_log.write(f"\n# line {step.line}: RUN {step.text}\n")
            start = build_log.tell()
        wheels = {"PIP_FIND_LINKS": WHEELS_DIR, "PIP_NO_INDEX": "1"} if self.box.build["wheels"] else {}
        result = self.box.run(argv, timeout_s=remaining, env=PIP_IN_IMAGE | self.build_args | self.box.env | wheels,
                              stdout_path=self.log_path, network=self.box.build["network"])
        if result.timed_out:
            raise self._error(step, f"RUN did not finish within the build timeout; see {self.log_path}")
        if result.exit_code != 0:
            with open(self.log_path, "rb") as build_log:
                build_log.seek(start)
                output = build_log.read().decode(errors="replace").rstrip().splitlines()[-15:]
            raise self._error(step, f"RUN failed with exit code {result.exit_code}; its output ends with:\n"
                                    + "\n".join(output))

    def _copy(self, step: Instruction, archives: bool = False) -> None:
        words = step.exec_form() or split_words(step.text)
        flags, args = parse_flags([expand(w, self.variables) for w in words])
        if "from" in flags:
            raise self._error(step, "COPY --from (multi-stage) is not supported in local mode")
        if step.heredoc is not None:  # COPY <<EOF /path: the heredoc is the file
            target = self.box.host_path(self._absolute(args[-1]))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.heredoc)
            self._chmod(target, flags)
        elif len(args) < 2:
            raise self._error(step, "needs at least one source and a destination")
        else:
            self._copy_sources(step, args, flags, archives)

    def _copy_sources(self, step: Instruction, args: list[str], flags: dict[str, str], archives: bool) -> None:
        """Docker's rules: a folder's contents are merged; files land in DEST/ when DEST is a folder."""
        sources = [match for pattern in args[:-1] for match in self._matches(step, pattern)]
        destination = self._absolute(args[-1])
        into_dir = args[-1].endswith("/") or len(sources) > 1 or self.box.host_path(destination).is_dir()
        for source in sources:
            target = self.box.host_path(destination)
            if source.is_dir():
                copy_tree(source, target)
            elif archives and tarfile.is_tarfile(source):
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(source) as archive:
                    archive.extractall(target, filter="data")
            else:
                target = target / source.name if into_dir else target
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
            self._chmod(target, flags)

    def _add(self, step: Instruction) -> None:
        if re.search(r"(^|\s)(https?|git)://|git@", step.text):
            raise self._error(step, "ADD from a URL is not supported in local mode")
        self._copy(step, archives=True)

    def _matches(self, step: Instruction, pattern: str) -> list[Path]:
        """Files of the build context matching one COPY source pattern (which may not leave the context)."""
        found = sorted(glob.glob(pattern.lstrip("/"), root_dir=self.context))
        paths = [(self.context / match).resolve() for match in found]
        if not paths:
            raise self._error(step, f"'{pattern}' matches nothing in {self.task.environment_dir}")
        outside = [p for p in paths if not p.is_relative_to(self.context)]
        if outside:
            raise self._error(step, f"'{pattern}' points outside the build context environment/")
        return paths

    def _chmod(self, target: Path, flags: dict[str, str]) -> None:
        if "chmod" in flags:
            if re.fullmatch(r"[0-7]{3,4}", flags["chmod"]) is None:
                raise DockerfileError(f"--chmod must be an octal mode such as 755, got '{flags['chmod']}'")
            mode = int(flags["chmod"], 8)
            paths = [target, *target.rglob("*")] if target.is_dir() else [target]
            for path in paths:
                path.chmod(mode)
