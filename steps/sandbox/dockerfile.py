"""Reading a task's `environment/Dockerfile` into instructions the local sandbox can apply.

Pure functions, no I/O: `parse_dockerfile(text)` splits the file into `Instruction`s (comments dropped,
`\\` continuations joined, one heredoc per instruction kept), `expand(text, env)` does Docker's
`$VAR` / `${VAR:-default}` substitution, and `split_words` / `parse_env` / `parse_flags` read the
arguments of `ENV`, `COPY` and `ADD`. The sandbox (`steps/sandbox/local.py`) decides what each instruction
does; nothing here runs anything.

    python -m pytest --doctest-modules steps/sandbox/dockerfile.py
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

# `<<EOF`, `<<-EOF`, `<<"EOF"`: BuildKit heredocs, as used by RUN and COPY.
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_VARIABLE = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class DockerfileError(ValueError):
    """The Dockerfile cannot be read; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: `keyword` upper-cased, `text` its arguments, `heredoc` its body."""

    line: int
    keyword: str
    text: str
    heredoc: str | None = None

    def exec_form(self) -> list[str] | None:
        """The JSON ("exec") form's words, or None for the shell form.

        >>> Instruction(1, "RUN", '["echo", "hi"]').exec_form()
        ['echo', 'hi']
        >>> Instruction(1, "RUN", "echo hi").exec_form() is None
        True
        """
        if not self.text.startswith("["):
            return None
        try:
            words = json.loads(self.text)
        except ValueError:
            return None
        return words if isinstance(words, list) and all(isinstance(w, str) for w in words) else None

    def script(self) -> str:
        """The text a shell-form RUN hands to `/bin/sh -c`, its heredoc included.

        `RUN <<EOF` alone runs the heredoc's body; `RUN python3 <<EOF` keeps the heredoc for the shell.

        >>> Instruction(1, "RUN", "<<EOF", "echo one\\necho two\\n").script()
        'echo one\\necho two\\n'
        >>> Instruction(1, "RUN", "cat <<-'END' > /app/x", "hi\\n").script()
        "cat <<-'END' > /app/x\\nhi\\nEND\\n"
        """
        if self.heredoc is None:
            return self.text
        if self.text.startswith("<<"):
            return self.heredoc
        return f"{self.text}\n{self.heredoc}{_HEREDOC.search(self.text).group(3)}\n"


def parse_dockerfile(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, in order.

    >>> steps = parse_dockerfile('''# syntax=docker/dockerfile:1
    ... FROM python:3.11-slim
    ... RUN apt-get update \\\\
    ...     # a comment inside a continuation
    ...     && echo done
    ... COPY <<EOF /app/note.txt
    ... hello
    ... EOF
    ... ''')
    >>> [(s.line, s.keyword, s.text) for s in steps]
    [(2, 'FROM', 'python:3.11-slim'), (3, 'RUN', 'apt-get update && echo done'), (6, 'COPY', '<<EOF /app/note.txt')]
    >>> steps[2].heredoc
    'hello\\n'
    """
    lines = text.splitlines()
    instructions: list[Instruction] = []
    index = 0
    while index < len(lines):
        start = index
        stripped = lines[index].strip()
        index += 1
        if not stripped or stripped.startswith("#"):
            continue
        continued = stripped.endswith("\\")
        parts = [stripped[:-1].rstrip() if continued else stripped]
        while continued and index < len(lines):
            following = lines[index].strip()
            index += 1
            if following and not following.startswith("#"):  # comments inside a continuation are dropped
                continued = following.endswith("\\")
                parts.append(following[:-1].rstrip() if continued else following)
        joined = " ".join(p for p in parts if p)
        keyword, _, rest = joined.partition(" ")
        if not keyword.isalpha():
            raise DockerfileError(f"line {start + 1}: '{keyword}' is not a Dockerfile instruction")
        heredoc, index = _read_heredoc(keyword.upper(), rest, lines, index, start)
        instructions.append(Instruction(start + 1, keyword.upper(), rest.strip(), heredoc))
    return instructions


def _read_heredoc(keyword: str, rest: str, lines: list[str], index: int, start: int) -> tuple[str | None, int]:
    """Consume the body of a RUN/COPY heredoc that starts on this instruction, if there is one."""
    match = _HEREDOC.search(rest) if keyword in ("RUN", "COPY") else None
    if match is None:
        return None, index
    strip_tabs, delimiter = match.group(1) == "-", match.group(3)
    body: list[str] = []
    while index < len(lines):
        line = lines[index].lstrip("\t") if strip_tabs else lines[index]
        index += 1
        if line == delimiter:
            return "".join(f"{b}\n" for b in body), index
        body.append(line)
    raise DockerfileError(f"line {start + 1}: heredoc '{delimiter}' is never closed")


def expand(text: str, env: dict[str, str]) -> str:
    """Docker's variable substitution: `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME:+alt}`, `\\$`.

    >>> expand("${HOME}/bin:$PATH:${MISSING:-none}:${HOME:+set}:\\\\$x", {"HOME": "/root", "PATH": "/bin"})
    '/root/bin:/bin:none:set:$x'
    """

    def substitute(match: re.Match) -> str:
        if match.group(0) == "\\$":
            return "$"
        value = env.get(match.group(1) or match.group(4), "")
        if match.group(2) == "-":
            return value or match.group(3)
        if match.group(2) == "+":
            return match.group(3) if value else ""
        return value

    return _VARIABLE.sub(substitute, text)


def split_words(text: str) -> list[str]:
    """Split arguments the way Docker does for COPY/ADD/ENV: whitespace, with quotes removed.

    >>> split_words('--chown=1:1 "my file.txt" /app/')
    ['--chown=1:1', 'my file.txt', '/app/']
    """
    try:
        return shlex.split(text, posix=True)
    except ValueError as exc:
        raise DockerfileError(f"cannot split '{text}': {exc}") from None


def parse_env(text: str) -> dict[str, str]:
    """The variables an `ENV` (or `ARG`) line sets, in both `K=V K2=V2` and legacy `K V` forms.

    >>> parse_env('A=1 B="two words" C=')
    {'A': '1', 'B': 'two words', 'C': ''}
    >>> parse_env('GREETING hello world')
    {'GREETING': 'hello world'}
    """
    first = text.split(None, 1)
    if first and "=" not in first[0]:
        return {first[0]: first[1].strip() if len(first) > 1 else ""}
    values = {}
    for word in split_words(text):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise DockerfileError(f"'{word}' is not NAME=value")
        values[name] = value
    return values


def parse_flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split leading `--flag=value` words (COPY/ADD/RUN options) from the rest.

    >>> parse_flags(["--chmod=755", "--link", "run.sh", "/app/"])
    ({'chmod': '755', 'link': ''}, ['run.sh', '/app/'])
    """
    flags: dict[str, str] = {}
    index = 0
    while index < len(words) and words[index].startswith("--"):
        name, _, value = words[index][2:].partition("=")
        flags[name] = value
        index += 1
    return flags, words[index:]
