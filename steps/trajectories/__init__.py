"""Trajectories: recorded calls and rollout results as Parquet tables, and the training samples built
from them token-exactly. See `docs/trajectories.md` and `python -m steps.trajectories --help`."""

from steps.trajectories.io import (
           TrajectoryFileError,
           partition_url,
           read_table,
           write_table,
           write_tables,
)
from steps.trajectories.samples import RolloutSamples, Sample, build_samples
from steps.trajectories.schema import (
           BEHAVIOUR,
           CALLS,
           ROLLOUTS,
           SAMPLES,
           TABLES,
           SchemaError,
           check_schema,
)

__all__ = ["BEHAVIOUR", "CALLS", "ROLLOUTS", "SAMPLES", "TABLES", "RolloutSamples", "Sample", "SchemaError",
           "TrajectoryFileError", "build_samples", "check_schema", "partition_url", "read_table",
           "write_table", "write_tables"]
