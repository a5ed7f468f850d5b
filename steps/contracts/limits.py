"""What one rollout may leave on the host: the defaults of the run's limit keys, which the sandbox enforces."""

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Bounds:
    """What one rollout may leave on the host besides its sandbox's own disk (`storage_mb`): the run's
    `rollout_log_mb`, `graded_max_files` and `graded_copy_s` (docs/reliability.md, "Limits")."""

    log_bytes: int = 16 * MIB  # each log kept: a command's output, a harness's session logs, /logs/verifier
    graded_files: int = 100_000  # files, folders and links of the graded paths brought to the verifier
    graded_seconds: float = 120.0  # the time that copy may take
