"""How far behind the weights being trained a sample's calls were served, and which samples are too stale.

With `max_staleness: S` >= 1 the rollouts of iteration n+1 run while update n does, so a rollout may be served
by checkpoint n, then (after the swap) by n+1. The update of iteration N trains the weights served as version
N (`steps.contracts.layout.checkpoint_url`: iteration N serves checkpoint N, stamped N). A sample's staleness is N
minus the oldest version among its calls; one more than S behind is dropped and counted, the rest are trained,
corrected with the recorded logprobs (`steps/update/batch.py`). A version that is not a whole number (an
external upstream's own) says nothing about how far behind it is: such a sample's staleness is unknown, and
it is kept.
"""

from dataclasses import dataclass, field


def versions_behind(trained: int, versions: list[str]) -> int | None:
    """`trained` minus the oldest whole-number version of `versions`; None when none is a whole number.

    >>> versions_behind(3, ["2", "3"]), versions_behind(3, ["3"]), versions_behind(3, []), versions_behind(3, ["v1"])
    (1, 0, None, None)
    """
    numbers = [int(v) for v in versions if isinstance(v, str) and v.isdigit()]
    return trained - min(numbers) if numbers else None


def too_stale(behind: int | None, max_staleness: int | None) -> bool:
    """Whether a sample `behind` versions behind is dropped under `max_staleness` (None: nothing is dropped).

    >>> too_stale(2, 1), too_stale(1, 1), too_stale(None, 1), too_stale(5, None)
    (True, False, False, False)
    """
    return max_staleness is not None and behind is not None and behind > max_staleness


@dataclass
class Staleness:
    """An iteration's staleness figures: of the samples trained and of those dropped."""

    trained_version: int
    max_staleness: int | None = None  # None: nothing is dropped (the synchronous loop)
    behind: dict[int, int] = field(default_factory=dict)  # versions behind -> samples kept
    unknown: int = 0  # kept samples whose versions are not whole numbers
    dropped: int = 0  # samples more than max_staleness behind, not trained
    dropped_rollouts: set[str] = field(default_factory=set)

    def count(self, rollout_id: str, behind: int | None) -> bool:
        """Counts one sample; returns whether it is kept."""
        if too_stale(behind, self.max_staleness):
            self.dropped += 1
            self.dropped_rollouts.add(rollout_id)
            return False
        if behind is None:
            self.unknown += 1
        else:
            self.behind[behind] = self.behind.get(behind, 0) + 1
        return True

    def summary(self) -> dict:
        """The figures the manifest and the report show.

        >>> s = Staleness(trained_version=2, max_staleness=1)
        >>> [s.count("r", b) for b in (0, 1, 1, 2)]
        [True, True, True, False]
        >>> s.summary()
        {'trained_version': 2, 'max_staleness': 1, 'samples': 3, 'max_behind': 1, 'mean_behind': 0.6667, 'behind': {'0': 1, '1': 2}, 'unknown': 0, 'dropped': 1, 'dropped_rollouts': 1}
        """
        known = sum(self.behind.values())
        return {"trained_version": self.trained_version, "max_staleness": self.max_staleness,
                "samples": known + self.unknown, "max_behind": max(self.behind, default=None),
                "mean_behind": round(sum(b * n for b, n in self.behind.items()) / known, 4) if known else None,
                "behind": {str(b): n for b, n in sorted(self.behind.items())}, "unknown": self.unknown,
                "dropped": self.dropped, "dropped_rollouts": len(self.dropped_rollouts)}
