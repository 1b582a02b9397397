"""Checkpoint intervals advised from measured costs (issue 31): the facts the live broker
measured for a job, fed to the pure rule of broker.policy.intervals.

What is measured (IntervalFacts):

- save time: the median `save_s` (broker.runtime measures each save from its save() call to
  its commit, which the checkpoint index copies from the manifest) of the newest
  SAVE_WINDOW checkpoints its (team, experiment) wrote itself (copies excluded);
- stops: attempts of its class (the class they ran as) in the pools it may use (its GPU types,
  its spot policy) that started within RATE_WINDOW_S: their running seconds (up to now for
  running ones) and how many ended PREEMPTED, INTERRUPTED or LOST;
- the prior: the mean of those pools' catalog reclaim rates (the snapshot's
  interruption_rate_per_h: the pool's own value, else the Spot Advisor's bucket for its
  instance type, else the default spot rate; 0 on-prem and on demand).

At each start (Engine._launch_one) `at_start` records the advice on the job
(`checkpoint_advice`, shown by `onepool status JOB`); a job submitted with
`checkpoint_interval_s: auto` also takes it as its interval, which the engine hands to the
attempt as ONEPOOL_CHECKPOINT_INTERVAL_S, the value broker.runtime.due() follows (the same
environment reaches a rank on an agent over HTTP).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import case, func
from sqlmodel import Session, col, select

from broker.policy.intervals import Advice, IntervalFacts, advise
from broker.spec import ClusterConfig, Priority, SpotPolicy, market_ok
from broker.state.model import Attempt, Checkpoint, Job
from broker.state.states import CheckpointState, EndReason

SAVE_WINDOW = 32
RATE_WINDOW_S = 30 * 86400.0
STOPS = (EndReason.PREEMPTED, EndReason.INTERRUPTED, EndReason.LOST)


def eligible_pools(cfg: ClusterConfig, job: Job) -> list[str]:
    """The pools the job may run in: of a GPU type it accepts and a market its spot policy allows."""
    spot = SpotPolicy(job.spot)
    return [p.name for p in cfg.pools
            if (not job.gpu_types or p.gpu_type in job.gpu_types) and market_ok(spot, p.market)]


def measured_save_s(s: Session, team: str, experiment: str) -> float | None:
    """The median measured save time of the newest SAVE_WINDOW own checkpoints of (team,
    experiment); None when none was measured."""
    rows = s.exec(select(Checkpoint.save_s).join(Job, col(Job.id) == Checkpoint.job_id)
                  .where(Job.team == team, Job.experiment == experiment,
                         col(Checkpoint.save_s).is_not(None), col(Checkpoint.copied_from).is_(None),
                         Checkpoint.state != CheckpointState.PARTIAL)
                  .order_by(col(Checkpoint.observed_at).desc()).limit(SAVE_WINDOW)).all()
    vals = [float(v) for v in rows if v is not None]
    return statistics.median(vals) if vals else None


@dataclass
class CycleInputs:
    """What one engine cycle hands every start: the pools' reclaim rates (the snapshot's) and
    the stop counts already read this cycle, per (class, pools): a cycle that starts many
    jobs scans the attempts once per class and pool set. Made afresh at every snapshot (a move
    the rebalancer places before it uses the previous cycle's)."""

    pool_rates: Mapping[str, float] = field(default_factory=dict)
    stops: dict[tuple[str, tuple[str, ...]], tuple[float, int]] = field(default_factory=dict)


def stop_rate(s: Session, cls: str, pools: tuple[str, ...], now: float) -> tuple[float, int]:
    """(running seconds, stops) of attempts of class `cls` in `pools` that started within
    RATE_WINDOW_S of `now` (running ones up to now)."""
    row = s.exec(select(
        func.coalesce(func.sum(func.coalesce(Attempt.ended_at, now) - Attempt.started_at), 0.0),
        func.coalesce(func.sum(case((col(Attempt.end_reason).in_([r.value for r in STOPS]), 1),
                                    else_=0)), 0))
        .where(Attempt.priority == cls, col(Attempt.pool).in_(pools),
               Attempt.started_at >= now - RATE_WINDOW_S)).one()
    return max(0.0, float(row[0])), int(row[1])


def facts(s: Session, cfg: ClusterConfig, job: Job, inputs: CycleInputs, now: float) -> IntervalFacts:
    """What was measured for `job` (module docstring)."""
    pools = tuple(eligible_pools(cfg, job))
    run_s, stops = 0.0, 0
    if pools:
        key = (Priority(job.priority).value, pools)
        if key not in inputs.stops:
            inputs.stops[key] = stop_rate(s, key[0], pools, now)
        run_s, stops = inputs.stops[key]
    prior = sum(inputs.pool_rates.get(p, 0.0) for p in pools) / len(pools) if pools else 0.0
    return IntervalFacts(save_s=measured_save_s(s, job.team, job.experiment), run_s=run_s, stops=stops,
                         prior_rate_per_h=prior)


def at_start(s: Session, cfg: ClusterConfig, job: Job, inputs: CycleInputs, now: float) -> Advice:
    """Advise the job's interval as it starts an attempt: record it on the job, and make it the
    interval in force when the job asked for `auto` (the caller adds the row to the session)."""
    a = advise(facts(s, cfg, job, inputs, now))
    job.checkpoint_advice = a.to_record(now)
    if job.checkpoint_auto:
        job.checkpoint_interval_s = a.interval_s
    return a
