"""Deadlines in the simulator (issue 31): jobs with a deadline run under one of three modes, so a
replay compares them on the same jobs.

- Which jobs: u = hash(seed, "deadline", job_id) < `deadline_fraction`; a job's deadline is
  its submission plus `deadline_slack` x its trace duration.
- `deadlines: on_demand`: they never use spot (spot policy never); `spot`: only spot (only);
  `aware`: the live broker's rule (broker.policy.deadlines) decides, as broker.control.deadlines
  does: a job that must run safe may not use spot, and a running one on a spot pool is stopped
  (it saves on the signal if it does, as any stop) and requeued, to be placed safe; one running
  on demand that is ahead of its pace again (by a restart: the rule's hysteresis) is stopped
  and requeued to go back to spot, if its own spot policy allows spot. An attempt that would
  finish within a save and a restart is left alone.
- What the rule sees: progress exactly (the trace duration is its total, its kept work plus the
  running attempt's progress its done work: every job reports progress); restart_s is the
  scenario's restart overhead; a running attempt's margin is its progress since its last
  periodic checkpoint (0 for a job that saves on the signal).
- When it is asked: at every enqueue and every planning cycle, for the jobs with a deadline.

Reported (`deadlines` in the result): how many jobs had one, how many finished, how many
missed it (finished after it, or not finished within the replay), their cloud cost and all
their GPU-hours at price (cloud at the pool's price, on-prem at `onprem_usd_per_gpu_hour`),
and the attempts moved off spot.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.policy.deadlines import DeadlineFacts, Where, decide
from broker.sim.scenario import unit_hash
from broker.sim.state import SimAttempt, SimJob, SimPool
from broker.spec import Market, SpotPolicy

if TYPE_CHECKING:
    from broker.sim.world import SimWorld

SAFE = (Where.SAFE, Where.LATE)


class SimDeadlines:
    """The deadline mode of one replay (module docstring)."""

    def __init__(self, sim: SimWorld) -> None:
        self.sim, sc = sim, sim.sc
        self.mode = sc.deadlines
        self.due: dict[int, float] = {}
        for j in sim.jobs:
            if unit_hash(sc.seed, "deadline", j.trace.job_id) < sc.deadline_fraction:
                self.due[j.jid] = j.trace.submit_s + sc.deadline_slack * j.trace.duration_s
        self.where: dict[int, Where] = {}
        self.cloud_usd = 0.0
        self.all_usd = 0.0
        self.moved = 0
        self.moved_back = 0

    def _decide(self, j: SimJob, a: SimAttempt | None) -> Where:
        sim = self.sim
        done = j.trace.duration_s - j.remaining
        margin = 0.0
        if a is not None:
            ran = min(j.remaining, max(0.0, sim.now - a.progress_start))
            done += ran
            margin = 0.0 if j.saves_on_signal else ran % a.interval_s
        d = decide(DeadlineFacts(now=sim.now, start=j.trace.submit_s, deadline=self.due[j.jid],
                                 restart_s=sim.sc.restart_overhead_s, margin_s=margin,
                                 progress=(round(done), max(1, round(j.trace.duration_s)), 1.0),
                                 on_safe=self.where.get(j.jid) in SAFE))
        self.where[j.jid] = d.where
        return d.where

    def spot_of(self, j: SimJob) -> SpotPolicy:
        """The spot policy of `j` as it is queued now."""
        if j.jid not in self.due:
            return j.spot
        if self.mode == "on_demand":
            return SpotPolicy.NEVER
        if self.mode == "spot":
            return SpotPolicy.ONLY
        if j.spot is SpotPolicy.NEVER:
            return SpotPolicy.NEVER
        return SpotPolicy.NEVER if self._decide(j, None) in SAFE else SpotPolicy.ONLY

    def advance(self) -> None:
        """A planning cycle (aware mode): queued jobs that must now run safe lose spot; running
        ones on spot pools that must are stopped and requeued."""
        if self.mode != "aware":
            return
        sim = self.sim
        for jid, view in list(sim.pending.items()):
            if jid in self.due and view.spot is not SpotPolicy.NEVER:
                j = sim.jobs[jid - 1]
                if self._decide(j, None) in SAFE:
                    scope = sim.scope_of(j.team)
                    sim.queues[scope].remove(view)
                    j.view = sim.pending[jid] = sim.scope_pending[scope][jid] = replace(
                        view, spot=SpotPolicy.NEVER)
                    sim.queues[scope].add(j.view)
                    sim.dirty.add(scope)
        for a in list(sim.running.values()):
            j, market = a.job, sim.pools[a.pool].market
            if (j.jid not in self.due or a.stop_at is not None or market is Market.ONPREM
                    or a.finish_at <= sim.now + sim.sc.checkpoint_save_s + sim.sc.restart_overhead_s):
                continue
            where = self._decide(j, a)
            if market is Market.SPOT and where in SAFE:
                self.moved += 1
            elif (market is Market.ON_DEMAND and where is Where.CHEAP and j.spot is not SpotPolicy.NEVER
                  and j.saves_on_signal):  # a move back must not lose work
                self.moved_back += 1
            else:
                continue
            sim._stop(a, "deadline", sim.sc.checkpoint_save_s, sim.sc.grace_s)
            sim.set_view(a, replace(a.view, stopping=True))

    def ended(self, j: SimJob, pool: SimPool, gpu_s: float) -> None:
        """An attempt of `j` ended after `gpu_s` GPU-seconds in `pool`: its cost."""
        if j.jid not in self.due:
            return
        if pool.rented:
            usd = gpu_s / 3600.0 * pool.price_per_node_hour / pool.gpus_per_node
            self.cloud_usd += usd
            self.all_usd += usd
        else:
            self.all_usd += gpu_s / 3600.0 * self.sim.sc.onprem_usd_per_gpu_hour

    def summary(self) -> dict[str, Any]:
        jobs = [self.sim.jobs[jid - 1] for jid in self.due]
        done = [j for j in jobs if j.done_at is not None]
        missed = sum(1 for j in jobs if j.done_at is None or j.done_at > self.due[j.jid])
        return {"mode": self.mode, "jobs": len(jobs), "completed": len(done), "missed": missed,
                "miss_rate": round(missed / len(jobs), 4) if jobs else None,
                "cloud_cost_usd": round(self.cloud_usd, 2), "cost_usd": round(self.all_usd, 2),
                "moved_off_spot": self.moved, "moved_back_to_spot": self.moved_back}
