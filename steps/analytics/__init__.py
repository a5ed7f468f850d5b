"""Behaviour analytics: what an agent did in a rollout, read deterministically from its recorded calls.

Per rollout (`rollout_behaviour`): calls and turns, tool calls by tool, tool coverage, shell versus
dedicated tools, self-verification, plan completion, error recovery, tokens per call, finish reasons.
Per group of rollouts (`summarize_behaviour`): their means. Definitions: docs/analytics.md. The
trajectories step writes one row per rollout into the `behaviour` table;
`python -m steps.analytics --trajectories URL` prints the means.
"""

from steps.analytics.behaviour import METRICS, RolloutBehaviour, behaviour_row, rollout_behaviour, summarize_behaviour

__all__ = ["METRICS", "RolloutBehaviour", "behaviour_row", "rollout_behaviour", "summarize_behaviour"]
