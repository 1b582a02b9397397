"""The planner's working state and the steps that only write the plan (broker.policy.plan).

PlanState holds one plan's state (capacity, pools, candidate pools, what was placed,
preempted, launched, reserved and why jobs wait) and the steps that act on a decision already
made: committing victims, waiting for GPUs already on their way, renting (rules in
broker.policy.cloud: claiming spare launching capacity or launching nodes), reserving
(broker.policy.backfill) and scaling rented pools down. broker.policy.plan's `_Planner`
subclasses it with the queue walk that makes the decisions.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from broker.policy.backfill import Backfill
from broker.policy.capacity import Capacity
from broker.policy.cloud import launching_spare, offers, should_buy
from broker.policy.config import PolicyConfig
from broker.policy.queue import PRIORITY_RANKS
from broker.policy.quota import QuotaBook
from broker.policy.reclaim_index import lost_gpu_s
from broker.policy.snapshot import (
    Launch,
    PendingView,
    Placement,
    PoolView,
    Preemption,
    Snapshot,
)
from broker.policy.victims import Choice, VictimIndex
from broker.spec import Market, Priority, SpotPolicy, market_ok

HIGH_RANK = Priority.HIGH.rank
INF = math.inf
# Candidate pool names by (pools' signature, job shape): a pure function's answers,
# remembered across plans (the simulator plans the same pools thousands of times). A
# signature is hashed once per plan, to a small number (_SIGS), not once per shape.
_CANDIDATES: dict[tuple[object, ...], tuple[str, ...]] = {}
_SIGS: dict[tuple[object, ...], int] = {}


class PlanState:
    """One plan's working state, and the steps that write a decision into it (see the module
    docstring). The queue walk (broker.policy.plan) sets `top_rank` and `demoted_running`
    before it asks for victims."""

    top_rank: int  # the highest class anything waits at (victims are of lower classes)
    demoted_running: set[int]  # running high/urgent attempts beyond their team's allowance
    def __init__(self, snap: Snapshot, now: float, explain: bool) -> None:
        self.s = snap
        self.now = now
        self.explain = explain
        self.cfg: PolicyConfig = snap.config
        self.cap = Capacity(snap.pools, snap.running, snap.free_index)
        self.pools = {p.name: p for p in snap.pools}
        # what candidate pools depend on, so the answers can be remembered across plans
        sig = tuple((p.name, p.gpu_type, p.market, p.price_per_gpu_hour, p.teams,
                     p.gpus_per_node, max(len(p.nodes), p.max_nodes or 0)) for p in snap.pools)
        sid = _SIGS.get(sig)
        if sid is None:
            if len(_SIGS) > 10_000:
                _SIGS.clear()
                _CANDIDATES.clear()  # its keys name signatures by number
            sid = _SIGS[sig] = len(_SIGS)
        self.pool_sig = sid
        self.teams = {t.name: t for t in snap.teams}
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[tuple[int, tuple[tuple[str, int], ...]]] = []
        self.starts: list[tuple[int, float]] = []
        self.waiting: list[tuple[int, str]] = []
        self._cands: dict[tuple[object, ...], tuple[list[PoolView], tuple[str, ...]]] = {}
        self.launches: list[Launch] = []
        self.terminations: list[str] = []
        self.rented = [p for p in snap.pools if p.max_nodes is not None]
        self.renting = bool(self.rented) and self.cfg.cloud
        self.launched: dict[str, int] = {}
        self.launchable = {p.name: p.launchable for p in self.rented}  # read often: once here
        self.launching_for = {jid for p in self.rented for jid, _ in p.launching}
        self._by_id: dict[int, PendingView] | None = None
        shapes = ({jid: (j.gpus_per_node, j.nodes) for p in self.rented for jid, _ in p.launching
                   for j in (self._pending_by_id(jid),) if j is not None} if self.rented else {})
        self.spare = {p.name: launching_spare(p, shapes) for p in self.rented if p.launching}
        self.vi: VictimIndex | None = None
        self.backfill = Backfill(self.cap, snap.pools, snap.running, now, self.cfg.grace_s)
        self.wake: list[float] = []
        self.easy_held: dict[int, list[str]] = {}  # reservation index -> its EASY-held nodes
        self.blocked_rank = -1  # highest class that found nothing to preempt
        self.quota = QuotaBook(snap.teams, snap.pools, snap.running, self._pending_by_id,
                               self.cap.pool_of) if (
            self.cfg.quotas and any(t.quota is not None for t in snap.teams)) else None  # policy.quota

    @property
    def chosen(self) -> Collection[int]:
        """Attempts chosen as victims in this plan so far."""
        return self.vi.chosen if self.vi is not None else ()

    def _pending_by_id(self, jid: int) -> PendingView | None:
        q = self.s.queue
        if q is not None:
            return q.jobs.get(jid)
        if self._by_id is None:
            self._by_id = {j.job_id: j for j in self.s.pending}
        return self._by_id.get(jid)

    def _victims(self) -> VictimIndex:
        if self.vi is None:
            cfg = self.cfg
            self.vi = VictimIndex(self.s.running, self.demoted_running, self.cap, self.now,
                                  cfg.min_run_s, cfg.victim_order, below=self.top_rank,
                                  aged_after=cfg.promote_after_s if cfg.classes else None,
                                  aged_gangs_only=cfg.promote_gangs_only,
                                  kept=self.s.reclaim_index,
                                  protected=self.quota.within if self.quota is not None else ())
        return self.vi

    # -- step 4a: candidate pools --------------------------------------------------------
    def _candidates(self, j: PendingView, prank: int) -> tuple[list[PoolView], tuple[str, ...]]:
        """Candidate pools for the job preempting and renting as class `prank` (cached per
        shape), and their names. Below high, a job that may run on spot does not take
        rented on-demand nodes while a spot pool could take it: it may not rent on demand
        (broker.policy.cloud), so it does not keep nodes rented on demand for others alive
        either."""
        key = (j.gpu_types, id(j.spot), j.team, j.gpus_per_node, j.nodes, prank >= HIGH_RANK)
        hit = self._cands.get(key)
        if hit is not None:
            return hit
        names = _CANDIDATES.get((self.pool_sig, key))
        if names is not None:
            hit = ([self.pools[n] for n in names], names)
            self._cands[key] = hit
            return hit
        got = [p for p in self.s.pools
               if (not j.gpu_types or p.gpu_type in j.gpu_types)
               and market_ok(j.spot, p.market)
               and (p.teams is None or j.team in p.teams)
               and p.gpus_per_node >= j.gpus_per_node
               and max(len(p.nodes), p.max_nodes or 0) >= j.nodes]
        if prank < HIGH_RANK and j.spot is not SpotPolicy.NEVER and any(
                p.market is Market.SPOT for p in got):
            got = [p for p in got if p.market is not Market.ON_DEMAND or p.max_nodes is None]
        got.sort(key=lambda p: (p.market != "onprem", p.price_per_gpu_hour, p.gpus_per_node, p.name))
        hit = (got, tuple(p.name for p in got))
        self._cands[key] = hit
        if len(_CANDIDATES) > 50_000:
            _CANDIDATES.clear()
        _CANDIDATES[(self.pool_sig, key)] = hit[1]
        return hit

    def _can_rent(self) -> bool:
        if not self.renting:
            return False
        return any(self.launchable[p.name] - self.launched.get(p.name, 0) > 0
                   for p in self.rented) or any(
            any(x > 0 for x in spare) for spare in self.spare.values())

    def _preemptible_from(self, j: PendingView) -> float:
        """The earliest reservation start a job may backfill under preemptibly (inf: never)."""
        cfg = self.cfg
        if not (cfg.preemptible_backfill and cfg.preemption and cfg.classes):
            return INF
        return self.now + j.checkpoint_interval_s

    def _count_fit(self, pool: str, g: int, n: int, exclude: list[str]) -> bool:
        if not exclude:
            return self.cap.count_fit(pool, g, n)
        extra = sum(1 for nd in exclude if self.cap.avail(nd) >= g)
        return self.cap.count_fit(pool, g, n + extra)

    def _wait_for_incoming(self, j: PendingView, cands: list[PoolView], inc: dict[str, int]) -> bool:
        g, n = j.gpus_per_node, j.nodes
        cap = self.cap
        for p in cands:
            nodes = [nd for nd in cap.nodes[p.name] if cap.avail(nd) + inc.get(nd, 0) >= g]
            if len(nodes) >= n:
                nodes.sort(key=lambda nd: (-inc.get(nd, 0), -cap.avail(nd), nd))
                held = cap.hold(nodes[:n], g)
                self.reservations.append((j.job_id, held))
                if self.explain:
                    self.waiting.append((j.job_id, "waiting for preempted jobs to stop"))
                return True
        return False

    def _commit_victims(self, j: PendingView, choice: Choice, defer_until: float | None = None) -> None:
        _cost, _pool, nodes, victims = choice
        vi = self._victims()
        vi.choose(victims.values())
        if defer_until is not None:
            # the victims are kept for it; the free GPUs beside them are not held meanwhile
            self.wake.append(defer_until)
            if self.explain:
                self.waiting.append((j.job_id, f"preempting {len(victims)} job(s) once they "
                                               f"checkpoint, in {_dur(defer_until - self.now)}"))
            return
        for aid in sorted(victims):
            r = victims[aid]
            self.preemptions.append(Preemption(aid, r.job_id, j.job_id, lost_gpu_s(r, self.now)))
        held = self.cap.hold(nodes, j.gpus_per_node)
        self.reservations.append((j.job_id, held))
        if self.explain:
            self.waiting.append((j.job_id, f"preempting {len(victims)} job(s)"))

    # -- renting (rules in broker.policy.cloud) --------------------------------------------
    def _rent(self, j: PendingView, rank: int, victims: Choice | None) -> bool:
        """Claim spare launching capacity or launch nodes for j, if the rules say so."""
        urgentish = rank in PRIORITY_RANKS
        if victims is not None and not urgentish:
            return False
        if victims is None and not urgentish and self.now - j.submit_time < self.cfg.cloud_after_wait_s:
            if self._can_rent():
                self.wake.append(j.submit_time + self.cfg.cloud_after_wait_s)
            return False
        if j.nodes == 1:
            names = self._candidates(j, rank)[1]
            for p in self.rented:
                spare = self.spare.get(p.name)
                if not spare or p.name not in names:
                    continue
                for i, free in enumerate(spare):
                    if free >= j.gpus_per_node:
                        spare[i] -= j.gpus_per_node
                        if self.explain:
                            self.waiting.append((j.job_id, f"waiting for a rented node in {p.name}"))
                        return True
        offs = offers(j, self.rented, self.cfg, self.launched, wait_for_spot=not urgentish)
        if not offs:
            return False
        if victims is not None and not should_buy(victims[3].values(), offs[0], j, self.now, self.cfg):
            return False
        price, p = offs[0]
        self.launched[p.name] = self.launched.get(p.name, 0) + j.nodes
        self.launches.append(Launch(p.name, j.nodes, j.job_id, p.price_per_gpu_hour * p.gpus_per_node
                                    * j.nodes))
        spare_gpus = p.gpus_per_node - j.gpus_per_node
        if spare_gpus:
            self.spare.setdefault(p.name, []).extend([spare_gpus] * j.nodes)
        if self.explain:
            self.waiting.append((j.job_id, f"renting {j.nodes} node(s) in {p.name} "
                                           f"(${price:.2f}/GPU-h effective)"))
        return True

    def _reserve(self, j: PendingView, rank: int, names: tuple[str, ...], inc: dict[str, int]) -> None:
        pool, held, start, gpus = self.backfill.reserve(j, rank, names, self.cfg.easy, inc)
        if not self.cfg.easy:
            self.reservations.append((j.job_id, held))
            if self.explain:
                self.waiting.append((j.job_id, f"head of the queue: holding {gpus} GPUs in {pool}"
                                     if gpus else f"head of the queue: next to start in {pool}; "
                                     "GPUs freed there are held for it"))
            return
        if start is None:
            if self.explain:
                self.waiting.append((j.job_id, "head of the queue: start unknown (the jobs it waits "
                                               "for have no runtime estimate); nothing held"))
            return
        self.easy_held[len(self.reservations)] = [nd for nd, _ in held]
        self.reservations.append((j.job_id, held))
        self.starts.append((j.job_id, start))
        if self.explain:
            self.waiting.append((j.job_id, f"head of the queue: starts in about "
                                           f"{_dur(start - self.now)} in {pool}, holding {gpus} GPUs "
                                           "against longer jobs"))

    def _scale_down(self) -> None:
        cap = self.cap
        for p in self.rented:
            for node in p.nodes:
                if node.idle_since is None or cap.avail(node.id) < p.gpus_per_node:
                    continue
                at = node.idle_since + p.idle_timeout_s
                if self.now >= at:
                    self.terminations.append(node.id)
                else:
                    self.wake.append(at)


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"

