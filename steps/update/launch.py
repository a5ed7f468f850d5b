"""`python -m steps.update.launch`: torchrun for the update, its ranks' exit code kept.

    python -m steps.update.launch --standalone --nproc-per-node 2 -m steps.update --trajectories URL ...

The arguments are torchrun's own (`python -m torch.distributed.run`), built by `workflows.commands.update`.
torchrun answers any failed rank with exit code 1 and a traceback of its own; this keeps what the update
says: a refused input stays one sentence and exit code 2 (every rank writes it to its own error file,
`steps.update.ranks.refuse`; the first failed rank's is printed once, whichever rank exited first), and a
rank that failed otherwise is named in one line with its exit code, its log above it.
"""

import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from steps.update.ranks import REFUSED


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv`; exit 0 when every rank did, else the first failed rank's code (2, with its
    sentence, or 1)."""
    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # torchrun sets OMP_NUM_THREADS=1 with a banner when none is set; say it here once, quietly.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, _per_node(args)))))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # its failure dump: ours below
    try:
        run(args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        if failure.exitcode == REFUSED:
            if os.path.isfile(failure.error_file):  # the rank's sentence (`ranks.refuse`); else torchrun's own
                print(failure.message, file=sys.stderr)
            return REFUSED
        print(f"steps.update: rank {rank} failed with exit code {failure.exitcode} (its log is above)",
              file=sys.stderr)
        return 1
    return 0


def _per_node(args) -> int:
    """torchrun's processes per node as a number (its `--nproc-per-node` may also say "gpu", "cpu", "auto")."""
    return int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else 1


if __name__ == "__main__":
    sys.exit(main())
