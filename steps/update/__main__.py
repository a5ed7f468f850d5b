"""`python -m steps.update`: the policy update step. A skip provable from the samples alone (`steps.update.skip`)
is written before torch is imported; anything else runs the update (`steps.update.train`)."""

import sys

from steps.update import skip


def main(argv: list[str] | None = None) -> int:
    """The skip when it is provable, else the update; the exit code either way."""
    code = skip.main(argv)
    if code is not None:
        return code
    from steps.update.train import main as update

    return update(argv)


if __name__ == "__main__":
    sys.exit(main())
