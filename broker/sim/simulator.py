"""The discrete-event replay. Every scheduling decision is broker.policy.plan(), and every rule
around it (can anything act, fair-share decay, budget restriction, pool closing, draining
nodes, runtime estimates) is broker.policy's; this file only moves simulated time, jobs and
nodes.

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
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter
from typing import Any

from broker.policy import (
    PendingQueue,
    PendingView,
    Placement,
    PoolView,
    RunningView,
    Snapshot,
    TeamView,
    plan,
)
from broker.policy.activity import Activity, can_act, rank_floor
from broker.policy.budget import restrict, team_budget_state
from broker.policy.estimates import RuntimeHistory, remaining
from broker.policy.fairshare import decay
from broker.policy.free_index import FreeIndex
from broker.policy.pools import capped, closed_until, could_ever_run
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

ARRIVE, FINISH, EXIT, READY, INTERRUPT, REMOVE, REOPEN, CYCLE = range(8)
_VIEW = attrgetter("view")
GLOBAL = ""  # the planning scope of a policy without partitions


class Simulator:
    """One policy over one trace. `run()` returns the metrics dict (see metrics.Recorder)."""

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

    # -- the event loop ----------------------------------------------------------------------
    def push(self, t: float, kind: int, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

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

    def _scopes_of(self, p: SimPool) -> list[str]:
        return [GLOBAL] if not self.pol.partitioned else sorted(p.teams or ())

    def _arrive(self, j: SimJob) -> None:
        pools = [self._pool_view(p) for p in self.scope_pools[self.scope_of(j.team)]]
        if not could_ever_run(j.trace.gpus, j.types, j.team, pools):
            self.rec.unplaceable(j)
            return
        q = self.quota_gpus.get(j.team)  # per GPU type: their sum (exact for quotas in total)
        j.within_quota = q is not None and self.team_gpus[j.team] + j.trace.gpus <= q
        self._enqueue(j)

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
