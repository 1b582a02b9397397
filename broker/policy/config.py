"""PolicyConfig: a named configuration of the one policy, built in one place.

The knobs a user sets (grace, minimum run time, reservations, ...) are defined once, with their
defaults and validation, in broker.spec.PolicySettings; onepool.yaml's `broker:` section and a
simulation scenario are both PolicySettings, and `PolicyConfig.from_settings` is the only way
the engine and the simulator turn them into a PolicyConfig. The switches that make the
baselines (classes, fair share, preemption, ...) are PolicyConfig fields only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from broker.errors import SpecError
from broker.spec import PolicySettings, validate

_D = PolicySettings()
SETTINGS = tuple(PolicySettings.model_fields)
VICTIM_ORDERS = ("checkpoint", "youngest")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """A named configuration of the one policy. The baselines are settings, not other code.

    - classes: order by priority class (False: plain FIFO by submit time)
    - fair_share: within a class, order teams by decayed usage / weight
    - anti_capture: a team's high/urgent GPUs beyond its allowance are scheduled as normal
    - preemption: preempt strictly lower classes for a blocked job
    - quotas: honour the teams' quotas (broker.policy.quota); False: ignore them (a baseline)
    - victim_order: "checkpoint" (least work lost first) or "youngest" (ignores checkpoints)
    - min_run_s: a job preempted before is safe from preemption for this long after it restarts
    - backfill: later jobs may use capacity the blocked ones cannot
    - reservations: how many blocked jobs (in queue order) get a reservation
    - reserve_gangs_only: only multi-node jobs get reservations (single-node jobs backfill)
    - easy: a reservation holds GPUs only against jobs that would not finish (by their runtime
      estimate) before its estimated start, and holds nothing while that start is unknown
      (EASY backfill, see broker.policy.backfill); False: it holds the free GPUs of its nodes
      against every later job (the rule before EASY, kept for comparison)
    - preemptible_backfill: with easy and preemption, a job of a strictly lower class than a
      reserved job may also use the GPUs its reservation holds (it is preempted at the start
      if still running), when the start is at least its checkpoint interval away
    - preempt_after_s: a job below high preempts only once it has waited this long since
      submission (a few minutes of queue do not cost another job its work; most such jobs
      find capacity meanwhile). High/urgent jobs preempt at once. 0: at once
    - checkpoint_align_s: a job below high whose victims would lose unsaved work, and whose
      victims all save their next periodic checkpoint within this many seconds, waits for
      those checkpoints before preempting (0: never waits; at most half the checkpoint
      interval, or staggered victims could defer it again and again)
    - cloud: launch rented nodes for blocked jobs (see broker.policy.cloud for the rules)
    - cloud_after_wait_s: a job must have waited this long before nodes are rented for it
      (high/urgent jobs: at once)
    - checkpoint_on_signal: the share of victims assumed to checkpoint when signalled (their
      loss is the restart overhead; the others also lose the work since their last checkpoint)
    - restart_overhead_s: time a resumed attempt spends before making progress
    - grace_s: how long a signalled victim has before it is killed
    - fair_share_half_life_s: the decay of usage (broker.policy.fairshare)
    - gpu_hour_value_usd: what a GPU-hour of lost work is worth (preempt-or-buy)
    - wait_value_usd_per_gpu_hour: what an hour of waiting costs a high/urgent job, per GPU
    - rent_horizon_s: how long a rental is assumed to last when a job has no expected duration
    - promote_after_s: aging; a low job waiting this long since submission is scheduled as
      normal (aging never lifts into high or urgent: an aged job would spend its team's
      priority allowance and outrank high work), and an attempt started so keeps
      that class as a victim (broker.policy.reclaim_index.aged). Aging orders the queue (free GPUs,
      reservations, backfill); it grants no right to preempt or to rent on demand: an aged
      job preempts and rents as its own class, as Slurm's age factor orders jobs and leaves
      preemption to QOS (letting it preempt only trades one job of its class for another,
      losing work).
      None: off
    - promote_gangs_only: age only multi-node jobs (the ones backfill starves)
    - oldest_gangs_first: with aging on, multi-node jobs that have waited promote_after_s
      (aged or not, demoted by anti-capture or not) are walked first in their class, oldest
      first whatever their team; fair share orders the rest (broker.policy.queue)
    """

    classes: bool = True
    quotas: bool = True
    fair_share: bool = True
    anti_capture: bool = True
    preemption: bool = True
    victim_order: str = "checkpoint"
    min_run_s: float = _D.min_run_s
    backfill: bool = True
    reservations: int = _D.reservations
    reserve_gangs_only: bool = False
    easy: bool = True
    preemptible_backfill: bool = True
    preempt_after_s: float = _D.preempt_after_s
    checkpoint_align_s: float = _D.checkpoint_align_s
    cloud: bool = True
    cloud_after_wait_s: float = _D.cloud_after_wait_s
    checkpoint_on_signal: float = _D.checkpoint_on_signal
    restart_overhead_s: float = _D.restart_overhead_s
    grace_s: float = _D.grace_s
    fair_share_half_life_s: float = _D.fair_share_half_life_s
    gpu_hour_value_usd: float = 2.0
    wait_value_usd_per_gpu_hour: float = 20.0
    rent_horizon_s: float = 3600.0
    promote_after_s: float | None = _D.promote_after_s
    promote_gangs_only: bool = _D.promote_gangs_only
    oldest_gangs_first: bool = _D.oldest_gangs_first

    @classmethod
    def from_settings(cls, settings: PolicySettings, source: str = "policy",
                      **overrides: Any) -> PolicyConfig:
        """The config for these settings (onepool.yaml's broker section, or a scenario), with
        `overrides` (PolicyConfig fields) on top. Raises SpecError naming an unknown field or
        a bad value, under `source`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(overrides) - fields)
        if bad:
            raise SpecError(source, [f"{source}.{b}: unknown policy field; allowed: "
                                     f"{', '.join(sorted(fields))}" for b in bad])
        if overrides.get("victim_order", "checkpoint") not in VICTIM_ORDERS:
            raise SpecError(source, [f"{source}.victim_order: must be one of "
                                     f"{', '.join(VICTIM_ORDERS)} (got {overrides['victim_order']!r})"])
        checked = validate(PolicySettings, {**{k: getattr(settings, k) for k in SETTINGS},
                                            **{k: v for k, v in overrides.items() if k in SETTINGS}},
                           source)
        values = {k: getattr(checked, k) for k in SETTINGS}
        return cls(**{**values, **{k: v for k, v in overrides.items() if k not in SETTINGS}})
