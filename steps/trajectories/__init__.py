"""Trajectories: recorded calls and rollout results as Parquet tables, and the training samples built
from them token-exactly. See `docs/trajectories.md` and `python -m steps.trajectories --help`. The tables'
schemas and files are the floor's (`steps.contracts.tables`, `steps.contracts.table_files`)."""

from steps.trajectories.samples import RolloutSamples, Sample, build_samples

__all__ = ["RolloutSamples", "Sample", "build_samples"]
