"""What a shell command does to the workspace, read from its text alone (no LLM, no sandbox).

A command is split into segments at `&&`, `||`, `;`, `|`, `&` and line breaks (quotes respected).
A pipeline that runs tests or a build (`TEST_RUNS`: `pytest -q | tee log`, `make test > log.txt`) is a
check throughout: the log it writes is not a change to the work. `bash -c 'STRING'` is read as the
STRING's commands. Each other segment is a *change* (it writes the workspace: a redirection into a file
other than /dev/null, or a program that writes files: `WRITERS`, `sed -i`, `git apply`, `curl -o`, ...,
and a harness's own `SHELL_WRITERS`), a *check* (it reads or runs something:
`CHECKERS`, a test runner, an interpreter, `./prog`), or neither (`cd`, `echo`, `ls`). A heredoc's body is
data, left out, unless it is fed to a shell (`bash <<EOF`), where its lines are commands too. A segment that
writes is a change even when it also runs something (`python gen.py > out.txt`). Running a program counts
as a check, not a change, though it may write files: the text cannot tell, and the verifier's view is
what the agent checked, not what it wrote. Only a command's first `COMMAND_LIMIT` characters are read: the
agent writes the command, and a megabyte of it must not stall the analytics.
"""

from __future__ import annotations

import re
import shlex
from typing import NamedTuple

COMMAND_LIMIT = 10_000
# A heredoc's start (`<<EOF`, `<<-'EOF'`), not a here-string (`<<<`).
HEREDOC = re.compile(r"(?<!<)<<-?(?!<)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
QUOTED = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"")  # a quoted string on one line
SHELLS = {"bash", "sh", "zsh", "dash"}
SEPARATORS = {"&&", "||", ";", "|", "&", "|&", ";;", "\n"}
REDIRECTS = {">", ">>", ">|", "&>", "&>>"}
INPUTS = {"<", "<<", "<<-", "<<<"}
WRITERS = {"tee", "cp", "mv", "rm", "rmdir", "mkdir", "touch", "ln", "chmod", "chown", "install", "patch",
           "dd", "truncate", "unzip", "tar", "gunzip", "gzip"}
# Programs whose second word decides: `git apply` writes, `git diff` reads.
WRITING_SUBCOMMANDS = {"git": {"apply", "checkout", "restore", "reset", "mv", "rm", "am", "stash", "clone"},
                       "pip": {"install", "uninstall"}, "npm": {"install", "ci", "uninstall"},
                       "uv": {"add", "remove", "sync", "pip"}}
IN_PLACE = {"sed": {"-i", "--in-place"}, "perl": {"-i", "-pi"}}
CHECKERS = {
    # read-backs of a file's content
    "cat", "head", "tail", "less", "more", "diff", "cmp", "grep", "egrep", "rg", "wc", "od", "xxd", "hexdump",
    "jq", "md5sum", "sha256sum", "sha1sum", "file", "stat", "test", "[", "[[", "nl", "sort", "uniq", "awk",
    "sed", "git",
    # test runners, builds and interpreters running the program
    "pytest", "python", "python3", "node", "npx", "npm", "bash", "sh", "make", "cargo", "go", "java", "javac",
    "gcc", "g++", "cc", "clang", "ruby", "perl", "deno", "bun", "tox", "uv", "ctest", "mvn", "gradle", "php",
    "rustc", "tsc",
}
PREFIXES = {"sudo", "env", "time", "timeout", "nice", "nohup", "command", "exec", "xargs"}
# A wrapper's own options and numbers (`timeout 10s`, `nice -n 5`, `env -i A=1`).
WRAPPER_ARGUMENT = re.compile(r"-.*|\d+(\.\d+)?[smhd]?|[^=]+=.*")
# Options naming a file a program writes (`curl -o f`, `sort -o f`), or that make it write (`find -delete`).
WRITING_OPTIONS = {"curl": {"-o", "-O", "--output", "--remote-name"}, "sort": {"-o", "--output"},
                   "find": {"-delete"}}
# Tests and builds: the first word, or the first two (`npm test`, `python -m pytest`).
TEST_RUNS = {"pytest", "tox", "nox", "make", "ctest", "mvn", "gradle", "./gradlew", "cargo test", "cargo build",
             "cargo check", "go test", "go build", "go vet", "npm test", "npm run", "yarn test", "pnpm test",
             "bun test", "python -m", "python3 -m", "deno test"}
INTERPRETERS = {"python", "python3", "node", "bash", "sh", "ruby", "perl", "deno", "bun", "php", "java", "go"}
NESTING_LIMIT = 3  # `bash -c` inside `bash -c`: deeper scripts are not read


