"""The checkpoint interval a job should use, from what its saves cost and how often it is stopped.

Pure: the caller measures; this module decides (the live broker in broker.control.intervals,
the simulator in broker.sim.intervals).

The rule (Young 1974, Daly 2006). With a save costing `save_s` seconds and a mean time between
interruptions (preemptions, spot reclaims, lost nodes) of M seconds, the interval that wastes
least is Daly's higher-order estimate

    tau = sqrt(2 save M) * (1 + sqrt(save / (2 M)) / 3 + save / (18 M)) - save   (save < 2 M)
    tau = M                                                                      (otherwise)

(Young's sqrt(2 save M) is its first term), clamped to [MIN_INTERVAL_S, MAX_INTERVAL_S].

Where the numbers come from, and the rule when there are none:

- `save_s`: the median measured save time of the job's (team, experiment) checkpoints; with
  none measured yet, DEFAULT_SAVE_S (the simulator's default save time), and `basis` says so.
- The interruption rate: a gamma-Poisson estimate that starts at the catalog's rate for the
  pools the job may run in (`prior_rate_per_h`: 0 on-prem, the Spot Advisor's reclaim rate on
  spot) weighted as PRIOR_HOURS of run time, and moves to the measured rate as the class runs:
  rate = (stops + prior_rate_per_h x PRIOR_HOURS) / (run_hours + PRIOR_HOURS).
- No stop measured and no prior rate (on-prem work that nothing preempts): the rate is 0, M is
  infinite, and the advice is MAX_INTERVAL_S (save rarely; a lost node still costs at most that).

The expected cost of an interval tau, per hour of running (first order, as the formula):
saving takes 3600 x save / tau seconds, and a stop loses tau / 2 of work on average, so
rate_per_h x tau / 2 seconds are lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIN_INTERVAL_S = 60.0
MAX_INTERVAL_S = 4 * 3600.0
DEFAULT_SAVE_S = 30.0
PRIOR_HOURS = 24.0


@dataclass(frozen=True, slots=True)
class IntervalFacts:
    """What the caller measured for one job.

    save_s: median measured save time (None: never measured); run_s: seconds its class ran in
    the pools it may use (attempt-seconds); stops: preemptions, interruptions and lost nodes
    those attempts met; prior_rate_per_h: the catalog's stops per hour for those pools."""

    save_s: float | None
    run_s: float = 0.0
    stops: int = 0
    prior_rate_per_h: float = 0.0

    def __post_init__(self) -> None:
        for name in ("run_s", "prior_rate_per_h"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0 (got {v!r})")
        if self.stops < 0:
            raise ValueError(f"stops: must be >= 0 (got {self.stops!r})")
        if self.save_s is not None and not (math.isfinite(self.save_s) and self.save_s >= 0):
            raise ValueError(f"save_s: must be a finite number >= 0 or None (got {self.save_s!r})")


@dataclass(frozen=True, slots=True)
class Cost:
    """Expected seconds per hour of running: spent saving, and lost to stops."""

    saving_s_per_h: float
    lost_s_per_h: float

    @property
    def total_s_per_h(self) -> float:
        return self.saving_s_per_h + self.lost_s_per_h


@dataclass(frozen=True, slots=True)
class Advice:
    """The advised interval and what it rests on. basis: "measured" (save time and stops both
    measured), "catalog" (stops from the catalog prior only), "default_save" (no save measured:
    DEFAULT_SAVE_S), "no_stops" (rate 0: MAX_INTERVAL_S); several joined by "+"."""

    interval_s: float
    save_s: float
    rate_per_h: float
    basis: str

    @property
    def mtbi_s(self) -> float:
        """Mean time between interruptions (inf when none are expected)."""
        return math.inf if self.rate_per_h <= 0 else 3600.0 / self.rate_per_h

    def to_record(self, now: float) -> dict[str, float | str]:
        """The advice as a job row keeps it (Job.checkpoint_advice), stamped `at` now."""
        return {"interval_s": self.interval_s, "save_s": self.save_s, "rate_per_h": self.rate_per_h,
                "basis": self.basis, "at": now}

    @classmethod
    def from_record(cls, d: Mapping[str, object] | None) -> Advice | None:
        """The advice a job row keeps (None: none yet, or a record this version cannot read)."""
        if not d:
            return None
        try:
            return cls(interval_s=float(d["interval_s"]), save_s=float(d["save_s"]),  # type: ignore[arg-type]
                       rate_per_h=float(d["rate_per_h"]), basis=str(d["basis"]))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return None

    def cost(self, interval_s: float) -> Cost:
        """The expected cost of checkpointing every `interval_s` seconds."""
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0 (got {interval_s!r})")
        return Cost(3600.0 * self.save_s / interval_s, self.rate_per_h * interval_s / 2.0)


def rate_per_h(facts: IntervalFacts) -> float:
    """Stops per running hour: the gamma-Poisson estimate of the module docstring."""
    return (facts.stops + facts.prior_rate_per_h * PRIOR_HOURS) / (facts.run_s / 3600.0 + PRIOR_HOURS)


def daly(save_s: float, mtbi_s: float) -> float:
    """Daly's optimal interval (unclamped) for a save of `save_s` and a mean time between
    interruptions `mtbi_s` (inf: inf)."""
    if math.isinf(mtbi_s):
        return math.inf
    if save_s <= 0:
        return 0.0
    if save_s >= 2 * mtbi_s:
        return mtbi_s
    r = save_s / (2 * mtbi_s)
    return math.sqrt(2 * save_s * mtbi_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s


def advise(facts: IntervalFacts) -> Advice:
    """The advised interval for these facts (module docstring: rule, clamps, no-data rules)."""
    basis = []
    save = DEFAULT_SAVE_S if facts.save_s is None else facts.save_s
    if facts.save_s is None:
        basis.append("default_save")
    rate = rate_per_h(facts)
    if rate <= 0:
        basis.append("no_stops")
    elif facts.stops == 0:
        basis.append("catalog")
    tau = daly(save, 3600.0 / rate) if rate > 0 else math.inf
    tau = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, tau))
    return Advice(interval_s=tau, save_s=save, rate_per_h=rate, basis="+".join(basis) or "measured")
