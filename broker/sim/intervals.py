"""Checkpoint intervals in the simulator (issue 31): fixed, or advised per attempt at its start
by the live broker's rule (broker.policy.intervals) from what the replay measured so far, as
broker.control.intervals does from the database.

- fixed: every attempt checkpoints every `checkpoint_interval_s` of progress.
- advised: an attempt gets advise(IntervalFacts(...)).interval_s at its start, from the
  scenario's save time (`checkpoint_save_s`: every save costs that, as measured), its class's
  running seconds and stops (preemptions and interruptions) so far, and the catalog prior: the
  mean reclaim rate of the pools its spot policy allows (0 on-prem and on demand).

Time spent saving is counted, not simulated: each attempt's periodic saves (one per interval
of progress) cost `checkpoint_save_s` x its GPUs, reported as `saving_gpu_hours`; a job's
progress is not slowed by them (as with broker.runtime's background uploads).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from broker.policy.intervals import IntervalFacts, advise
from broker.sim.scenario import Scenario
from broker.sim.state import SimJob
from broker.spec import Market, Priority, SpotPolicy, market_ok

Mode = Literal["fixed", "advised"]


class IntervalMeter:
    """The interval each attempt uses, and the saving and stops it measured."""

    def __init__(self, sc: Scenario, mode: Mode = "fixed") -> None:
        if mode not in ("fixed", "advised"):
            raise ValueError(f"checkpoint intervals: must be fixed or advised (got {mode!r})")
        self.mode, self.save_s, self.fixed_s = mode, sc.checkpoint_save_s, sc.checkpoint_interval_s
        rates = [(Market.ONPREM, 0.0) for _ in sc.onprem] + [
            (p.market, p.interruption_rate_per_h if p.market is Market.SPOT else 0.0) for p in sc.cloud]
        self.prior: dict[SpotPolicy, float] = {}
        for sp in SpotPolicy:
            ok = [r for m, r in rates if market_ok(sp, m)]
            self.prior[sp] = sum(ok) / len(ok) if ok else 0.0
        self.run_s: dict[Priority, float] = defaultdict(float)
        self.stops: dict[Priority, int] = defaultdict(int)
        self.saving_gpu_s = 0.0
        self.attempts = 0
        self.interval_sum_s = 0.0

    def interval(self, j: SimJob) -> float:
        """The interval of the attempt `j` starts now."""
        if self.mode == "fixed":
            s = self.fixed_s
        else:
            s = advise(IntervalFacts(save_s=self.save_s, run_s=self.run_s[j.cls], stops=self.stops[j.cls],
                                     prior_rate_per_h=self.prior[j.spot])).interval_s
        self.attempts += 1
        self.interval_sum_s += s
        return s

    def ended(self, j: SimJob, ran_s: float, progress_s: float, interval_s: float, gpus: int,
              stopped: bool) -> None:
        """An attempt of `j` ended after `ran_s` seconds with `progress_s` of progress (periodic
        saves: one per interval of it); `stopped`: by a preemption or an interruption."""
        self.run_s[j.cls] += max(0.0, ran_s)
        self.stops[j.cls] += int(stopped)
        self.saving_gpu_s += (max(0.0, progress_s) // interval_s) * self.save_s * gpus

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "saving_gpu_hours": round(self.saving_gpu_s / 3600, 2),
                "mean_interval_s": round(self.interval_sum_s / max(1, self.attempts), 1),
                "stops_per_run_hour": {c.value: round(self.stops[c] / (self.run_s[c] / 3600), 5)
                                       for c in Priority if self.run_s[c] > 0}}