def words(command: str) -> list[str]:
    """The command's words and operators (quotes respected; unbalanced quotes fall back to a plain split).

    >>> words("echo 'a; b' > out.txt && cat out.txt")
    ['echo', 'a; b', '>', 'out.txt', '&&', 'cat', 'out.txt']
    """
    command = command[:COMMAND_LIMIT]
    lexer = shlex.shlex(command.replace("\n", " \n "), posix=True, punctuation_chars=True)
    lexer.whitespace = " \t\r"
    try:
        return list(lexer)
    except ValueError:
        return command.split()


def without_data(command: str) -> str:
    r"""The command without its heredoc bodies, which are data (`cat > f <<EOF`, `python - <<EOF`), except
    a body fed to a shell (`bash <<EOF`), whose lines run as commands.

    >>> without_data("python3 - <<'EOF'\nif a > b: pass\nEOF\ncat out")
    "python3 - <<'EOF'\ncat out"
    >>> without_data("bash <<EOF\necho hi > a.txt\nEOF")
    'bash <<EOF\necho hi > a.txt'
    """
    lines, kept, n = command.split("\n"), [], 0
    while n < len(lines):
        line, n = lines[n], n + 1
        kept.append(line)
        found = heredoc(line)
        if not found:
            continue
        body = []
        while n < len(lines) and lines[n].strip() != found.group(2):
            body.append(lines[n])
            n += 1
        n += 1  # the delimiter's line
        head = segments(line[:found.start()], data=False)
        if head and program(head[-1])[0] in SHELLS:
            kept += body
    return "\n".join(kept)


def heredoc(line: str) -> re.Match | None:
    """The first heredoc start on a line outside quotes (`echo "use <<EOF"` starts none).

    >>> heredoc("cat > f <<'EOF'").group(2), heredoc('echo "a <<EOF" > f') is None
    ('EOF', True)
    """
    masked = QUOTED.sub(lambda quoted: "_" * len(quoted.group()), line)
    for start in re.finditer(r"<<", masked):
        found = HEREDOC.match(line, start.start())
        if found:
            return found
    return None


def segments(command: str, data: bool = True) -> list[list[str]]:
    """The command split into its simple commands (heredoc bodies left out as data, see `without_data`).

    >>> segments("cd src && pytest -q | tail -1")
    [['cd', 'src'], ['pytest', '-q'], ['tail', '-1']]
    """
    found, current = [], []
    for word in words(without_data(command[:COMMAND_LIMIT]) if data else command):
        if word in SEPARATORS:
            found.append(current)
            current = []
        else:
            current.append(word)
    found.append(current)
    return [segment for segment in found if segment]


def program(segment: list[str]) -> tuple[str, list[str]]:
    """The program a segment runs and its arguments, past variable assignments and wrappers like `sudo`.

    >>> program(["FOO=1", "timeout", "10", "python3", "-m", "pytest"])
    ('python3', ['-m', 'pytest'])
    """
    rest = list(segment)
    while rest and "=" in rest[0] and not rest[0].startswith("="):  # VAR=value
        rest.pop(0)
    while rest and rest[0] in PREFIXES:
        rest.pop(0)
        while rest and WRAPPER_ARGUMENT.fullmatch(rest[0]):
            rest.pop(0)
    if not rest:
        return "", []
    name = rest[0].rsplit("/", 1)[-1] if not rest[0].startswith("./") else rest[0]
    return name, rest[1:]


def is_change(segment: list[str], writers: tuple[str, ...] = ()) -> bool:
    """Whether a segment writes the workspace (`writers`: a harness's own programs that write).

    >>> is_change(["echo", "hello", ">", "answer.txt"]), is_change(["ls", ">", "/dev/null"])
    (True, False)
    >>> is_change(["sed", "-i", "s/a/b/", "f.py"]), is_change(["git", "diff"]), is_change(["curl", "-o", "f", "u"])
    (True, False, True)
    """
    for n, word in enumerate(segment[:-1]):
        if word in REDIRECTS and segment[n + 1] != "/dev/null" and not segment[n + 1].startswith("&"):
            return True
    name, args = program(segment)
    if name in WRITERS or name in writers:
        return True
    if name == "wget":  # it writes a file unless told to print (`-O -`, `-qO-`) or only look (`--spider`)
        return not ({"-", "-O-", "-qO-", "--spider"} & set(args))
    if args and args[0] in WRITING_SUBCOMMANDS.get(name, ()):
        return True
    return any(arg in IN_PLACE.get(name, ()) or arg in WRITING_OPTIONS.get(name, ()) for arg in args)


def is_test_run(segment: list[str]) -> bool:
    """Whether a segment runs tests or a build (`TEST_RUNS`).

    >>> is_test_run(["pytest", "-q"]), is_test_run(["npm", "test"]), is_test_run(["npm", "install"])
    (True, True, False)
    """
    name, args = program(segment)
    return name in TEST_RUNS or " ".join([name, *args[:1]]) in TEST_RUNS


