"""The victim lists of one plan (broker.policy.victims.VictimIndex is built on them): per
node and class, the GPUs reclaimable from strictly lower classes (`could_fit`, the buckets of
nodes by what they could offer); per node and per pool, the eligible victims in victim order,
grown one class at a time as far as a search reaches; marking victims as taken (`choose`).
The victim order, who may be a victim and the fewest-victims search: broker.policy.victims.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable

from broker.policy.capacity import Capacity, enough
from broker.policy.reclaim_index import (
    RANKS,
    ReclaimIndex,
    VictimKey,
    age_key,
    drop,
    index_key,
    writable,
)
from broker.policy.snapshot import Alloc, RunningView
from broker.spec import Priority

OnNode = tuple[VictimKey, RunningView, int, str]  # (key, attempt, GPUs it holds on the node, node)
Victims = list[tuple[VictimKey, RunningView]]
Cost = tuple[int, list[VictimKey]]
Choice = tuple[Cost, str, list[str], dict[int, RunningView]]  # (cost, pool, nodes, victims)
# (victim count, their keys, node place, node, node version, victims)
HeapEntry = tuple[int, list[VictimKey], int, str, int, Victims]
NORMAL_RANK = Priority.NORMAL.rank


class VictimLists:
    """Preemptable attempts of one plan by node, pool and class (see the module docstring);
    broker.policy.victims.VictimIndex adds the search."""


    def __init__(self, running: Iterable[RunningView], demoted: Collection[int], cap: Capacity,
                 now: float, min_run_s: float, mode: str, below: int = RANKS,
                 aged_after: float | None = None, aged_gangs_only: bool = True,
                 kept: ReclaimIndex | None = None, protected: Collection[int] = ()) -> None:
        """Index the preemptable attempts of effective class below `below` (the highest class
        waiting: nothing else can be a victim in this plan). An attempt's effective class is
        its priority's, or normal when its id is in `demoted` (anti-capture), else one higher
        when its job was aged when it started (`aged`, with `aged_after` and
        `aged_gangs_only` as in PolicyConfig's promote_after_s and promote_gangs_only).
        `kept`, when given, must index exactly `running` with the same aging parameters (see
        ReclaimIndex); it is only read. `protected`: attempt ids that are never victims here
        (work within its team's quota, broker.policy.quota).

        Built in two steps, the second only when a search needs it: per node, the GPUs of its
        eligible victims below each class (enough for `could_fit`), from the kept sums with
        this plan's cuts applied to copies; then, per node and per pool, the victims in
        victim order (`by_node`, `per_pool`, for the search)."""
        if kept is None:
            kept = ReclaimIndex(running, aged_after, aged_gangs_only)
        self.cap = cap
        self.now, self.mode = now, mode
        self.demoted, self.below_rank = demoted, below
        self.chosen: set[int] = set()
        self.version: dict[str, int] = defaultdict(int)
        self._pos: dict[str, int] | None = None
        self._by_node: dict[str, list[OnNode]] | None = None
        self._kept = kept
        # per node, GPUs of eligible victims below each class (index: the class; read at most
        # at `below`, as the kept sums count attempts at or above it too), less those of
        # victims chosen since: the kept sums, each list copied before it is changed
        self._recl = dict(kept.below)
        self._own: set[str] = set()
        counts = list(kept.count)
        ranks = kept.rank
        gone: set[int] = set()  # protected by the minimum run time
        for aid, r in kept.restarted.items():
            if now - r.started_at < min_run_s:
                gone.add(aid)
                rank = ranks[aid]
                counts[rank] -= 1
                self._move(r.alloc, rank, RANKS)
        if protected:  # all at once: per node, one copy and one change of its sums
            drop(kept, protected, gone, counts, self._recl, self._own)
        self._gone = gone
        live = kept.live
        for aid in demoted:
            rv = live.get(aid)
            if rv is None or aid in gone:
                continue
            rank = ranks[aid]
            if rank != NORMAL_RANK:
                counts[rank] -= 1
                counts[NORMAL_RANK] += 1
                self._move(rv.alloc, rank, NORMAL_RANK)
        self.lowest = next((c for c in range(min(below, RANKS)) if counts[c] > 0), None)
        pool_of = cap.pool_of
        spanning: set[str] = set()  # pools with a victim on several nodes (gangs search greedily)
        for aid, r in kept.wide.items():
            if aid not in gone and self.rank_of(aid) < below:
                spanning.update(pool_of[node] for node, _ in r.alloc if node in pool_of)
        self.spanning = spanning
        self._per_pool: dict[str, list[OnNode]] = {p: [] for p in cap.nodes}
        self._done = 0  # classes below this one are in `_per_pool` (see _upto)
        self.cursor: dict[tuple[str, int], int] = {}
        # per pool and class (list index), the nodes by what they could offer (see _bucket)
        self.buckets: dict[str, list[list[dict[str, None]] | None]] = {}
        self.value: dict[str, list[dict[str, int] | None]] = {}
        self.heaps: dict[tuple[str, int, int], list[HeapEntry]] = {}
        self.cache: dict[tuple[str, int, int], tuple[int, Victims | None]] = {}
        cap.listener = self.touch

    def rank_of(self, aid: int) -> int:
        """An indexed attempt's effective class in this plan (demoted: normal)."""
        return NORMAL_RANK if aid in self.demoted else self._kept.rank[aid]

    def _move(self, alloc: Alloc, rank: int, to: int) -> None:
        """Move the GPUs of `alloc` from class `rank` to class `to` (RANKS: out of the index)
        in the per-node sums, copying a node's kept list before its first change."""
        recl, own = self._recl, self._own
        for node, g in alloc:
            rc = writable(recl, own, node)
            if rc is None:
                continue
            if to > rank:
                for c in range(rank + 1, to + 1):
                    rc[c] -= g
            else:
                for c in range(to + 1, rank + 1):
                    rc[c] += g

    @property
    def by_node(self) -> dict[str, list[OnNode]]:
        """Per node, its eligible victims as (key, attempt, GPUs there, node), in victim order."""
        got = self._by_node
        if got is None:  # (not `self._by_node` again: mypyc keeps the narrowed None type)
            self._upto(RANKS)
            got = {}
            for lst in self._per_pool.values():  # a node's entries: in its pool's order
                for e in lst:
                    on = got.get(e[3])
                    if on is None:
                        got[e[3]] = [e]
                    else:
                        on.append(e)
            self._by_node = got
        return got

    def _upto(self, rank: int) -> None:
        """Extend every pool's `per_pool` list, in victim order, with the eligible victims of
        each class below `rank` not yet there. The victim key starts with the class, so the
        lists grow one class at a time; within one, the kept order is by the key's last two
        fields already, and a stable sort by lost work finishes it."""
        end = min(rank, self.below_rank, RANKS)
        if self._done >= end:
            return
        now, youngest = self.now, self.mode == "youngest"
        gone, demoted, kept = self._gone, self.demoted, self._kept
        pool_of, pos = self.cap.pool_of, self.pos
        per_pool = self._per_pool
        for c in range(self._done, end):
            cls: list[RunningView] = [r for r in kept.order[c] if r.attempt_id not in gone
                                      and r.attempt_id not in demoted]
            if c == NORMAL_RANK and demoted:  # demoted high/urgent attempts count as normal
                extra = [r for aid in demoted for r in (kept.live.get(aid),)
                         if r is not None and aid not in gone and kept.rank[aid] != c]
                if extra:
                    cls.extend(extra)
                    cls.sort(key=age_key)
            keys = [index_key(r, c, now, youngest) for r in cls]
            order = list(range(len(cls)))
            if not youngest:  # stable: the kept order breaks ties
                order.sort(key=[k[1] for k in keys].__getitem__)
            for i in order:
                r = cls[i]
                k = keys[i]
                alloc = r.alloc
                if len(alloc) > 1:
                    alloc = tuple(sorted((a for a in alloc if a[0] in pool_of),
                                         key=lambda a: pos[a[0]]))
                for nd, g in alloc:
                    p = pool_of.get(nd)
                    if p is not None:
                        per_pool[p].append((k, r, g, nd))
        self._done = end

    @property
    def pos(self) -> dict[str, int]:
        """Each node's place in its pool (the last tie-break)."""
        if self._pos is None:
            self._pos = {nd: i for nodes in self.cap.nodes.values() for i, nd in enumerate(nodes)}
        return self._pos

    def per_pool(self, pool: str) -> list[OnNode]:
        """Every (key, attempt, GPUs there, node) of the pool, in victim order (an attempt on
        several nodes: by their place in the pool)."""
        self._upto(RANKS)
        return self._per_pool[pool]

    # -- reclaimable GPUs per node and class ----------------------------------------------------
    def _bucket(self, pool: str, rank: int) -> list[dict[str, None]]:
        """Nodes of the pool by what they could offer a job of this class: available GPUs plus
        those of eligible victims (capped at the node size)."""
        per = self.buckets.get(pool)
        if per is None:
            per = self.buckets[pool] = [None] * RANKS
            self.value[pool] = [None] * RANKS
        b = per[rank]
        if b is None:
            cap = self.cap
            gpn = cap.size[pool]
            b = per[rank] = [{} for _ in range(gpn + 1)]
            vals = self.value[pool][rank] = {}
            free, held, recl = cap.free, cap.held, self._recl
            c = min(rank, self.below_rank)  # every victim is below `below_rank`
            for nd in cap.nodes[pool]:
                rc = recl.get(nd)
                v = free[nd] - held.get(nd, 0) + (rc[c] if rc is not None else 0)
                if v > gpn:
                    v = gpn
                if v:
                    b[v][nd] = None
                    vals[nd] = v
        return b

    def touch(self, node: str) -> None:
        """The node's available GPUs or its victims changed: re-bucket it, outdate its costs."""
        self.version[node] += 1
        cap = self.cap
        pool = cap.pool_of[node]
        per = self.value.get(pool)
        if per is None:
            return
        avail = cap.free[node] - cap.held.get(node, 0)
        rc = self._recl.get(node)
        gpn = cap.size[pool]
        buckets = self.buckets[pool]
        for rank in range(1, RANKS):
            vals = per[rank]
            if vals is None:
                continue
            old = vals.get(node, 0)
            new = avail + rc[min(rank, self.below_rank)] if rc is not None else avail
            if new > gpn:
                new = gpn
            if new != old:
                b = buckets[rank]
                assert b is not None
                if old:
                    del b[old][node]
                if new:
                    b[new][node] = None
                    vals[node] = new
                else:
                    vals.pop(node, None)

    def could_fit(self, pool: str, rank: int, g: int, n: int) -> bool:
        """Whether n nodes of the pool could fit g GPUs with victims below `rank`."""
        return enough(self._bucket(pool, rank), g, n)

    def _candidates(self, pool: str, rank: int, g: int) -> list[str]:
        b = self._bucket(pool, rank)
        out: list[str] = []
        for v in range(g, len(b)):
            out.extend(b[v])
        return out

    def choose(self, victims: Iterable[RunningView]) -> None:
        """Mark victims as taken (by the job they now stop for)."""
        for r in victims:
            aid = r.attempt_id
            if aid in self.chosen:
                continue
            self.chosen.add(aid)
            # cumulative: every class above the victim's loses its GPUs
            self._move(r.alloc, self.rank_of(aid), RANKS)
            for node, _ in r.alloc:
                if node in self.cap.pool_of:
                    self.touch(node)
