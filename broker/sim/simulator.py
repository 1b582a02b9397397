"""The discrete-event replay. Every scheduling decision is broker.policy.plan(), and every rule
around it (can anything act, fair-share decay, budget restriction, pool closing, draining
nodes, runtime estimates) is broker.policy's; this file only moves simulated time (the event
loop) and runs the scheduling cycle; what each event does to jobs, attempts and nodes is
broker.sim.world.SimWorld's.

Model:
- A job's work is its trace duration. An attempt makes progress from its start plus the
  restart overhead (paid by every attempt after the first) and checkpoints every
  `checkpoint_interval_s` of progress.
- A preempted victim gets the signal. A job that checkpoints on the signal (the scenario's
  `checkpoint_on_signal` share of jobs, by hash) saves its progress and exits
  `checkpoint_save_s` later; the others are killed after `grace_s` and keep only their last
  periodic checkpoint. A spot node's interruption works the same way with
  `interruption_notice_s` (drawn per node as exponential gaps at the pool's rate, seeded);
  from its notice on, the node takes no new work.
- A rented pool in a stock-out (the scenario's `stockouts_per_day`, seeded windows) refuses
  launches: the pool closes for the policy's backoff and the next plan takes the next offer.
- Lost GPU time of an attempt = its GPU time not turned into kept progress (drain, unsaved
  work, restart overhead), attributed to its cause (preemption or interruption).
- Plans run at most every `cycle_s` of simulated time, when something changed (arrival, exit,
  node up/down, a pool reopening) and plan() could act (broker.policy.activity), and at the
  plan's own `wake_at` (a time rule: minimum run time, waiting before renting, idle timeout,
  aging, an estimate overrun), exactly then, with no polling.
"""

from __future__ import annotations

import heapq
from operator import attrgetter
from typing import Any

from broker.policy import (
    PoolView,
    Snapshot,
    TeamView,
    plan,
)
from broker.policy.activity import Activity, can_act
from broker.policy.budget import restrict, team_budget_state
from broker.policy.fairshare import decay
from broker.policy.pools import capped, could_ever_run
from broker.sim.state import SimJob, SimPool
from broker.sim.world import ARRIVE, CYCLE, EXIT, FINISH, GLOBAL, INTERRUPT, READY, REMOVE, REOPEN, SimWorld

_VIEW = attrgetter("view")


