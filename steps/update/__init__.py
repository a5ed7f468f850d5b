"""The update step: veRL's TrainingWorker on one iteration's samples, writing the next checkpoint.

`train` runs it (`python -m steps.update`), `config` reads and checks its settings, `batch` turns samples
into veRL's batch (advantages, rollout-logprob correction), `cpu` holds what changes without a GPU.
"""
