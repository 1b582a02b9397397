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

from collections import defaultdict
from operator import attrgetter

from broker.policy.avoid import avoid_nodes
from broker.policy.plan_state import HIGH_RANK, INF, PlanState
from broker.policy.queue import (
    AGE_LIMIT,
    UNKILLABLE,
    PendingQueue,
    QueueWalk,
    list_key,
)
from broker.policy.quota import within_first
from broker.policy.reclaim_index import ReclaimIndex, aged
from broker.policy.snapshot import (
    PendingView,
    Placement,
    Plan,
    PoolView,
    Snapshot,
)
from broker.policy.victims import Choice, checkpoints_due
from broker.policy.waiting import rest_reasons
from broker.spec import Priority

NORMAL_RANK = Priority.NORMAL.rank
_RANK = {p: p.rank for p in Priority}
NO_ROOM = "no free GPUs of an acceptable type"
NO_POOL = "no pool matches its GPU types, spot policy and shape"
BEHIND = "behind a blocked job (backfill is off)"
RENTED_WAIT = "waiting for rented nodes to come up"
_PRIO = {p.rank: p for p in Priority}
_STOPPING = attrgetter("stopping")
_PREEMPTED_BEFORE = attrgetter("times_preempted")


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


class _Planner(PlanState):
    """The queue walk that decides (steps 2-6); its state and the steps that write a decision
    are broker.policy.plan_state.PlanState."""

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
