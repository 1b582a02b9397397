"""plan(snapshot) -> Plan: the one scheduling decision. Pure: no IO, no clock, no mutation.

The live engine and the trace simulator both call this; only their IO differs.

The cycle, step by step:
1. Free GPUs per node = capacity minus what running attempts hold (stopping ones still hold
   theirs until they exit).
2. Effective class: aging first (with `promote_after_s`, a job that has waited that long
   since submission is scheduled one class higher, never above high), then anti-capture:
   per team, high/urgent GPUs beyond the team's allowance are scheduled as normal. Running
   attempts keep their class oldest first; pending jobs take what allowance is left, in
   queue order.
3. Queue order: effective class (urgent first), then the team's decayed usage divided by its
   fair-share weight (lighter users first), then submit time (a requeued job keeps its
   original one), then job id.
4. For each job in that order:
   a. candidate pools: GPU type acceptable, market allowed by its spot policy, partition
      admits its team, nodes big and many enough. None: it waits with a reason.
   b. it fits on free GPUs: placed, gang all-or-none in one pool; cheapest pool first, then
      the smallest node size that fits, then best-fit nodes (fullest that still fit).
   c. it is blocked, and victims are already stopping for it: it holds the GPUs on their
      nodes and waits for them; no new victims unless those are no longer enough.
   d. it is blocked and preemption is on: the fewest victims of strictly lower class
      (see broker.policy.victims for the order) are chosen, and it holds their nodes.
   e. renting (broker.policy.cloud): a job that nodes are already launching for waits for
      them; otherwise the rules there decide between preempting and renting for high/urgent
      work, and when other work that waited long enough rents instead of waiting.
   f. still blocked: the first `reservations` such jobs hold the free GPUs of the nodes that
      would fit them soonest, so backfill cannot starve them; with backfill off, the queue
      stops here.
5. Rented nodes idle past their pool's timeout, with nothing placed or held, are released.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import accumulate

from broker.policy.capacity import Capacity
from broker.policy.cloud import launching_spare, offers, should_buy
from broker.policy.snapshot import (
    Alloc,
    Launch,
    PendingView,
    Placement,
    Plan,
    PolicyConfig,
    PoolView,
    Preemption,
    RunningView,
    Snapshot,
)
from broker.policy.victims import VictimKey, lost_gpu_s, pick_nodes, victim_key
from broker.spec import Priority, market_ok

NORMAL_RANK = Priority.NORMAL.rank
HIGH_RANK = Priority.HIGH.rank
NO_ROOM = "no free GPUs of an acceptable type"
PRIORITY_RANKS = (Priority.HIGH.rank, Priority.URGENT.rank)


def plan(snapshot: Snapshot, now: float | None = None) -> Plan:
    """Decide placements, preemptions and reservations for one cycle.

    `now` defaults to snapshot.now. The snapshot is not modified. Deterministic: the same
    snapshot gives the same plan.
    """
    return _Planner(snapshot, snapshot.now if now is None else now).run()


class _Planner:
    def __init__(self, snap: Snapshot, now: float) -> None:
        self.s = snap
        self.now = now
        self.cfg: PolicyConfig = snap.config
        used: dict[str, int] | None = None
        if not all(nd.used is not None for p in snap.pools for nd in p.nodes):
            used = defaultdict(int)
            for r in snap.running:
                for node, g in r.alloc:
                    used[node] += g
        self.cap = Capacity(snap.pools, used)
        self.pools = {p.name: p for p in snap.pools}
        self.teams = {t.name: t for t in snap.teams}
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[tuple[int, Alloc]] = []
        self.waiting: list[tuple[int, str]] = []
        self.demoted: list[int] = []
        self._cands: dict[tuple, tuple[list[PoolView], tuple[str, ...]]] = {}
        self.launches: list[Launch] = []
        self.terminations: list[str] = []
        self.rented = [p for p in snap.pools if p.max_nodes is not None]
        self.launched: dict[str, int] = {}
        self.launching_for = {jid for p in self.rented for jid, _ in p.launching}
        shapes = {j.job_id: (j.gpus_per_node, j.nodes) for j in snap.pending} if self.rented else {}
        self.spare = {p.name: launching_spare(p, shapes) for p in self.rented if p.launching}

    # -- step 2: effective classes -------------------------------------------------------
    def _effective_running(self) -> set[int]:
        """Attempt ids of running high/urgent work beyond its team's allowance (as normal)."""
        demoted: set[int] = set()
        self.priority_used: dict[str, int] = defaultdict(int)
        # Demotions only change decisions for pending high/urgent work (the only work that
        # could preempt a demoted job, or be demoted itself): skip the scan otherwise.
        aging = self.cfg.promote_after_s is not None  # may lift normal work to high
        if not self.cfg.anti_capture or not (aging or any(j.priority.rank in PRIORITY_RANKS
                                                          for j in self.s.pending)):
            return demoted
        prio = sorted((r for r in self.s.running if r.priority.rank in PRIORITY_RANKS),
                      key=lambda r: (r.started_at, r.attempt_id))
        for r in prio:
            allowance = self._allowance(r.team)
            if self.priority_used[r.team] + r.gpus <= allowance:
                self.priority_used[r.team] += r.gpus
            else:
                demoted.add(r.attempt_id)
        return demoted

    def _rank(self, r: RunningView) -> int:
        return NORMAL_RANK if r.attempt_id in self.demoted_running else r.priority.rank

    def _victim_index(self) -> int | None:
        """Build the per-node victim lists (sorted by the documented key) on first need;
        return the lowest effective class among preemptable attempts (None: none)."""
        if self._lowest is not False:
            return self._lowest  # type: ignore[return-value]
        mode, min_run, now = self.cfg.victim_order, self.cfg.min_run_s, self.now
        lowest = None
        demoted, by_node = self.demoted_running, self.by_node
        for r in self.s.running:
            if r.stopping or (r.times_preempted and now - r.started_at < min_run):
                continue  # not preemptable (see victims.preemptable)
            rank = NORMAL_RANK if r.attempt_id in demoted else r.priority.rank
            k = victim_key(r, rank, now, mode)
            for node, g in r.alloc:
                by_node[node].append((k, r, g))
            if lowest is None or rank < lowest:
                lowest = rank
        for lst in self.by_node.values():
            lst.sort(key=lambda e: e[0])
        self._lowest = lowest
        return lowest

    def _allowance(self, team: str) -> int:
        t = self.teams.get(team)
        return t.priority_allowance_gpus if t else 1 << 30

    def _share(self, team: str) -> float:
        if not self.cfg.fair_share:
            return 0.0
        t = self.teams.get(team)
        return t.usage / t.weight if t else 0.0

    def _queue(self) -> list[tuple[int, PendingView]]:
        pend = self.s.pending
        # Decorate-sort: tuples compare in C; job ids are unique, so views are never compared.
        if not self.cfg.classes:
            fifo = [(j.submit_time, j.job_id, j) for j in pend]
            fifo.sort()
            return [(e[2].priority.rank, e[2]) for e in fifo]
        share = {t: self._share(t) for t in {j.team for j in pend}}
        keyed = [(-j.priority.rank, share[j.team], j.submit_time, j.job_id, j) for j in pend]
        age = self.cfg.promote_after_s
        if age is not None:  # aging: one class up after waiting `age` (never above high)
            cut, gangs = self.now - age, self.cfg.promote_gangs_only
            keyed = [(max(k[0] - 1, -HIGH_RANK), *k[1:]) if k[0] > -HIGH_RANK and k[2] <= cut
                     and (not gangs or k[4].nodes > 1) else k for k in keyed]
        keyed.sort()
        if not self.cfg.anti_capture:
            return [(-e[0], e[4]) for e in keyed]
        out: list[tuple[int, PendingView]] = []
        for e in keyed:
            j = e[4]
            r = -e[0]
            if r in PRIORITY_RANKS:
                if self.priority_used[j.team] + j.gpus <= self._allowance(j.team):
                    self.priority_used[j.team] += j.gpus
                else:
                    r = NORMAL_RANK
                    self.demoted.append(j.job_id)
            out.append((r, j))
        if self.demoted:
            out.sort(key=lambda e: (-e[0], share[e[1].team], e[1].submit_time, e[1].job_id))
        return out

    # -- step 4a: candidate pools --------------------------------------------------------
    def _candidates(self, j: PendingView) -> list[PoolView]:
        return self._cands_and_key(j)[0]

    def _cands_and_key(self, j: PendingView) -> tuple[list[PoolView], tuple[str, ...]]:
        """Candidate pools for the job (cached per shape), and their names as a cache key."""
        key = (j.gpu_types, j.spot, j.team, j.gpus_per_node, j.nodes)
        hit = self._cands.get(key)
        if hit is not None:
            return hit
        got = [p for p in self.s.pools
               if (not j.gpu_types or p.gpu_type in j.gpu_types)
               and market_ok(j.spot, p.market)
               and (p.teams is None or j.team in p.teams)
               and p.gpus_per_node >= j.gpus_per_node
               and max(len(p.nodes), p.max_nodes or 0) >= j.nodes]
        got.sort(key=lambda p: (p.market != "onprem", p.price_per_gpu_hour, p.gpus_per_node, p.name))
        hit = (got, tuple(p.name for p in got))
        self._cands[key] = hit
        return hit

    # -- step 4 ---------------------------------------------------------------------------
    def run(self) -> Plan:
        self.demoted_running = self._effective_running()
        incoming: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for r in self.s.running:
            if r.stopping and r.stopping_for is not None:
                for node, g in r.alloc:
                    incoming[r.stopping_for][node] += g
        # Victim candidates per node, sorted by the documented key (built on first need).
        self.by_node: dict[str, list[tuple[VictimKey, RunningView, int]]] = defaultdict(list)
        self.chosen: set[int] = set()
        self._lowest: int | bool | None = False
        failed: set[tuple] = set()
        no_victims: set[tuple] = set()
        reservations_left = self.cfg.reservations
        stopped = False
        queue = self._queue()
        # Smallest node share any job from position i on asks for (for the early stop).
        need_from = list(accumulate(reversed([j.gpus_per_node for _, j in queue]), min))[::-1]
        renting = bool(self.rented) and self.cfg.cloud
        for i, (rank, j) in enumerate(queue):
            if not renting and not reservations_left and self._nothing_left(i, rank, need_from):
                self.waiting.extend((jj.job_id, NO_ROOM) for _, jj in queue[i:])
                break
            cands, fkey = self._cands_and_key(j)
            if not cands:
                self.waiting.append((j.job_id, "no pool matches its GPU types, spot policy and shape"))
                continue
            if stopped:
                self.waiting.append((j.job_id, "behind a blocked job (backfill is off)"))
                continue
            g, n = j.gpus_per_node, j.nodes
            # Free GPUs only shrink during a plan: a shape that did not fit still does not.
            if (fkey, g, n) not in failed:
                if self._try_place(j, rank, cands):
                    continue
                failed.add((fkey, g, n))
            inc = incoming.get(j.job_id)
            if inc and self._wait_for_incoming(j, cands, inc):
                continue
            if j.job_id in self.launching_for:
                self.waiting.append((j.job_id, "waiting for rented nodes to come up"))
                continue
            vkey = (fkey, g, n, rank)
            victims = None
            # The no-victims cache only holds for jobs without GPUs already coming to them.
            lowest = (self._lowest if self._lowest is not False else self._victim_index()) \
                if self.cfg.preemption and rank > 0 else None
            if lowest is not None and rank > lowest and (inc or vkey not in no_victims):
                victims = self._find_victims(j, rank, cands, inc or {})
                if victims is None and not inc:
                    no_victims.add(vkey)
            if self.rented and self.cfg.cloud and self._rent(j, rank, victims):
                continue
            if victims is not None:
                self._commit_victims(j, victims)
                continue
            if reservations_left > 0:
                reservations_left -= 1
                self._reserve_head(j, cands, inc or {})
            else:
                self.waiting.append((j.job_id, NO_ROOM))
            if not self.cfg.backfill:
                stopped = True
        self._scale_down()
        return Plan(tuple(self.placements), tuple(self.preemptions), tuple(self.launches),
                    tuple(self.terminations), tuple(self.reservations), tuple(self.waiting),
                    tuple(self.demoted))

    def _nothing_left(self, i: int, rank: int, need_from: list[int]) -> bool:
        """True when no job from queue position i on can be placed (no node has enough free
        GPUs for the smallest of them) nor preempt (the queue is sorted by class, and none
        outranks the lowest preemptable attempt), so the plan is complete: the rest wait."""
        if i % 16 and i != 0:
            return False  # checked every 16 jobs: the check is cheap, the walk is cheaper
        if self.cap.max_free() >= need_from[i]:
            return False
        if not self.cfg.preemption or rank == 0:
            return True
        if not self.cfg.classes:
            return False
        lowest = self._victim_index()
        return lowest is None or rank <= lowest

    def _try_place(self, j: PendingView, rank: int, cands: list[PoolView]) -> bool:
        for p in cands:
            if self.cap.count_fit(p.name, j.gpus_per_node, j.nodes):
                alloc = self.cap.take(p.name, j.gpus_per_node, j.nodes)
                self.placements.append(Placement(j.job_id, p.name, alloc, _prio(rank)))
                return True
        return False

    def _wait_for_incoming(self, j: PendingView, cands: list[PoolView], inc: dict[str, int]) -> bool:
        g, n = j.gpus_per_node, j.nodes
        for p in cands:
            nodes = [nd for nd in _pool_nodes(p)
                     if self.cap.free[nd] + inc.get(nd, 0) >= g]
            if len(nodes) >= n:
                nodes.sort(key=lambda nd: (-inc.get(nd, 0), -self.cap.free[nd], nd))
                held = self.cap.hold(nodes[:n], g)
                self.reservations.append((j.job_id, held))
                self.waiting.append((j.job_id, "waiting for preempted jobs to stop"))
                return True
        return False

    def _find_victims(self, j: PendingView, rank: int, cands: list[PoolView],
                      inc: dict[str, int]) -> tuple[list[str], dict[int, RunningView]] | None:
        chosen = self.chosen

        def eligible(r: RunningView, key: VictimKey) -> bool:
            return key[0] < rank and r.attempt_id not in chosen

        base = {nd: f + inc.get(nd, 0) for nd, f in self.cap.free.items()} if inc else self.cap.free
        best = None
        for p in cands:
            got = pick_nodes(_pool_nodes(p), j.nodes, j.gpus_per_node, base, self.by_node, eligible)
            if got is not None and (best is None or got[0] < best[0]):
                best = got
        return None if best is None else (best[1], best[2])

    def _commit_victims(self, j: PendingView,
                        choice: tuple[list[str], dict[int, RunningView]]) -> None:
        nodes, victims = choice
        for aid in sorted(victims):
            r = victims[aid]
            self.chosen.add(aid)
            self.preemptions.append(Preemption(aid, r.job_id, j.job_id, lost_gpu_s(r, self.now)))
        held = self.cap.hold(nodes, j.gpus_per_node)
        self.reservations.append((j.job_id, held))
        self.waiting.append((j.job_id, f"preempting {len(victims)} job(s)"))

    # -- renting (rules in broker.policy.cloud) --------------------------------------------
    def _rent(self, j: PendingView, rank: int,
              victims: tuple[list[str], dict[int, RunningView]] | None) -> bool:
        """Claim spare launching capacity or launch nodes for j, if the rules say so."""
        urgentish = rank in PRIORITY_RANKS
        if victims is not None and not urgentish:
            return False
        if victims is None and not urgentish and self.now - j.submit_time < self.cfg.cloud_after_wait_s:
            return False
        if j.nodes == 1:
            for p in self.rented:
                spare = self.spare.get(p.name)
                if not spare or p.name not in {c.name for c in self._candidates(j)}:
                    continue
                for i, free in enumerate(spare):
                    if free >= j.gpus_per_node:
                        spare[i] -= j.gpus_per_node
                        self.waiting.append((j.job_id, f"waiting for a rented node in {p.name}"))
                        return True
        offs = offers(j, self.rented, self.cfg, self.launched)
        if not offs:
            return False
        if victims is not None and not should_buy(victims[1].values(), offs[0], j, self.now, self.cfg):
            return False
        price, p = offs[0]
        self.launched[p.name] = self.launched.get(p.name, 0) + j.nodes
        self.launches.append(Launch(p.name, j.nodes, j.job_id, p.price_per_gpu_hour * p.gpus_per_node
                                    * j.nodes))
        spare = p.gpus_per_node - j.gpus_per_node
        if spare:
            self.spare.setdefault(p.name, []).extend([spare] * j.nodes)
        self.waiting.append((j.job_id, f"renting {j.nodes} node(s) in {p.name} "
                                       f"(${price:.2f}/GPU-h effective)"))
        return True

    def _scale_down(self) -> None:
        for p in self.rented:
            for node in p.nodes:
                if (node.idle_since is not None and self.cap.free[node.id] >= p.gpus_per_node
                        and self.now - node.idle_since >= p.idle_timeout_s):
                    self.terminations.append(node.id)

    def _reserve_head(self, j: PendingView, cands: list[PoolView], inc: dict[str, int]) -> None:
        best: tuple[int, str, list[str]] | None = None
        for p in cands:
            nodes = self.cap.fullest(p.name, j.nodes, inc)
            have = sum(min(self.cap.free[nd], j.gpus_per_node) for nd in nodes)
            if best is None or have > best[0]:
                best = (have, p.name, nodes)
        assert best is not None
        held = self.cap.hold(best[2], j.gpus_per_node)
        self.reservations.append((j.job_id, held))
        self.waiting.append((j.job_id, f"head of the queue: holding {best[0]} GPUs in {best[1]}"
                             if best[0] else f"head of the queue: next to start in {best[1]}; "
                             f"GPUs freed there are held for it"))


def _pool_nodes(p: PoolView) -> list[str]:
    return [nd.id for nd in p.nodes]


def _prio(rank: int) -> Priority:
    return next(p for p in Priority if p.rank == rank)