class Simulator(SimWorld):
    """One policy over one trace. `run()` returns the metrics dict (see metrics.Recorder)."""

    # -- the event loop ----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        for j in self.jobs:
            self.push(j.trace.submit_s, ARRIVE, j)
        n_total = len(self.jobs)
        next_report = 0
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            if t > self.horizon:
                break
            self._advance(t)
            if kind == CYCLE:
                if data != self.cycle_at:
                    continue  # superseded by an earlier cycle
                self.cycle_at = None
                self._cycle()
            else:
                self._event(kind, data)
                self._want_cycle(self.now)
            if self.progress and self.rec.completed >= next_report:
                self.progress(self.rec.completed / max(1, n_total))
                next_report = self.rec.completed + max(1, n_total // 200)
        self._advance(min(self.now, self.horizon))
        for p in self.pools.values():
            for node in list(p.nodes.values()):
                self._bill(p, node)
        if self.progress:
            self.progress(1.0)
        out = self.rec.result(self.jobs, self.pending, self.running, self.detail)
        out["checkpoints"] = self.intervals.summary()
        if self.deadlines is not None:
            out["deadlines"] = self.deadlines.summary()
        if self.rebalancer is not None:  # [issue 12 hook]
            rb = self.rebalancer
            out["rebalance"] = {"moves": rb.moves, "defrag_moves": rb.defrag_moves,
                                "expected_net_saving_usd": round(rb.expected_net_usd, 2),
                                "expected_breakdown": rb.breakdown(),
                                "lost_gpu_hours_rebalance": round(
                                    self.rec.lost_gpu_s.get("rebalance", 0.0) / 3600, 2)}
        return out

    def _event(self, kind: int, data: Any) -> None:
        if kind == ARRIVE:
            self._arrive(data)
        elif kind == FINISH:
            aid, finish_at = data
            a = self.running.get(aid)
            if a is not None and a.finish_at == finish_at:
                self._end(a, completed=True)
        elif kind == EXIT:
            a = self.running.get(data)
            if a is not None:
                self._end(a, completed=False)
        elif kind == READY:
            self._ready(*data)
        elif kind == INTERRUPT:
            self._interrupt(*data)
        elif kind == REMOVE:
            pool, node_id = data
            p = self.pools[pool]
            node = p.drop_node(node_id)
            if node is not None:
                self._bill(p, node)
            self.dirty.update(self._scopes_of(p))
        elif kind == REOPEN:
            p = self.pools[data]
            p.view = None  # its cap on growth lifts (broker.policy.pools.capped)
            self.dirty.update(self._scopes_of(p))

    def _arrive(self, j: SimJob) -> None:
        pools = [self._pool_view(p) for p in self.scope_pools[self.scope_of(j.team)]]
        if not could_ever_run(j.trace.gpus, j.types, j.team, pools):
            self.rec.unplaceable(j)
            return
        q = self.quota_gpus.get(j.team)  # per GPU type: their sum (exact for quotas in total)
        j.within_quota = q is not None and self.team_gpus[j.team] + j.trace.gpus <= q
        self._enqueue(j)

    # -- a scheduling cycle --------------------------------------------------------------------
    def _cycle(self) -> None:
        self.last_cycle = self.now
        if self.deadlines is not None:  # [issue 31] jobs with deadlines that must run safe
            self.deadlines.advance()
        self._decay_usage()
        self._team_views = None  # usage moved on: built again on first need in this cycle
        due = {s for s, t in self.wakes.items() if t <= self.now}
        for s in due:
            del self.wakes[s]
        scopes, self.dirty = sorted(self.dirty | due), set()  # what planning dirties: next cycle
        for scope in scopes:
            self._plan_scope(scope)
        self.rec.after_cycle(self.pools)
        if self.wakes:
            self._want_cycle(min(self.wakes.values()))

    def _activity(self, scope: str) -> Activity:
        pools = self.scope_pools[scope]
        pending = self.scope_pending[scope]
        shapes = self.rec.shapes
        smallest = min((g for g, _, _, t in shapes if scope == GLOBAL or t == scope), default=0)
        return Activity(
            pending=len(pending),
            fits=bool(pending) and any(p.fits(smallest, 1) for p in pools),
            top_pending_rank=max(self.pend_ranks) if self.pend_ranks else None,
            lowest_running_rank=min(self.run_ranks) if self.run_ranks else None,
            rented_pools=any(p.rented for p in pools),
            rented_nodes=any(p.rented and p.nodes for p in pools))

    def _plan_scope(self, scope: str) -> None:
        """One plan() over the scope's pools, running attempts and waiting jobs; apply it."""
        due = self.rebalancer is not None and self.rebalancer.wants_turn(self.scope_pending[scope].values())
        if not can_act(self._activity(scope), self.cfg) and not due:
            self._rebalance_wake(scope)
            return
        pending = self.scope_pending[scope]
        snap = Snapshot(
            now=self.now,
            pools=tuple(self._pool_view(p) for p in self.scope_pools[scope]),
            running=tuple(self.scope_views[scope].values()),
            pending=tuple(pending.values()),
            teams=self._teams_now(),
            config=self.cfg,
            queue=self.queues[scope],
            free_index=self.free_index[scope],
            reclaim_index=self.reclaim[scope],
        )
        if self.budgets:
            snap = restrict(snap, {t: team_budget_state(a, self.spend[t], low)
                                   for t, (a, low) in self.budgets.items()})
        p = plan(snap, explain=False)
        if p.wake_at is not None:
            self.wakes[scope] = p.wake_at
        for jid in p.demoted:
            self.jobs[jid - 1].demoted = True
        for pre in p.preemptions:
            self._preempt(self.running[pre.attempt_id], pre.for_job_id)
        for node_id in p.terminations:
            pool = self.pools[node_id.rsplit("-", 1)[0]]
            node = pool.drop_node(node_id)
            if node is not None:
                self._bill(pool, node)
        for la in p.launches:
            self._launch(self.pools[la.pool], la.for_job_id, la.count)
        for pl in p.placements:
            self._start(pl)
        if self.rebalancer is not None:  # [issue 12 hook]
            self.rebalancer.after_plan(snap, p)
            self._rebalance_wake(scope)

    def _teams_now(self) -> tuple[TeamView, ...]:
        """The teams with their usage as of this cycle (built once per cycle: every scope of a
        partitioned policy plans with the same teams)."""
        if self._team_views is None:
            self._team_views = tuple(TeamView(t.name, t.weight, t.priority_allowance_gpus,
                                              self.usage[t.name], t.quota) for t in self.teams)
        return self._team_views

    def _rebalance_wake(self, scope: str) -> None:
        """[issue 12 hook] wake the scope when a waiting gang becomes due for defragmentation."""
        if self.rebalancer is None:
            return
        turn = self.rebalancer.next_turn(self.scope_pending[scope].values())
        if turn is not None and turn > self.now:
            self.wakes[scope] = min(turn, self.wakes.get(scope, turn))

    def _pool_view(self, p: SimPool) -> PoolView:
        if p.view is None:
            nodes = tuple(map(_VIEW, p.nodes.values()))
            alive = len(p.nodes) + sum(n for _, n in p.launching)
            closed = p.closed_until > self.now
            p.view = PoolView(p.name, p.gpu_type, p.gpus_per_node, nodes, p.market,
                              p.price_per_node_hour / p.gpus_per_node, p.teams,
                              capped(p.max_nodes, alive, closed), tuple(p.launching),
                              p.launch_latency_s, p.interruption_rate_per_h, p.idle_timeout_s,
                              closed)
        return p.view

    def _decay_usage(self) -> None:
        """Advance every team's decayed GPU-seconds to now (broker.policy.fairshare.decay)."""
        dt = self.now - self.usage_at
        if dt <= 0:
            return
        h = self.cfg.fair_share_half_life_s
        for t in self.usage:
            self.usage[t] = decay(self.usage[t], self.team_gpus[t], dt, h)
        self.usage_at = self.now
