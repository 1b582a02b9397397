"""Runtime estimates, learned when a job gives none. Pure (a caller feeds it finished runs).

A job's estimate is its `expected_duration_s` when it has one; otherwise the estimate learned
for its (team, experiment): a high quantile (`QUANTILE`) of the last `WINDOW` finished runs of
that key, once there are at least `MIN_RUNS` of them; otherwise none. A high quantile because
an estimate is used to promise that a backfilled job ends before a reservation starts, and a
reservation's start from the estimated ends of running jobs: an estimate that is too short
breaks the first promise, one that is too long only wastes a backfill chance.

Never trusted blindly: an attempt running past its estimate has no known end from then on
(RunningView.expected_end in the past means unknown; see broker.policy.backfill).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

QUANTILE = 0.8
WINDOW = 32
MIN_RUNS = 4


class RuntimeHistory:
    """Finished runtimes per key; estimate(key) as the module docstring says."""

    def __init__(self, quantile: float = QUANTILE, window: int = WINDOW, min_runs: int = MIN_RUNS) -> None:
        if not 0.0 < quantile <= 1.0 or window < 1 or not 1 <= min_runs <= window:
            raise ValueError("quantile in (0, 1], window >= 1, 1 <= min_runs <= window")
        self.quantile, self.window, self.min_runs = quantile, window, min_runs
        self._runs: dict[Hashable, deque[float]] = {}
        self._cache: dict[Hashable, float | None] = {}

    def observe(self, key: Hashable, seconds: float) -> None:
        """A run of `key` finished after `seconds` of work."""
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = deque(maxlen=self.window)
        runs.append(seconds)
        self._cache.pop(key, None)

    def estimate(self, key: Hashable) -> float | None:
        """The learned runtime of `key` in seconds, or None when too few runs are known."""
        if key in self._cache:
            return self._cache[key]
        runs = self._runs.get(key)
        est = None
        if runs is not None and len(runs) >= self.min_runs:
            ordered = sorted(runs)
            est = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
        self._cache[key] = est
        return est


def remaining(estimate: float | None, done_s: float) -> float | None:
    """What is left of an estimate after `done_s` of kept progress (None: unknown; an estimate
    already used up is unknown too: the job has outrun it)."""
    if estimate is None or done_s >= estimate:
        return None
    return estimate - done_s
