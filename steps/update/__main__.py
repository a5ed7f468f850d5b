"""`python -m steps.update`: the policy update step. A skip provable from the samples alone (`steps.update.skip`)
is written before torch is imported; anything else runs the update (`steps.update.train`)."""

import os
import sys

from steps.update import skip


def main(argv: list[str] | None = None) -> int:
    """The skip when it is provable, else the update; the exit code either way."""
    code = skip.main(argv)
    if code is not None:
        if argv is None:  # a process of its own (not a caller's): it ends here
            _end(code)
        return code
    from steps.update.train import main as update

    return update(argv)


def _end(code: int) -> None:
    """Ends the process with `code` once its output is flushed, without the interpreter's teardown. A rank with
    nothing to write (every rank but 0 of a skip) exits milliseconds after reading the samples; once on CI such a rank was killed
    at teardown (SIGABRT, "terminate called without an active exception": a C++ thread left joinable, most likely
    one of pyarrow's reader threads still winding down), which torchrun reports as a failed rank. Nothing is left
    to tear down here: every file was closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
