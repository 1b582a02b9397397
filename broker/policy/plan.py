"""plan(snapshot) -> Plan: the one scheduling decision. Pure: no IO, no clock, no mutation.

The live engine and the trace simulator both call this; only their IO differs.

The cycle, step by step (with team quotas, broker.policy.quota adds step 0 before step 4:
jobs within their team's quota are placed first, else reclaim borrowed GPUs; and it filters
4a's pools by borrowing and lending limits):
1. Free GPUs per node = capacity minus what running attempts hold (stopping ones still hold
   theirs until they exit).
2. Effective class (broker.policy.queue): aging, then anti-capture. Running attempts keep
   their class oldest first; pending jobs take what allowance is left, in queue order.
3. Queue order (broker.policy.queue): effective class, then fair share, then submit time,
   then job id. It is walked lazily over FIFO lists; once nothing of a list's shape can act
   in this cycle (nothing fits, nothing to preempt or rent, no reservation left to give),
   the rest of the list waits without being looked at.
4. For each job in that order:
   a. candidate pools: GPU type acceptable, market allowed by its spot policy, partition
      admits its team, nodes big and many enough; below high, no rented on-demand pool while
      a spot pool could take it (broker.policy.cloud). None: it waits with a reason.
   b. it fits: placed, gang all-or-none in one pool (a job that failed to start on some nodes
      avoids them while other nodes could take it, broker.policy.avoid); cheapest pool first,
      then the smallest node size that fits, then best-fit nodes (fullest that still fit). A
      job expected to end before a reservation starts may also use the GPUs it holds, and
      does so first.
   c. it is blocked, and victims are already stopping for it: it holds the GPUs on their
      nodes and waits for them; no new victims unless those are no longer enough.
   d. it is blocked and preemption is on: the fewest victims of strictly lower class
      (see broker.policy.victims for the order and the search) are chosen; it holds their nodes.
   e. renting (broker.policy.cloud): a job that nodes are already launching for waits for
      them; otherwise the rules there decide between preempting and renting for high/urgent
      work, and when other work that waited long enough rents instead of waiting.
   f. still blocked: the first `reservations` such jobs get a reservation (broker.policy.
      backfill: EASY, holding GPUs only against jobs that would not end before it starts);
      with backfill off, the queue stops here.
5. Rented nodes idle past their pool's timeout, with nothing placed or held, are released.
6. `wake_at`: the earliest time a time rule (minimum run time, waiting before renting, idle
   timeout, aging, a runtime estimate overrun) could change this plan with nothing else
   changing; a simulator replans exactly then instead of polling.

"Why waiting" reasons are built only when asked for (`explain=True`, the engine's default);
the simulator does not ask.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from operator import attrgetter

from broker.policy.avoid import avoid_nodes
from broker.policy.backfill import Backfill
from broker.policy.capacity import Capacity
from broker.policy.cloud import launching_spare, offers, should_buy
from broker.policy.config import PolicyConfig
from broker.policy.queue import (
    AGE_LIMIT,
    PRIORITY_RANKS,
    UNKILLABLE,
    PendingQueue,
    QueueWalk,
    list_key,
)
from broker.policy.quota import QuotaBook, within_first
from broker.policy.reclaim_index import ReclaimIndex, aged, lost_gpu_s
from broker.policy.snapshot import (
    Launch,
    PendingView,
    Placement,
    Plan,
    PoolView,
    Preemption,
    Snapshot,
)
from broker.policy.victims import Choice, VictimIndex, checkpoints_due
from broker.policy.waiting import rest_reasons
from broker.spec import Market, Priority, SpotPolicy, market_ok

NORMAL_RANK = Priority.NORMAL.rank
HIGH_RANK = Priority.HIGH.rank
_RANK = {p: p.rank for p in Priority}
NO_ROOM = "no free GPUs of an acceptable type"
NO_POOL = "no pool matches its GPU types, spot policy and shape"
BEHIND = "behind a blocked job (backfill is off)"
RENTED_WAIT = "waiting for rented nodes to come up"
_PRIO = {p.rank: p for p in Priority}
INF = math.inf
_STOPPING = attrgetter("stopping")
_PREEMPTED_BEFORE = attrgetter("times_preempted")
# Candidate pool names by (pools' signature, job shape): a pure function's answers,
# remembered across plans (the simulator plans the same pools thousands of times). A
# signature is hashed once per plan, to a small number (_SIGS), not once per shape.
_CANDIDATES: dict[tuple[object, ...], tuple[str, ...]] = {}
_SIGS: dict[tuple[object, ...], int] = {}


def plan(snapshot: Snapshot, now: float | None = None, explain: bool = True) -> Plan:
    """Decide placements, preemptions, launches and reservations for one cycle.

    `now` defaults to snapshot.now. The snapshot is not modified. Deterministic: the same
    snapshot gives the same plan. With explain=False, `Plan.waiting` is left empty (the
    reasons cost time nobody reads in a simulation).
    """
    planner = _Planner(snapshot, snapshot.now if now is None else now, explain)
    try:
        return planner.run()
    finally:
        # the victim index listens to the capacity (a reference cycle): break it, so the
        # plan's working state is freed at once instead of waiting for the cyclic collector
        planner.cap.listener = None


class _Planner:
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

    # -- step 2: effective classes of running work -----------------------------------------
    def _effective_running(self) -> set[int]:
        """Attempt ids of running high/urgent work beyond its team's allowance (as normal)."""
        demoted: set[int] = set()
        self.priority_used: dict[str, int] = defaultdict(int)
        if not self.cfg.anti_capture or not self.cfg.classes:
            return demoted
        # Demotions change decisions only for waiting high/urgent work (the only work that could
        # preempt a demoted attempt, or be demoted itself): skip the scan otherwise.
        if self.top_rank < HIGH_RANK:
            return demoted
        high = (Priority.HIGH, Priority.URGENT)
        prio = sorted((r for r in self.s.running if r.priority in high),
                      key=lambda r: (r.started_at, r.attempt_id))
        for r in prio:
            t = self.teams.get(r.team)
            allowance = t.priority_allowance_gpus if t is not None else 1 << 30
            if self.priority_used[r.team] + r.gpus <= allowance:
                self.priority_used[r.team] += r.gpus
            else:
                demoted.add(r.attempt_id)
        return demoted

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

    # -- step 4 ---------------------------------------------------------------------------
    def run(self) -> Plan:
        snap, cfg, ex = self.s, self.cfg, self.explain
        queue = snap.queue if snap.queue is not None else PendingQueue(snap.pending)
        # the highest class anything waits at (aging may lift a job one class, up to normal)
        top = max((k[0] for k in queue.lists), default=-1)
        if cfg.promote_after_s is not None and top < AGE_LIMIT:
            top += 1
        self.top_rank = top if cfg.classes else max(top, 3)
        self.demoted_running = self._effective_running()
        incoming: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        stopping = list(filter(_STOPPING, snap.running))  # C-level filter: most are not stopping
        kept = snap.reclaim_index
        if kept is not None:
            _check_kept(kept, snap, len(stopping))
        for r in stopping:
            if r.stopping_for is not None:
                for node, g in r.alloc:
                    incoming[r.stopping_for][node] += g
        walk = QueueWalk(queue, self.teams, cfg, self.now, self.priority_used)
        # Lists holding a job that needs individual care are never dropped.
        special = {list_key(j) for jid in (*incoming, *self.launching_for)
                   for j in (queue.jobs.get(jid),) if j is not None} if (
            incoming or self.launching_for) else set()
        self.failed: set[tuple[object, ...]] = set()
        self.dead: set[tuple[int, int, int]] = set()
        self.easy_failed: dict[tuple[object, ...], tuple[float, float]] = {}
        no_victims: set[tuple[object, ...]] = set()
        self.reservations_left = cfg.reservations
        stopped = False
        waiting = self.waiting
        first = within_first(self, queue, incoming) if self.quota is not None else ()
        for rank, j, sid in walk:
            if j.job_id in first:  # placed or reclaiming within its team's quota (step 0)
                continue
            # aging orders the queue; it grants no right to preempt or rent (see PolicyConfig)
            prank = min(rank, _RANK[j.priority])
            cands, names = self._candidates(j, prank)
            if not cands:
                if ex:
                    waiting.append((j.job_id, NO_POOL))
                continue
            if self.quota is not None:  # pools its team's borrowing and lending limits allow
                cands, why = self.quota.allowed(j, cands)
                if not cands:
                    if ex:
                        waiting.append((j.job_id, why or NO_POOL))
                    continue
                names = tuple(p.name for p in cands)
            if j.failed_on and (avoid := avoid_nodes(j, cands)):
                self._place_avoiding(j, rank, cands, avoid)  # placed, or waits: no victims, no rent
                continue
            if self._try_place(j, rank, cands, names):
                continue
            g, n = j.gpus_per_node, j.nodes
            inc = incoming.get(j.job_id)
            if inc and self._wait_for_incoming(j, cands, inc):
                continue
            if j.job_id in self.launching_for:
                if ex:
                    waiting.append((j.job_id, RENTED_WAIT))
                continue
            if self.quota is not None and not inc and cfg.preemption and (got := self.quota.reclaim(
                    j, cands, self.cap, self.chosen, self.now, cfg.min_run_s,
                    cfg.victim_order)) is not None:  # within quota: reclaim at once
                self.quota.release(got[3].values())
                self.quota.charge(j.team, got[1], j.gpus)
                self._commit_victims(j, got)
                continue
            vkey = (names, g, n, prank)
            victims: Choice | None = None
            patient = (prank < HIGH_RANK and cfg.preempt_after_s > 0 and not inc
                       and self.now - j.submit_time < cfg.preempt_after_s)
            if patient and cfg.preemption and prank > 0:
                self.wake.append(j.submit_time + cfg.preempt_after_s)
            elif cfg.preemption and prank > 0 and (inc or vkey not in no_victims):
                vi = self._victims()
                if vi.lowest is not None and prank > vi.lowest:
                    victims = vi.search(prank, g, n, names, inc)
                    if victims is None and not inc:
                        no_victims.add(vkey)
                if victims is None and prank > self.blocked_rank:
                    self.blocked_rank = prank
            if self.renting and self._rent(j, prank, victims):
                continue
            if victims is not None:
                at = (checkpoints_due(victims[3].values(), self.now, cfg)
                      if rank < HIGH_RANK and not inc else None)
                if at is not None:
                    self._commit_victims(j, victims, defer_until=at)
                else:
                    self._commit_victims(j, victims)
                continue
            if self.reservations_left > 0 and (n > 1 or not cfg.reserve_gangs_only):
                self.reservations_left -= 1
                self._reserve(j, prank, names, inc or {})  # whom it may preempt at its start
            else:
                if ex:
                    waiting.append((j.job_id, NO_ROOM))
                if sid != UNKILLABLE and cfg.backfill:
                    lk = walk.key_of(sid)
                    if lk not in special and self._shape_dead(prank, g, n) and not (
                            self.backfill.start and self.backfill.could_use(
                                g, self.now + queue.shortest(lk), rank,  # type: ignore[arg-type]
                                self._preemptible_from(j))):
                        walk.kill(sid, NO_ROOM)
            if not cfg.backfill:
                stopped = True
                break
        if ex:
            waiting.extend(rest_reasons(walk.rest(), BEHIND if stopped else NO_ROOM, NO_POOL,
                                        lambda j: bool(self._candidates(j, _RANK[j.priority])[0])))
        self._scale_down()
        easy = self.cap.easy
        for i, nodes in self.easy_held.items():  # what is still held after backfill used some
            jid = self.reservations[i][0]
            self.reservations[i] = (jid, tuple((nd, easy[nd]) for nd in nodes if easy.get(nd)))
        return Plan(tuple(self.placements), tuple(self.preemptions), tuple(self.launches),
                    tuple(self.terminations), tuple(self.reservations), tuple(waiting),
                    tuple(walk.demoted), tuple(self.starts), self._wake_at(walk))

    def _shape_dead(self, prank: int, g: int, n: int) -> bool:
        """True when no job of this shape preempting as class `prank` (its own, whatever aging
        did to its place in the queue) can do anything more in this plan, a reservation's GPUs
        aside (the caller checks those against the list's estimates): none fits (free GPUs
        only shrink), none can preempt or rent, and no reservation is left to give. Once true
        for a shape, true for the rest of the plan (every condition only gets harder to meet)."""
        key = (prank if self.cfg.preemption else 0, g, n)
        if key in self.dead:
            return True
        if self.reservations_left > 0 or self._can_rent():
            return False
        cap = self.cap
        for p, gpn in cap.size.items():
            if gpn >= g and cap.count_fit(p, g, n):
                return False
        if self.cfg.preemption and prank > 0:
            vi = self._victims()
            if vi.lowest is not None and prank > vi.lowest:
                for p, gpn in cap.size.items():
                    if gpn >= g and vi.could_fit(p, prank, g, n):
                        return False
        self.dead.add(key)
        return True

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

    def _try_place(self, j: PendingView, rank: int, cands: list[PoolView], names: tuple[str, ...]) -> bool:
        g, n = j.gpus_per_node, j.nodes
        key = (names, g, n)
        plain = key not in self.failed
        e = j.expected_duration_s
        end = self.now + e if e is not None else INF
        bf = self.backfill
        ekey = (names, g, n, rank)
        easy = bool(bf.start)
        pre_from = INF
        if easy:
            pre_from = self._preemptible_from(j)
            failed = self.easy_failed.get(ekey)
            # a job ending later, or allowed under a reservation only from a later start, than
            # one that found no room would not fit either (GPUs only shrink)
            easy = (end < INF or pre_from < INF) and (
                failed is None or end < failed[0] or pre_from < failed[1])
        if not plain and not easy:
            return False
        cap = self.cap
        for p in cands:
            use: list[str] = []
            if easy and bf.by_pool.get(p.name):
                use = bf.usable(p.name, g, end, rank, pre_from)[:n]
            need = n - len(use)
            if need and not (plain and self._count_fit(p.name, g, need, use)):
                continue
            for nd in use:
                cap.take_easy(nd, g)
            alloc = tuple([(nd, g) for nd in use]) if use else ()
            if need:
                alloc += cap.take(p.name, g, need, exclude=use, warm=j.warm_on)
            self.placements.append(Placement(j.job_id, p.name, alloc, _PRIO[rank]))
            if self.quota is not None:
                self.quota.charge(j.team, p.name, j.gpus)
            bf.placed(alloc, e)
            return True
        if plain:
            self.failed.add(key)
        if easy:
            self.easy_failed[ekey] = (end, pre_from)
        return False

    def _place_avoiding(self, j: PendingView, rank: int, cands: list[PoolView],
                        avoid: frozenset[str]) -> None:
        """A job that failed to start on `avoid` (broker.policy.avoid): placed on other nodes
        if they fit now, else it waits (it neither preempts nor rents, and no shape cache learns
        from it: its failure is its own)."""
        g, n = j.gpus_per_node, j.nodes
        for p in cands:
            if self._count_fit(p.name, g, n, [nd for nd in avoid if self.cap.pool_of.get(nd) == p.name]):
                alloc = self.cap.take(p.name, g, n, exclude=avoid, warm=j.warm_on)
                self.placements.append(Placement(j.job_id, p.name, alloc, _PRIO[rank]))
                if self.quota is not None:
                    self.quota.charge(j.team, p.name, j.gpus)
                self.backfill.placed(alloc, j.expected_duration_s)
                return
        if self.explain:
            self.waiting.append((j.job_id, f"{NO_ROOM} on a node other than {', '.join(sorted(avoid))} "
                                 "(it failed to start there)"))

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

    def _wake_at(self, walk: QueueWalk) -> float | None:
        """The earliest future time a time rule may change this plan (see step 6).

        A job's aging counts only where queue order alone decides: who gets a reservation,
        or where the walk stops without backfill. Otherwise an aged job, granted no right to
        preempt or rent, can take only GPUs it would already have taken."""
        wake = self.wake
        cfg = self.cfg
        if self.backfill.wake is not None:
            wake.append(self.backfill.wake)
        if walk.next_promotion is not None and (cfg.reservations > 0 or not cfg.backfill):
            wake.append(walk.next_promotion)
        if self.blocked_rank > 0 and cfg.min_run_s > 0:
            demoted, min_run, now = self.demoted_running, cfg.min_run_s, self.now
            for r in filter(_PREEMPTED_BEFORE, self.s.running):
                if not r.stopping and now - r.started_at < min_run:
                    rank = NORMAL_RANK if r.attempt_id in demoted else aged(
                        r, r.priority.rank, cfg.promote_after_s, cfg.promote_gangs_only)
                    if rank < self.blocked_rank:
                        wake.append(r.started_at + min_run)
        later = [t for t in wake if t > self.now]
        return min(later) if later else None


def _check_kept(kept: ReclaimIndex, snap: Snapshot, stopping: int) -> None:
    """Raise ValueError when a kept reclaim index visibly disagrees with the snapshot."""
    cfg = snap.config
    if kept.size != len(snap.running) or len(kept.stopping) != stopping:
        raise ValueError(f"reclaim index: {kept.size} attempts ({len(kept.stopping)} stopping), "
                         f"the snapshot {len(snap.running)} ({stopping} stopping)")
    if (kept.aged_after != (cfg.promote_after_s if cfg.classes else None)
            or kept.gangs_only != cfg.promote_gangs_only):
        raise ValueError("reclaim index: made with other aging parameters than the config's")


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"
