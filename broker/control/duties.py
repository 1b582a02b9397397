"""The engine's periodic duties, each ONE method run either by the leader's schedule or by
the cycle (broker.control.scheduled; issue 12).

Contract:

- `duties_scheduled` false (an engine cycled directly: tests, `onepool broker --once`):
  every cycle runs every duty, as the cycle always did. True (set by TaskScheduler.attach in
  the leader's loop, cleared when it stops leading): the cycle runs none of them; each runs
  when its task comes due, every `broker.tasks.<name>_s`.
- Money: the ledger is charged up to now in EVERY cycle either way (placement under team
  budgets, `onepool spend` and the dashboard read it), and so are the team budget states the
  plan applies (an exhausted team gets nothing new placed, a low one only spot, at once).
  Enforcement (stopping running work over a job's or team's budget, recording team budget
  state changes) is the duty: it charges up to its own `now` first, so it stops every
  attempt whose spend reached its budget then. A scheduled run is late by at most
  `enforce_budgets_s`.
- Scale-down: the policy's rule (broker.policy.plan: an idle rented node whose pool's
  idle_timeout_s has passed and that the plan does not fill) decides; the cycle acts on the
  plan's terminations, or the duty plans on a fresh snapshot and acts only on them.
- Orphan sweeps are cloud calls: they stay on each pool's cloud worker thread
  (broker.control.cloud_worker). The duty asks every worker for a sweep at its next round;
  unscheduled, each worker sweeps every `sweep_orphans_s` on its own (and always at start).
- Fair share: the duty computes every team's decayed usage from its attempts; a scheduled
  cycle carries it forward to its own time (broker.control.snapshots.build_snapshot).
- Checkpoint retention: broker.control.retention.run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sqlmodel import Session

from broker.control import budgets, holds, retention
from broker.control.snapshots import FairShareUsage, team_usage
from broker.policy import Plan, Snapshot, plan
from broker.spec import ClusterConfig

if TYPE_CHECKING:
    from broker.control.engine import Engine


class Duties:
    """Mixed into Engine: its periodic duties and the snapshot the cycle and they plan on."""

    duties_scheduled: bool = False  # a TaskScheduler drives the duties (TaskScheduler.attach)
    fair_share: FairShareUsage | None = None  # as of the last decay_fair_share

    # -- money ----------------------------------------------------------------------------
    def charge(self: Engine, now: float) -> None:
        """A scheduled cycle's money step: charge the ledger up to `now` and read the team
        budgets the plan applies (enforce_budgets does both in an unscheduled one)."""
        with self.store.session() as s:
            self.team_budgets = budgets.team_budgets(s, budgets.charge(s, now), now)

    def enforce_budgets(self: Engine, now: float) -> None:
        """The duty: charge up to `now`, then stop running attempts over their job's or team's
        budget (reason "budget") and record team budget state changes once."""
        with self.store.session() as s:
            self.team_budgets = self._enforce(s, budgets.charge(s, now), now)

    def _enforce(self: Engine, s: Session, cfg: ClusterConfig, now: float) -> list[budgets.TeamBudget]:
        previous = self._team_budget_state
        found = budgets.enforce(s, cfg, now, self._request_stop, previous)
        previous.clear()
        previous.update({b.team: b.state for b in found})
        return found

    # -- checkpoints, fair share ------------------------------------------------------------
    def retain_checkpoints(self: Engine, now: float) -> None:
        """The duty: delete checkpoints out of the newest `keep_checkpoints` and abandoned
        uploads, after `checkpoint_delete_delay_s` (broker.control.retention)."""
        with self.store.session() as s:
            retention.run(s, now, keep=self.settings.keep_checkpoints,
                          delay_s=self.settings.checkpoint_delete_delay_s)

    def decay_fair_share(self: Engine, now: float) -> None:
        """The duty: every team's decayed usage at `now`, from its attempts."""
        with self.store.session() as s:
            self.fair_share = team_usage(s, now, self.settings.fair_share_half_life_s)

    # -- rented capacity --------------------------------------------------------------------
    def scale_down(self: Engine, now: float) -> list[str]:
        """The duty: give back the idle rented nodes the plan would give back now. Returns
        their ids."""
        if not self.capacity.pools:
            return []
        with self.store.session() as s:
            p = plan(self.snapshot(s, now))
        self.capacity.apply(Plan(terminations=p.terminations), now)
        return list(p.terminations)

    def sweep_orphans(self: Engine, now: float) -> None:
        """The duty: every rented pool's cloud worker sweeps orphans at its next round."""
        self.capacity.request_sweeps()

    # -- the snapshot both plan on ----------------------------------------------------------
    def snapshot(self: Engine, s: Session, now: float) -> Snapshot:
        """What the policy sees now: the database, rented pools' growth and prices, team
        budgets, in-flight moves' GPUs held."""
        usage = self.fair_share
        if usage is not None and usage.at > now:  # computed at a later instant: compute now
            usage = None
        kept = self.kept  # issue 27: what changed since the last cycle (broker.control.kept)
        kept.refresh(s, self.lease.fencing)
        snap = kept.snapshot(s, now, self.policy, self.settings.fair_share_half_life_s, usage)
        snap = self.capacity.extend(snap, now)  # [issue 4 hook] rented pools' growth and prices
        snap = budgets.restrict(snap, self.team_budgets)  # money (issue 6): low teams spot-only
        snap, self.held = holds.hold(snap, s, kept.waiting())  # [issue 29 hook] array limits
        return kept.sync_queue(self.rebalancer.hold(snap, s))  # [issue 12 hook] moves' GPUs held

    def cycle_plan(self: Engine, p: Plan) -> Plan:
        """What of the plan the cycle applies to rented capacity: all of it, or (duties
        scheduled) all but the idle terminations, which scale_down gives back."""
        return replace(p, terminations=()) if self.duties_scheduled else p
