"""The discrete-event replay. Every scheduling decision is broker.policy.plan(); this file
only moves simulated time, jobs and nodes.

Model:
- A job's work is its trace duration. An attempt makes progress from its start plus the
  restart overhead (paid by every attempt after the first) and checkpoints every
  `checkpoint_interval_s` of progress.
- A preempted victim gets the signal: with checkpoint-on-signal it saves its progress and
  exits `checkpoint_save_s` later; without, it is killed after `grace_s` and keeps only its
  last periodic checkpoint. A spot node's interruption works the same way with
  `interruption_notice_s` (drawn per node as exponential gaps at the pool's rate, seeded).
- Lost GPU time of an attempt = its GPU time not turned into kept progress (drain, unsaved
  work, restart overhead), attributed to its cause (preemption or interruption).
- Plans run at most every `cycle_s` of simulated time and only when something changed
  (arrival, exit, node up/down), plus a `tick_s` heartbeat while jobs wait (time-based
  rules: minimum run time, waiting before renting, idle scale-down).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter

from broker.policy import (
    PendingView,
    Placement,
    PoolView,
    RunningView,
    Snapshot,
    TeamView,
    plan,
)
from broker.policy.rebalance import RebalanceConfig
from broker.sim.metrics import Recorder
from broker.sim.policies import SimPolicy
from broker.sim.rebalance import SimRebalancer
from broker.sim.scenario import Scenario, pick_band, unit_hash
from broker.sim.state import SimAttempt, SimJob, SimNode, SimPool
from broker.sim.trace import TraceJob
from broker.spec import Market, Priority, SpotPolicy

ARRIVE, FINISH, EXIT, READY, INTERRUPT, REMOVE, CYCLE = range(7)
_VIEW = attrgetter("view")


class Simulator:
    """One policy over one trace. `run()` returns the metrics dict (see metrics.Recorder)."""

    def __init__(self, trace: list[TraceJob], sc: Scenario, pol: SimPolicy,
                 progress: Callable[[float], None] | None = None, detail: bool = False,
                 rebalance: RebalanceConfig | None = None, rebalance_every_s: float = 300.0) -> None:
        self.sc, self.pol, self.cfg = sc, pol, pol.config
        # [issue 12 hook] the live broker's rebalancing rules, replayed (broker.sim.rebalance)
        self.rebalancer = SimRebalancer(self, rebalance, rebalance_every_s) if rebalance else None
        self.detail = detail
        self.progress = progress
        self.rng = random.Random(sc.seed)
        self.now = 0.0
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.pending: dict[int, PendingView] = {}
        self.running: dict[int, SimAttempt] = {}
        self.run_ranks: Counter[int] = Counter()
        self.pend_ranks: Counter[int] = Counter()
        # Partitioned runs plan each team's partition on its own (see _cycle).
        self.dirty: set[str] = set()
        self.team_running: dict[str, dict[int, SimAttempt]] = {}
        self.team_pending: dict[str, dict[int, PendingView]] = {}
        self.next_aid = 1
        self.node_counter = 0
        self.cycle_at: float | None = None
        self.last_cycle = -math.inf
        self.teams = self._teams(trace)
        self.pools = self._pools()
        self.team_pools: dict[str, list[SimPool]] = {}
        for sp in self.pools.values():
            for t in sp.teams or ():
                self.team_pools.setdefault(t, []).append(sp)
        for tv in self.teams:
            self.team_running[tv.name], self.team_pending[tv.name] = {}, {}
        self.jobs = [self._job(i + 1, t) for i, t in enumerate(trace)]
        self.usage = {t.name: 0.0 for t in self.teams}
        self.team_gpus = {t.name: 0 for t in self.teams}
        self.usage_at = 0.0
        end = trace[-1].submit_s if trace else 0.0
        self.rec = Recorder(sc, pol.name, window=(trace[0].submit_s if trace else 0.0, end))
        self.horizon = end + sc.drain_limit_s

    # -- set-up ------------------------------------------------------------------------------
    def _teams(self, trace: list[TraceJob]) -> tuple[TeamView, ...]:
        by_queue = {q: t.name for t in self.sc.teams for q in t.queues}
        self.team_of = lambda q: by_queue.get(q, self.sc.default_team)
        gh: dict[str, float] = {t.name: 0.0 for t in self.sc.teams}
        for j in trace:
            gh[self.team_of(j.queue)] += j.duration_s * j.gpus
        total = sum(gh.values()) or 1.0
        weights = {t.name: t.weight if t.weight is not None else max(gh[t.name] / total, 1e-3)
                   for t in self.sc.teams}
        wsum = sum(weights.values())
        self.weights = {k: v / wsum for k, v in weights.items()}
        out = []
        for t in self.sc.teams:
            allow = t.priority_allowance_gpus
            if allow is None:
                allow = math.ceil(self.weights[t.name] * self.sc.onprem_gpus
                                  * self.sc.priority_allowance_fraction)
            out.append(TeamView(t.name, self.weights[t.name], allow, 0.0))
        return tuple(out)

    def _pools(self) -> dict[str, SimPool]:
        pools: dict[str, SimPool] = {}
        for p in self.sc.onprem:
            parts = self._partition(p.nodes) if self.pol.partitioned else {None: p.nodes}
            for team, n in parts.items():
                name = p.name if team is None else f"{p.name}/{team}"
                sp = SimPool(name, p.gpu_type, p.gpus_per_node, Market.ONPREM, False,
                             teams=None if team is None else frozenset({team}))
                for i in range(n):
                    sp.add_node(SimNode(f"{name}-{i}", p.gpus_per_node))
                pools[name] = sp
        if self.cfg.cloud:
            for c in self.sc.cloud:
                pools[c.name] = SimPool(
                    c.name, c.gpu_type, c.gpus_per_node, c.market, True, c.price_per_node_hour,
                    c.on_demand_price, c.max_nodes, c.launch_latency_s, c.interruption_rate_per_h,
                    c.idle_timeout_s)
        return pools

    def _partition(self, nodes: int) -> dict[str | None, int]:
        """Nodes per team by weight, largest remainder first (ties by name)."""
        exact = {t: w * nodes for t, w in self.weights.items()}
        got = {t: int(v) for t, v in exact.items()}
        for t in sorted(exact, key=lambda t: (-(exact[t] - got[t]), t))[: nodes - sum(got.values())]:
            got[t] += 1
        return dict(got)

    def _job(self, jid: int, t: TraceJob) -> SimJob:
        sc = self.sc
        cls = pick_band(unit_hash(sc.seed, "class", t.job_id),
                        [(c, sc.classes.get(c, 0.0)) for c in
                         (Priority.URGENT, Priority.HIGH, Priority.NORMAL, Priority.LOW)])
        types = pick_band(unit_hash(sc.seed, "types", t.job_id), list(sc.gpu_types.items()))
        return SimJob(t, jid, self.team_of(t.queue), cls,
                      () if types == "any" else tuple(x.strip() for x in types.split(",")),
                      sc.spot.get(cls, SpotPolicy.ALLOWED), sc.budget_usd.get(cls),
                      t.duration_s, t.submit_s)

    # -- the event loop ----------------------------------------------------------------------
    def push(self, t: float, kind: int, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))

    def run(self) -> dict:
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
                self._want_cycle()
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
        if self.rebalancer is not None:  # [issue 12 hook]
            rb = self.rebalancer
            out["rebalance"] = {"moves": rb.moves, "defrag_moves": rb.defrag_moves,
                                "expected_net_saving_usd": round(rb.expected_net_usd, 2),
                                "lost_gpu_hours_rebalance": round(
                                    self.rec.lost_gpu_s.get("rebalance", 0.0) / 3600, 2)}
        return out

    def _advance(self, t: float) -> None:
        if t > self.now:
            self.rec.integrate(self.now, t)
            self.now = t

    def _want_cycle(self) -> None:
        """Schedule a cycle as soon as the minimum interval allows (earlier than a heartbeat)."""
        at = max(self.now, self.last_cycle + self.sc.cycle_s)
        if self.cycle_at is None or at < self.cycle_at:
            self.cycle_at = at
            self.push(at, CYCLE, at)

    def _event(self, kind: int, data: object) -> None:
        if kind == ARRIVE:
            j: SimJob = data  # type: ignore[assignment]
            if not self._could_ever_run(j):
                self.rec.rejected += 1
                return
            self._enqueue(j)
        elif kind == FINISH:
            aid, finish_at = data  # type: ignore[misc]
            a = self.running.get(aid)
            if a is not None and a.finish_at == finish_at:
                self._end(a, completed=True)
        elif kind == EXIT:
            a = self.running.get(data)  # type: ignore[arg-type]
            if a is not None:
                self._end(a, completed=False)
        elif kind == READY:
            self._ready(*data)  # type: ignore[misc]
        elif kind == INTERRUPT:
            self._interrupt(*data)  # type: ignore[misc]
        elif kind == REMOVE:
            pool, node_id = data  # type: ignore[misc]
            p = self.pools[pool]
            node = p.drop_node(node_id)
            if node is not None:
                self._bill(p, node)

    def _could_ever_run(self, j: SimJob) -> bool:
        g = j.trace.gpus
        for p in self.pools.values():
            if j.types and p.gpu_type not in j.types:
                continue
            if p.teams is not None and j.team not in p.teams:
                continue
            cap_nodes = p.max_nodes if p.rented else len(p.nodes)
            per = min(g, p.gpus_per_node)
            if g % per == 0 and g // per <= (cap_nodes or 0):
                return True
        return False

    def _pending_view(self, j: SimJob) -> PendingView:
        g = j.trace.gpus
        gpn = g if g <= 8 else 8
        return PendingView(j.jid, j.team, j.cls, gpn, j.trace.submit_s, g // gpn, j.types, j.spot,
                           j.budget, j.trace.duration_s if self.sc.known_durations else None,
                           self.sc.checkpoint_interval_s)

    # -- a scheduling cycle --------------------------------------------------------------------
    def _cycle(self) -> None:
        self.last_cycle = self.now
        self._decay_usage()
        if self.pol.partitioned:
            # Partitions share nothing: each is its own cluster, planned only when it changed.
            for team in sorted(self.dirty):
                pools = self.team_pools.get(team, [])
                self._plan_scope(pools, self.team_running[team], self.team_pending[team], team)
            self.dirty.clear()
        else:
            self._plan_scope(list(self.pools.values()), self.running, self.pending, None)
        self.rec.after_cycle(self.pools)
        if self.cycle_at is None and (self.pending or any(pp.rented and pp.nodes
                                                          for pp in self.pools.values())):
            # Time-based rules (min run, waiting before renting, idle timeouts) need a heartbeat.
            self.cycle_at = self.now + self.sc.tick_s
            self.push(self.cycle_at, CYCLE, self.cycle_at)

    def _plan_scope(self, pools: list[SimPool], running: dict[int, SimAttempt],
                    pending: dict[int, PendingView], team: str | None) -> None:
        """One plan() over these pools, running attempts and waiting jobs; apply it."""
        if not self._worth_planning(pools, running, pending, team) and not (
                self.rebalancer is not None and self.rebalancer.wants_turn(pending.values())):
            return
        snap = Snapshot(
            now=self.now,
            pools=tuple(self._pool_view(p) for p in pools),
            running=tuple(a.view for a in running.values()),
            pending=tuple(pending.values()),
            teams=tuple(TeamView(t.name, t.weight, t.priority_allowance_gpus, self.usage[t.name])
                        for t in self.teams),
            config=self.cfg,
        )
        p = plan(snap)
        for pre in p.preemptions:
            self._preempt(self.running[pre.attempt_id], pre.for_job_id)
        for node_id in p.terminations:
            pool = self.pools[node_id.rsplit("-", 1)[0]]
            node = pool.drop_node(node_id)
            if node is not None:
                self._bill(pool, node)
        for la in p.launches:
            pool = self.pools[la.pool]
            pool.launching.append((la.for_job_id, la.count))
            pool.view = None
            self.push(self.now + pool.launch_latency_s, READY, (pool.name, la.for_job_id, la.count))
        for pl in p.placements:
            self._start(pl)
        if self.rebalancer is not None:  # [issue 12 hook]
            self.rebalancer.after_plan(snap, p)

    def _worth_planning(self, pools: list[SimPool], running: dict[int, SimAttempt],
                        pending: dict[int, PendingView], team: str | None) -> bool:
        """False only when plan() provably has nothing to do: no waiting job fits any node's
        free GPUs, none outranks every running job (no preemption), and no rented pool exists.
        Skipping such calls changes no outcome; it only saves time."""
        if any(p.rented for p in pools):
            return bool(pending) or any(p.nodes for p in pools if p.rented)
        if not pending:
            return False
        smallest = min(g for g, _, _, t in self.rec.shapes if team is None or t == team)
        if any(p.fits(smallest, 1) for p in pools):
            return True
        if not self.cfg.preemption or not running:
            return False
        top = max(self.pend_ranks)
        if self.cfg.promote_after_s is not None:
            top = max(top, min(top + 1, Priority.HIGH.rank))  # aging may lift one class
        return top > min(self.run_ranks)

    def _pool_view(self, p: SimPool) -> PoolView:
        if p.view is None:
            nodes = tuple(map(_VIEW, p.nodes.values()))
            p.view = PoolView(p.name, p.gpu_type, p.gpus_per_node, nodes, p.market,
                              p.price_per_node_hour / p.gpus_per_node, p.teams, p.max_nodes,
                              tuple(p.launching), p.launch_latency_s, p.interruption_rate_per_h,
                              p.idle_timeout_s)
        return p.view

    def _decay_usage(self) -> None:
        """Advance every team's decayed GPU-seconds to now (closed form per constant stretch)."""
        dt = self.now - self.usage_at
        if dt <= 0:
            return
        k = math.log(2) / self.sc.fair_share_half_life_s
        f = math.exp(-k * dt)
        for t in self.usage:
            self.usage[t] = self.usage[t] * f + self.team_gpus[t] * (1 - f) / k
        self.usage_at = self.now

    def _rank_floor(self, cls: Priority) -> int:
        """The lowest effective class a running job of this class can have (anti-capture may
        schedule high/urgent work as normal)."""
        if self.cfg.anti_capture and cls.rank > Priority.NORMAL.rank:
            return Priority.NORMAL.rank
        return cls.rank

    def _enqueue(self, j: SimJob) -> None:
        view = self._pending_view(j)
        self.pending[j.jid] = view
        self.team_pending[j.team][j.jid] = view
        self.dirty.add(j.team)
        self.pend_ranks[j.cls.rank] += 1
        self.rec.queued(view, +1)

    def _start(self, pl: Placement) -> None:
        view = self.pending.pop(pl.job_id)
        del self.team_pending[view.team][pl.job_id]
        self.pend_ranks[view.priority.rank] -= 1
        if not self.pend_ranks[view.priority.rank]:
            del self.pend_ranks[view.priority.rank]
        self.rec.queued(view, -1)
        j = self.jobs[pl.job_id - 1]
        j.wait += self.now - j.queued_at
        if j.first_start is None:
            j.first_start = self.now
        overhead = self.sc.restart_overhead_s if j.attempts else 0.0
        j.attempts += 1
        aid, self.next_aid = self.next_aid, self.next_aid + 1
        ps = self.now + overhead
        rv = RunningView(aid, j.jid, j.team, j.cls, pl.alloc, self.now, view.submit_time,
                         None, j.preemptions, checkpoint_period_s=self.sc.checkpoint_interval_s,
                         checkpoint_origin=ps)
        a = SimAttempt(j, rv, pl.pool, ps, ps + j.remaining)
        self.running[aid] = a
        self.team_running[j.team][aid] = a
        pool = self.pools[pl.pool]
        for node_id, g in pl.alloc:
            pool.use(pool.nodes[node_id], g, self.now)
        self.team_gpus[j.team] += rv.gpus
        self.run_ranks[self._rank_floor(j.cls)] += 1
        self.rec.gpus_changed(pool, rv.gpus)
        self.push(a.finish_at, FINISH, (aid, a.finish_at))

    def _preempt(self, a: SimAttempt, for_job: int) -> None:
        self._stop(a, "preemption", self.sc.checkpoint_save_s, self.sc.grace_s)
        a.view = replace(a.view, stopping=True, stopping_for=for_job)
        a.job.preemptions += 1
        self.rec.preemptions += 1

    def _stop(self, a: SimAttempt, cause: str, save_s: float, deadline_s: float) -> None:
        """Signal/notice at now: exit after the save (checkpoint on signal) or the deadline."""
        if a.stop_at is not None:
            return
        a.stop_at, a.cause = self.now, cause
        if self.cfg.checkpoint_on_signal and save_s <= deadline_s:
            a.saved_at_stop = max(0.0, self.now - a.progress_start)
            exit_at = self.now + save_s
        else:
            exit_at = self.now + deadline_s
        if exit_at < a.finish_at:
            self.push(exit_at, EXIT, a.view.attempt_id)
        # else: it finishes its work before it would have to leave

    def _end(self, a: SimAttempt, completed: bool) -> None:
        del self.running[a.view.attempt_id]
        j, pool, gpus = a.job, self.pools[a.pool], a.view.gpus
        del self.team_running[j.team][a.view.attempt_id]
        self.dirty.add(j.team)
        for node_id, g in a.view.alloc:
            node = pool.nodes.get(node_id)
            if node is not None:
                pool.use(node, -g, self.now)
        self.run_ranks[self._rank_floor(j.cls)] -= 1
        if not self.run_ranks[self._rank_floor(j.cls)]:
            del self.run_ranks[self._rank_floor(j.cls)]
        self.team_gpus[j.team] -= gpus
        self.rec.gpus_changed(pool, -gpus)
        gpu_s = (self.now - a.view.started_at) * gpus
        if completed:
            j.remaining, j.done_at = 0.0, self.now
            if j.last_cause and a.progress_start > a.view.started_at:
                self.rec.lost(j.last_cause, (a.progress_start - a.view.started_at) * gpus)
            self.rec.finished(j, gpu_s, pool)
            return
        if a.saved_at_stop is not None:
            kept = a.saved_at_stop
        else:
            progress = max(0.0, self.now - a.progress_start)
            c = self.sc.checkpoint_interval_s
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
    def _ready(self, pool_name: str, for_job: int, count: int) -> None:
        p = self.pools[pool_name]
        if (for_job, count) in p.launching:
            p.launching.remove((for_job, count))
        for _ in range(count):
            self.node_counter += 1
            nid = f"{p.name}-{self.node_counter}"
            p.add_node(SimNode(nid, p.gpus_per_node, 0, self.now,
                               launched_at=self.now - p.launch_latency_s))
            if p.interruption_rate_per_h > 0:
                gap = self.rng.expovariate(p.interruption_rate_per_h / 3600.0)
                self.push(self.now + gap, INTERRUPT, (p.name, nid))
        p.view = None

    def _interrupt(self, pool_name: str, node_id: str) -> None:
        p = self.pools[pool_name]
        if node_id not in p.nodes:
            return
        self.rec.interruptions += 1
        notice = self.sc.interruption_notice_s
        for a in list(self.running.values()):
            if a.pool == pool_name and any(n == node_id for n, _ in a.view.alloc):
                self._stop(a, "interruption", self.sc.checkpoint_save_s, notice)
        self.push(self.now + notice, REMOVE, (pool_name, node_id))

    def _bill(self, p: SimPool, node: SimNode) -> None:
        if p.rented:
            hours = (self.now - node.launched_at) / 3600.0
            self.rec.bill(hours * p.price_per_node_hour, hours * p.on_demand_per_node_hour)