def script(segment: list[str]) -> str | None:
    """The script a segment hands a shell as a string (`bash -c 'STRING'`, `sh -lc STRING`), else None.

    >>> script(["bash", "-lc", "echo hi > a"]), script(["bash", "run.sh"])
    ('echo hi > a', None)
    """
    name, args = program(segment)
    if name not in SHELLS:
        return None
    for n, arg in enumerate(args[:-1]):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg:
            return args[n + 1]
    return None


def pipelines(command: str) -> list[list[list[str]]]:
    """The command's pipelines, each a list of its segments (see `segments`).

    >>> pipelines("pytest -q | tee log && cat log")
    [[['pytest', '-q'], ['tee', 'log']], [['cat', 'log']]]
    """
    found, current, segment = [], [], []
    for word in words(without_data(command[:COMMAND_LIMIT])):
        if word in SEPARATORS:
            current += [segment] if segment else []
            segment = []
            if word not in ("|", "|&") and current:
                found.append(current)
                current = []
        else:
            segment.append(word)
    current += [segment] if segment else []
    return found + [current] if current else found


class Step(NamedTuple):
    """One step of a tool use: what it did ("change", "check" or ""), the words that may name the files it
    wrote or read, and whether it runs tests, a build or a program (a check of the work whatever it names)."""

    effect: str
    files: tuple[str, ...] = ()
    runs: bool = False


def steps(command: str, writers: tuple[str, ...] = (), depth: int = 0) -> list[Step]:
    """Each segment of a command as a `Step` (`writers`: a harness's own programs that write, like Codex's
    shell-level `apply_patch`).

    >>> [s.effect for s in steps("pytest -q 2>&1 | tee test.log")]
    ['check', 'check']
    >>> steps("sh -c 'echo hi > a.txt' && cat a.txt")  # doctest: +NORMALIZE_WHITESPACE
    [Step(effect='change', files=('a.txt',), runs=False),
     Step(effect='check', files=('a.txt',), runs=False)]
    """
    found = []
    for pipeline in pipelines(command):
        if is_test_run(pipeline[0]):
            found += [Step("check", runs=True)] * len(pipeline)
            continue
        for segment in pipeline:
            inner = script(segment) if depth < NESTING_LIMIT else None
            if inner is not None:
                found += steps(inner, writers, depth + 1) or [Step("")]
            elif is_change(segment, writers):
                found.append(Step("change", written(segment, writers)))
            elif is_check(segment):
                _, args = program(segment)
                found.append(Step("check", tuple(a for a in args if not a.startswith("-")), runs_program(segment)))
            else:
                found.append(Step(""))
    return found


def written(segment: list[str], writers: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The words that may name the files a writing segment writes: its redirections' targets, and the
    arguments of a program that writes by itself.

    >>> written(["echo", "hi", ">", "a.txt"]), written(["cp", "-r", "src", "dst"])
    (('a.txt',), ('src', 'dst'))
    """
    targets = [segment[n + 1] for n, word in enumerate(segment[:-1]) if word in REDIRECTS]
    # the segment without its redirections, output or input (`> f`, `< f`, `<<EOF`), and their words
    redirects = REDIRECTS | INPUTS
    rest = [w for n, w in enumerate(segment) if w not in redirects and (n == 0 or segment[n - 1] not in redirects)]
    _, args = program(rest)
    itself = is_change(rest, writers)
    return tuple(targets + ([a for a in args if not a.startswith("-")] if itself else []))


def runs_program(segment: list[str]) -> bool:
    """Whether a checking segment runs a program of the work (`./prog`, `x.py`, `x.sh`, an interpreter on a
    file or module: `python3 solve.py`; `python3 -c` does not count) or reviews the changes (`git diff`).

    >>> runs_program(["./solution"]), runs_program(["python3", "solve.py"]), runs_program(["python3", "-c", "1"])
    (True, True, False)
    """
    name, args = program(segment)
    if name.startswith("./") or name.endswith((".sh", ".py")):
        return True
    if name == "git" and args[:1] in (["diff"], ["status"]):
        return True
    return name in INTERPRETERS and bool(args) and (not args[0].startswith("-") or args[0] == "-m")


def is_check(segment: list[str]) -> bool:
    """Whether a segment that does not write reads or runs something that checks the work.

    >>> is_check(["cat", "answer.txt"]), is_check(["./solution"]), is_check(["echo", "done"])
    (True, True, False)
    """
    if is_change(segment):
        return False
    name, _ = program(segment)
    return name in CHECKERS or name.startswith("./") or name.endswith((".sh", ".py"))
