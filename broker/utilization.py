"""GPU utilization of attempts, from the samples their agents send (issue 30).

An agent samples each GPU (NVML) every few seconds and, with every sync, reports per rank
the mean utilization of that rank's GPUs since its previous report (broker.agent.gpu_util).
The server keeps it downsampled: per rank its newest report; per attempt the newest mean over
its ranks, a time-weighted mean over its life (`gpu_util_mean_pct` over `gpu_util_s` seconds
sampled), and `gpu_idle_since`: since when that newest mean has been below IDLE_PCT without
interruption. An attempt that holds GPUs below IDLE_PCT for IDLE_AFTER_S is **held but idle**
(`onepool status JOB`, the metrics `onepool_gpus_held_idle` and `onepool_jobs_held_idle`).

No import of the database layer here beyond the row types: the fast `status` reader and the
views use `held_idle` on plain rows too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

IDLE_PCT = 5.0  # below this mean utilization a GPU counts as idle
IDLE_AFTER_S = 600.0  # held that long below IDLE_PCT: held but idle
# A gap between two reports longer than this (an agent that was away) is not counted as
# sampled time: the mean weighs what was measured, not a guess.
MAX_GAP_S = 60.0


def held_idle(a: Any, now: float) -> bool:
    """Whether attempt row `a` (Attempt or a row with its columns) holds GPUs idle: not ended,
    below IDLE_PCT since at least IDLE_AFTER_S ago."""
    since = getattr(a, "gpu_idle_since", None)
    return a.ended_at is None and since is not None and now - since >= IDLE_AFTER_S


def update_attempt(a: Any, rank_pcts: Iterable[float | None], now: float) -> None:
    """Fold the newest samples of attempt `a`'s ranks (None: that rank has none yet) into its
    utilization columns at `now`. Nothing changes when no rank has a sample."""
    got = [p for p in rank_pcts if p is not None]
    if not got:
        return
    pct = sum(got) / len(got)
    if a.gpu_util_at is not None and a.gpu_util_pct is not None:
        dt = now - a.gpu_util_at
        if 0 < dt <= MAX_GAP_S:  # the previous value held over [gpu_util_at, now]
            total = a.gpu_util_s + dt
            a.gpu_util_mean_pct = ((a.gpu_util_mean_pct or 0.0) * a.gpu_util_s + a.gpu_util_pct * dt) / total
            a.gpu_util_s = total
    if a.gpu_util_mean_pct is None:
        a.gpu_util_mean_pct = pct
    a.gpu_util_pct, a.gpu_util_at = pct, now
    if pct >= IDLE_PCT:
        a.gpu_idle_since = None
    elif a.gpu_idle_since is None:
        a.gpu_idle_since = now
