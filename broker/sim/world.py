"""The replay's simulated world (broker.sim.simulator.Simulator is built on it): the
scenario's pools, teams and jobs, the event heap, and what each event does to them: a job
queued (its view as the policy sees it), an attempt started, preempted, stopped and ended
(progress kept by checkpoints, GPU time lost, money spent), rented nodes launched, ready,
interrupted and billed. The event loop and the scheduling cycle are the Simulator's; the
model both follow is in broker.sim.simulator's docstring.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from broker.policy import (
    PendingQueue,
    PendingView,
    Placement,
    RunningView,
    TeamView,
)
from broker.policy.activity import rank_floor
from broker.policy.estimates import RuntimeHistory, remaining
from broker.policy.free_index import FreeIndex
from broker.policy.pools import closed_until
from broker.policy.rebalance import RebalanceConfig
from broker.policy.reclaim_index import ReclaimIndex
from broker.sim.deadlines import SimDeadlines
from broker.sim.intervals import IntervalMeter
from broker.sim.metrics import Recorder
from broker.sim.policies import SimPolicy
from broker.sim.rebalance import SimRebalancer
from broker.sim.scenario import Scenario
from broker.sim.setup import sim_job, sim_pools, team_views
from broker.sim.state import SimAttempt, SimJob, SimNode, SimPool
from broker.sim.trace import TraceJob

# the event kinds, in heap order at equal times
ARRIVE, FINISH, EXIT, READY, INTERRUPT, REMOVE, REOPEN, CYCLE = range(8)
GLOBAL = ""  # the planning scope of a policy without partitions


class SimWorld:
    """The simulated world of one policy over one trace (see the module docstring)."""

    def __init__(self, trace: list[TraceJob], sc: Scenario, pol: SimPolicy,
                 progress: Callable[[float], None] | None = None, detail: bool = False,
                 rebalance: RebalanceConfig | None = None, rebalance_every_s: float = 300.0,
                 rebalance_corrected: bool = False) -> None:
        self.sc, self.pol, self.cfg = sc, pol, pol.config
        # [issue 12 hook] the live broker's rebalancing rules, replayed (broker.sim.rebalance)
        self.rebalancer = (SimRebalancer(self, rebalance, rebalance_every_s, rebalance_corrected)
                           if rebalance else None)
        self.intervals = IntervalMeter(sc, sc.checkpoint_intervals)  # [issue 31] fixed or advised
        self.detail = detail
        self.progress = progress
        self.rng = random.Random(sc.seed)
        self.now = 0.0
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.pending: dict[int, PendingView] = {}
        self.running: dict[int, SimAttempt] = {}
        self.run_ranks: Counter[int] = Counter()
        self.pend_ranks: Counter[int] = Counter()
        # Planning scopes: one, or one per partition (partitions share nothing).
        self.scope_of: Callable[[str], str] = (lambda team: team) if pol.partitioned else (
            lambda team: GLOBAL)
        self.dirty: set[str] = set()
        self.wakes: dict[str, float] = {}
        # each running attempt's current view, per scope (in start order): the snapshot's
        # `running` without walking the attempts (see set_view)
        self.scope_views: dict[str, dict[int, RunningView]] = {}
        # the same views per scope, indexed for preemption (broker.policy.reclaim_index),
        # kept current with scope_views and handed to plan()
        self.reclaim: dict[str, ReclaimIndex] = {}
        self.scope_pending: dict[str, dict[int, PendingView]] = {}
        self.queues: dict[str, PendingQueue] = {}
        self.next_aid = 1
        self.node_counter = 0
        self.cycle_at: float | None = None
        self.last_cycle = -math.inf
        self.teams, self.weights, self.team_of = team_views(sc, trace)
        self.pools = sim_pools(sc, pol, self.weights)
        self.scope_pools: dict[str, list[SimPool]] = {GLOBAL: list(self.pools.values())}
        if pol.partitioned:
            self.scope_pools = {t.name: [] for t in self.teams}
            for sp in self.pools.values():
                for t in sp.teams or ():
                    self.scope_pools[t].append(sp)
        # per scope, the free GPUs of its pools' nodes (broker.policy.free_index), kept
        # current by the pools (SimPool.indexes) and handed to plan()
        self.free_index: dict[str, FreeIndex] = {}
        for scope, pools in self.scope_pools.items():
            ix = self.free_index[scope] = FreeIndex()
            for sp in pools:
                ix.add_pool(sp.name, sp.gpus_per_node)
                for node in sp.nodes.values():
                    ix.add(sp.name, node.id, node.free)
                sp.indexes.append(ix)
        for scope in self.scope_pools:
            self.scope_views[scope], self.scope_pending[scope] = {}, {}
            self.queues[scope] = PendingQueue()
            self.reclaim[scope] = ReclaimIndex(
                (), self.cfg.promote_after_s if self.cfg.classes else None,
                self.cfg.promote_gangs_only)
        self.jobs = [sim_job(sc, i + 1, t, self.team_of) for i, t in enumerate(trace)]
        self.usage = {t.name: 0.0 for t in self.teams}
        self.team_gpus = {t.name: 0 for t in self.teams}
        self.quota_gpus = {t.name: sum(n for _, n in t.quota.nominal) for t in self.teams if t.quota}
        self.usage_at = 0.0
        self._team_views: tuple[TeamView, ...] | None = None
        self.spend = {t.name: 0.0 for t in self.teams}
        self.budgets = {t.name: (t.budget_usd, t.budget_low_fraction) for t in sc.teams
                        if t.budget_usd is not None}
        self.history = RuntimeHistory()
        end = trace[-1].submit_s if trace else 0.0
        self.rec = Recorder(sc, pol.name, window=(trace[0].submit_s if trace else 0.0, end))
        self.horizon = end + sc.drain_limit_s
        self.deadlines = SimDeadlines(self) if sc.deadlines != "none" else None  # [issue 31]

    def push(self, t: float, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def _advance(self, t: float) -> None:
        if t > self.now:
            self.rec.integrate(self.now, t)
            self.now = t

    def _want_cycle(self, at: float) -> None:
        """Schedule a cycle at `at`, or as soon after as the minimum interval allows."""
        at = max(at, self.last_cycle + self.sc.cycle_s)
        if self.cycle_at is None or at < self.cycle_at:
            self.cycle_at = at
            self.push(at, CYCLE, at)

    def _scopes_of(self, p: SimPool) -> list[str]:
        return [GLOBAL] if not self.pol.partitioned else sorted(p.teams or ())

    # -- jobs and attempts --------------------------------------------------------------------
    def _estimate(self, j: SimJob) -> float | None:
        """The job's remaining runtime as the policy sees it (see Scenario.runtime_estimates)."""
        mode = self.sc.runtime_estimates
        if mode == "none":
            return None
        overhead = self.sc.restart_overhead_s if j.attempts else 0.0
        if mode == "exact":
            return overhead + j.remaining
        left = remaining(self.history.estimate((j.team, j.trace.gpus)),
                         j.trace.duration_s - j.remaining)
        return None if left is None else overhead + left

    def _pending_view(self, j: SimJob) -> PendingView:
        g = j.trace.gpus
        gpn = j.trace.gpus_per_node or (g if g <= 8 else 8)
        spot = j.spot if self.deadlines is None else self.deadlines.spot_of(j)  # [issue 31]
        return PendingView(j.jid, j.team, j.cls, gpn, j.trace.submit_s, g // gpn, j.types, spot,
                           j.budget, self._estimate(j), self.sc.checkpoint_interval_s)

    def _enqueue(self, j: SimJob) -> None:
        view = j.view = self._pending_view(j)
        scope = self.scope_of(j.team)
        self.pending[j.jid] = view
        self.scope_pending[scope][j.jid] = view
        self.queues[scope].add(view)
        self.dirty.add(scope)
        self.pend_ranks[j.cls.rank] += 1
        self.rec.queued(view, +1)

    def _start(self, pl: Placement) -> None:
        view = self.pending.pop(pl.job_id)
        scope = self.scope_of(view.team)
        del self.scope_pending[scope][pl.job_id]
        self.queues[scope].remove(view)
        self.pend_ranks[view.priority.rank] -= 1
        if not self.pend_ranks[view.priority.rank]:
            del self.pend_ranks[view.priority.rank]
        self.rec.queued(view, -1)
        j = self.jobs[pl.job_id - 1]
        j.view = None
        j.wait += self.now - j.queued_at
        if j.first_start is None:
            j.first_start = self.now
        overhead = self.sc.restart_overhead_s if j.attempts else 0.0
        est = view.expected_duration_s
        j.attempts += 1
        aid, self.next_aid = self.next_aid, self.next_aid + 1
        ps, iv = self.now + overhead, self.intervals.interval(j)
        rv = RunningView(aid, j.jid, j.team, j.cls, pl.alloc, self.now, view.submit_time,
                         None, j.preemptions, checkpoint_period_s=iv,
                         checkpoint_origin=ps,
                         expected_end=None if est is None else self.now + est)
        a = SimAttempt(j, rv, pl.pool, ps, ps + j.remaining, interval_s=iv)
        self.running[aid] = a
        self.scope_views[scope][aid] = rv
        self.reclaim[scope].add(rv)
        pool = self.pools[pl.pool]
        end = math.inf if rv.expected_end is None else rv.expected_end
        for node_id, g in pl.alloc:
            pool.use(pool.nodes[node_id], g, self.now, aid, end)
        self.team_gpus[j.team] += rv.gpus
        self.run_ranks[rank_floor(j.cls, self.cfg)] += 1
        self.rec.gpus_changed(pool, rv.gpus)
        self.push(a.finish_at, FINISH, (aid, a.finish_at))

    def _preempt(self, a: SimAttempt, for_job: int) -> None:
        self._stop(a, "preemption", self.sc.checkpoint_save_s, self.sc.grace_s)
        self.set_view(a, replace(a.view, stopping=True, stopping_for=for_job))
        pool = self.pools[a.pool]
        for node_id, _g in a.view.alloc:  # its GPUs go to the job it stops for
            pool.expect_end(pool.nodes[node_id], a.view.attempt_id, math.inf, self.now)
        a.job.preemptions += 1
        self.rec.preemptions += 1

    def set_view(self, a: SimAttempt, view: RunningView) -> None:
        """Change a running attempt's view (every change goes through here: scope_views)."""
        scope = self.scope_of(a.job.team)
        self.reclaim[scope].update(a.view, view)
        a.view = view
        self.scope_views[scope][view.attempt_id] = view

    def _stop(self, a: SimAttempt, cause: str, save_s: float, deadline_s: float) -> None:
        """Signal/notice at now: a job that checkpoints on the signal exits after the save;
        the others are killed at the deadline."""
        if a.stop_at is not None:
            return
        a.stop_at, a.cause = self.now, cause
        if a.job.saves_on_signal and save_s <= deadline_s:
            a.saved_at_stop = max(0.0, self.now - a.progress_start)
            exit_at = self.now + save_s
        else:
            exit_at = self.now + deadline_s
        if exit_at < a.finish_at:
            self.push(exit_at, EXIT, a.view.attempt_id)
            pool = self.pools[a.pool]
            for node_id, _g in a.view.alloc:
                node = pool.nodes.get(node_id)
                if node is not None:
                    pool.expect_end(node, a.view.attempt_id, exit_at, self.now)
        # else: it finishes its work before it would have to leave

    def _end(self, a: SimAttempt, completed: bool) -> None:
        del self.running[a.view.attempt_id]
        j, pool, gpus = a.job, self.pools[a.pool], a.view.gpus
        scope = self.scope_of(j.team)
        del self.scope_views[scope][a.view.attempt_id]
        self.reclaim[scope].remove(a.view)
        self.dirty.add(scope)
        for node_id, g in a.view.alloc:
            node = pool.nodes.get(node_id)
            if node is not None:
                pool.use(node, -g, self.now, a.view.attempt_id)
        floor = rank_floor(j.cls, self.cfg)
        self.run_ranks[floor] -= 1
        if not self.run_ranks[floor]:
            del self.run_ranks[floor]
        self.team_gpus[j.team] -= gpus
        self.rec.gpus_changed(pool, -gpus)
        gpu_s = (self.now - a.view.started_at) * gpus
        if pool.rented:
            self.spend[j.team] += gpu_s / 3600.0 * pool.price_per_node_hour / pool.gpus_per_node
        if self.deadlines is not None:
            self.deadlines.ended(j, pool, gpu_s)
        self.intervals.ended(j, self.now - a.view.started_at, min(j.remaining, self.now - a.progress_start),
                             a.interval_s, gpus, not completed and a.cause in ("preemption", "interruption"))
        if completed:
            j.remaining, j.done_at = 0.0, self.now
            if j.last_cause and a.progress_start > a.view.started_at:
                self.rec.lost(j.last_cause, (a.progress_start - a.view.started_at) * gpus)
            self.history.observe((j.team, j.trace.gpus), j.trace.duration_s)
            self.rec.finished(j, gpu_s, pool)
            return
        if a.saved_at_stop is not None:
            kept = a.saved_at_stop
        else:
            progress = max(0.0, self.now - a.progress_start)
            c = a.interval_s
            kept = (progress // c) * c
        kept = min(kept, j.remaining)
        j.remaining -= kept
        self.rec.lost(a.cause or "preemption", gpu_s - kept * gpus)
        self.rec.attempt_gpu_s(pool, gpu_s)
        j.last_cause = a.cause
        j.queued_at = self.now
        if self.rebalancer is not None and self.rebalancer.resume(j):  # [issue 12 hook] moved
            return
        self._enqueue(j)

    # -- rented nodes ----------------------------------------------------------------------------
    def _launch(self, p: SimPool, for_job: int, count: int) -> None:
        """A launch the plan asked for; a pool in a stock-out refuses it and closes."""
        if p.stocked_out(self.now):
            p.closed_until = closed_until(self.now)
            p.view = None
            self.rec.launch_refused += 1
            self.push(p.closed_until, REOPEN, p.name)
            self.dirty.update(self._scopes_of(p))
            self._want_cycle(self.now)
            return
        p.launching.append((for_job, count))
        p.view = None
        self.push(self.now + p.launch_latency_s, READY, (p.name, for_job, count))

    def _ready(self, pool_name: str, for_job: int, count: int) -> None:
        p = self.pools[pool_name]
        if (for_job, count) in p.launching:
            p.launching.remove((for_job, count))
        for _ in range(count):
            self.node_counter += 1
            nid = f"{p.name}-{self.node_counter}"
            p.add_node(SimNode(nid, p.gpus_per_node, 0, self.now,
                               launched_at=self.now - p.launch_latency_s), self.now)
            if p.interruption_rate_per_h > 0:
                gap = self.rng.expovariate(p.interruption_rate_per_h / 3600.0)
                self.push(self.now + gap, INTERRUPT, (p.name, nid))
        p.view = None
        self.dirty.update(self._scopes_of(p))

    def _interrupt(self, pool_name: str, node_id: str) -> None:
        p = self.pools[pool_name]
        node = p.nodes.get(node_id)
        if node is None:
            return
        self.rec.interruptions += 1
        p.drain(node, self.now)  # from the notice on, nothing new is placed there
        notice = self.sc.interruption_notice_s
        for a in list(self.running.values()):
            if a.pool == pool_name and any(n == node_id for n, _ in a.view.alloc):
                self._stop(a, "interruption", self.sc.checkpoint_save_s, notice)
        self.push(self.now + notice, REMOVE, (pool_name, node_id))

    def _bill(self, p: SimPool, node: SimNode) -> None:
        if p.rented:
            hours = (self.now - node.launched_at) / 3600.0
            self.rec.bill(p.name, hours, hours * p.price_per_node_hour,
                          hours * p.on_demand_per_node_hour)
