"""Grading: a task's verifier (and, to check a dataset, its oracle) run in a sandbox, and the reward it writes.

It sits above both things it joins: `steps.tasks` (the task format) and `steps.sandbox` (where commands run, for a
task); neither imports it. `verify` runs the verifier and reads its reward; `check` runs each task's oracle
through its own verifier (`python -m steps.tasks check DATASET`).
"""
