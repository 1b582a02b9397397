"""Preemption victims: the documented order and the fewest-victims search. Pure.

Victim order (the sort key, first field first):
1. lower effective class first (low before normal before high);
2. least work lost: GPU-seconds since the victim's last committed checkpoint
   (``victim_order="youngest"`` skips this field: the naive baseline);
3. the youngest attempt first (latest start);
4. job id, as the tie-break.

Who can be a victim: a running attempt, not already stopping, of a strictly lower effective
class than the job it makes room for, and not protected by the minimum run time (a job that
was preempted before cannot be preempted again until it has run ``min_run_s`` since restarting).

Fewest victims, one node: the smallest number of victims that makes the node fit, and among
sets of that size the earliest in victim order (so a single large victim beats several small
ones). The job's node is the one needing the fewest (ties: the cheapest victims by the order
above, then the node's place in its pool); the pool is the one needing the fewest in all.

Fewest victims, a gang of n nodes: nodes are added one at a time. A node that already fits
(free GPUs, or GPUs of victims chosen for this job) costs nothing; otherwise each node offers
its fewest victims, and the offer taken is the one with the fewest victims per node it makes
fit (a victim spanning several nodes frees all of them: once chosen, its nodes all count),
then the earliest in victim order. Then every victim the gang no longer needs is dropped,
the latest in victim order first (a victim taken early for one node can become unneeded once
a later one spanning nodes frees them whole), so no chosen victim can be removed with the
gang still fitting. The gang's cost is its distinct victims.

The index (VictimIndex) makes this fast at thousands of nodes: per node and class, the GPUs
reclaimable from strictly lower classes, so only nodes that can fit are looked at; per pool,
every victim in order, walked with one cursor per GPU count for the common one-victim case;
per (pool, class, GPU count), a heap of node costs refreshed lazily when a node changes.
It starts from a ReclaimIndex (broker.policy.reclaim_index: the per-node sums and each
class's attempts youngest first), the caller's kept one when the snapshot carries it, and
orders victims one class at a time, only as far as a search reaches. Those lists and sums are
broker.policy.victim_lists.VictimLists; this module holds the order's rules and the search.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from broker.policy.config import PolicyConfig
from broker.policy.gang_prune import drop_unneeded
from broker.policy.reclaim_index import VictimKey, lost_gpu_s
from broker.policy.snapshot import RunningView
from broker.policy.victim_lists import (
    Choice,
    Cost,
    HeapEntry,
    OnNode,
    VictimLists,
    Victims,
)

# the victim lists hold the types; re-exported here, where the policy imports them
__all__ = ["Choice", "Cost", "HeapEntry", "OnNode", "VictimIndex", "VictimLists", "Victims",
           "checkpoints_due", "node_victims", "preemptable"]


def checkpoints_due(victims: Iterable[RunningView], now: float, cfg: PolicyConfig) -> float | None:
    """When a job below high should preempt these victims instead of now (checkpoint
    alignment): just after the latest of their next periodic checkpoints, if some victim would
    lose unsaved work now and every one with unsaved work checkpoints within
    min(checkpoint_align_s, half its period). None: preempt now (a victim's schedule unknown,
    a checkpoint too far, nothing to save, or every victim saves on the signal anyway).
    Beyond half a period, staggered victims could defer the preemption again and again."""
    if cfg.checkpoint_align_s <= 0 or cfg.checkpoint_on_signal >= 1:
        return None
    latest, unsaved = now, False
    for r in victims:
        period = r.checkpoint_period_s
        if not period:
            return None
        if lost_gpu_s(r, now) <= 0 or now < r.checkpoint_origin:
            continue
        nxt = r.checkpoint_origin + (math.floor((now - r.checkpoint_origin) / period) + 1) * period
        if nxt - now > min(cfg.checkpoint_align_s, period / 2):
            return None
        unsaved = True
        latest = max(latest, nxt)
    return latest + 1.0 if unsaved else None


def preemptable(r: RunningView, now: float, min_run_s: float) -> bool:
    return not r.stopping and (r.times_preempted == 0 or now - r.started_at >= min_run_s)


def node_victims(
    need: int,
    base_free: int,
    on_node: Sequence[OnNode],
    eligible: Callable[[RunningView, VictimKey], bool],
) -> Victims | None:
    """The fewest victims that bring one node from base_free to `need` GPUs; among sets of
    that size, the earliest in victim order.

    `on_node` lists (key, attempt, GPUs it holds on this node, node), sorted by key. Returns [] when
    the node already fits, None when even every eligible victim would not be enough.
    """
    short = need - base_free
    if short <= 0:
        return []
    cands = [(k, r, g) for k, r, g, _ in on_node if eligible(r, k)]
    sizes = sorted((g for _, _, g in cands), reverse=True)
    k, acc = 0, 0
    while acc < short and k < len(sizes):
        acc += sizes[k]
        k += 1
    if acc < short:
        return None
    # Greedy in victim order: take a candidate if the set can still be completed within k.
    chosen: Victims = []
    got = 0
    for i, (key, r, g) in enumerate(cands):
        left = k - len(chosen) - 1
        best_rest = sum(sorted((x[2] for x in cands[i + 1:]), reverse=True)[:left])
        if got + g + best_rest >= short:
            chosen.append((key, r))
            got += g
            if got >= short:
                return chosen
    raise AssertionError("unreachable: k victims were shown to suffice")


class VictimIndex(VictimLists):
    """Preemptable attempts of one plan, indexed for the fewest-victims search (see the module
    docstring). Built once per plan on first need; `choose` marks victims as taken."""

    # -- the search ---------------------------------------------------------------------------
    def _node_cost(self, node: str, rank: int, g: int) -> Victims | None:
        key = (node, rank, g)
        ver = self.version[node]
        hit = self.cache.get(key)
        if hit is not None and hit[0] == ver:
            return hit[1]
        chosen = self.chosen
        vs = node_victims(g, self.cap.avail(node), self.by_node.get(node, ()),
                          lambda r, k: k[0] < rank and r.attempt_id not in chosen)
        self.cache[key] = (ver, vs)
        return vs

    def _one_victim(self, pool: str, rank: int, g: int) -> tuple[VictimKey, str, RunningView] | None:
        """The earliest victim in order that alone makes its node fit g GPUs."""
        self._upto(rank)  # only classes below `rank` can offer one
        lst = self._per_pool[pool]
        if not lst:
            return None
        ck = (pool, g)
        i = self.cursor.get(ck, 0)
        chosen, free, held = self.chosen, self.cap.free, self.cap.held
        n = len(lst)
        while i < n:
            e = lst[i]
            # skipped entries never become usable again in this plan: avail only shrinks
            nd = e[3]
            if e[1].attempt_id in chosen or e[2] + free[nd] - held.get(nd, 0) < g:
                i += 1
                continue
            self.cursor[ck] = i
            return (e[0], nd, e[1]) if e[0][0] < rank else None
        self.cursor[ck] = i
        return None

    def _cheapest(self, pool: str, rank: int, g: int, n: int) -> list[tuple[Victims, str]] | None:
        """The n nodes of the pool needing the fewest victims, cheapest first (None: fewer
        than n can fit). Exact for a gang only when no victim spans nodes."""
        got: list[tuple[Victims, str]] = []
        entries = []
        heap = self._heap(pool, rank, g)
        while len(got) < n:
            few = self._fewest(pool, rank, g)
            if few is None:
                break
            got.append(few)
            entries.append(heapq.heappop(heap))
        for e in entries:
            heapq.heappush(heap, e)
        return got if len(got) == n else None

    def _heap(self, pool: str, rank: int, g: int) -> list[HeapEntry]:
        hk = (pool, rank, g)
        heap = self.heaps.get(hk)
        if heap is None:
            pos, version = self.pos, self.version
            heap = []
            for nd in self._candidates(pool, rank, g):
                vs = self._node_cost(nd, rank, g)
                if vs is not None:
                    heap.append((len(vs), [k for k, _ in vs], pos[nd], nd, version[nd], vs))
            heapq.heapify(heap)
            self.heaps[hk] = heap
        return heap

    def _fewest(self, pool: str, rank: int, g: int) -> tuple[Victims, str] | None:
        """The node of the pool needing the fewest victims (for a job with no one-victim node)."""
        hk = (pool, rank, g)
        heap = self._heap(*hk)
        pos, version = self.pos, self.version
        while heap:
            top = heap[0]
            nd = top[3]
            if top[4] == version[nd]:
                return top[5], nd
            heapq.heappop(heap)  # its cost can only have grown: refresh it
            vs = self._node_cost(nd, rank, g)
            if vs is not None:
                heapq.heappush(heap, (len(vs), [k for k, _ in vs], pos[nd], nd, version[nd], vs))
        return None

    def search(self, rank: int, g: int, n: int, pools: Sequence[str],
               incoming: Mapping[str, int] | None = None) -> Choice | None:
        """The fewest victims below `rank` that make n nodes of one of `pools` fit g GPUs each
        (GPUs already on their way to the job, `incoming`, count as free). None: no set."""
        best: Choice | None = None
        for pool in pools:
            got: Choice | None
            if incoming:
                got = self._gang(pool, rank, g, n, incoming, scan_all=True)
            elif n == 1:
                one = self._one_victim(pool, rank, g)
                if one is not None:
                    k, nd, r = one
                    got = ((1, [k]), pool, [nd], {r.attempt_id: r})
                else:
                    few = self._fewest(pool, rank, g)
                    got = None if few is None else (
                        (len(few[0]), [k for k, _ in few[0]]), pool, [few[1]],
                        {r.attempt_id: r for _, r in few[0]})
            elif pool not in self.spanning:  # no victim spans nodes: the n cheapest nodes
                nodes = self._cheapest(pool, rank, g, n)
                got = None
                if nodes is not None:
                    vic = {r.attempt_id: (k, r) for vs, _ in nodes for k, r in vs}
                    got = ((len(vic), sorted(k for k, _ in vic.values())), pool,
                           [nd for _, nd in nodes], {aid: r for aid, (_, r) in vic.items()})
            else:
                got = self._gang(pool, rank, g, n, {}, scan_all=False)
            if got is not None and (best is None or got[0] < best[0]):
                best = got
        return best

    def _gang(self, pool: str, rank: int, g: int, n: int, incoming: Mapping[str, int],
              scan_all: bool) -> Choice | None:
        cap, chosen, pos = self.cap, self.chosen, self.pos
        nodes = cap.nodes[pool] if scan_all else self._candidates(pool, rank, g)
        if len(nodes) < n:
            return None
        extra: dict[str, int] = defaultdict(int, incoming)
        mine: dict[int, tuple[VictimKey, RunningView]] = {}

        def eligible(r: RunningView, k: VictimKey) -> bool:
            return k[0] < rank and r.attempt_id not in chosen and r.attempt_id not in mine

        options: dict[str, Victims] = {}
        for nd in nodes:
            if incoming.get(nd) or scan_all:
                vs = node_victims(g, cap.avail(nd) + incoming.get(nd, 0), self.by_node.get(nd, ()),
                                  eligible)
            else:
                vs = self._node_cost(nd, rank, g)
            if vs is not None:
                options[nd] = vs
        if len(options) < n:
            return None
        # Nodes whose offer cannot change while this job's victims are chosen (no victim of
        # theirs spans nodes, nothing of this job's lands on them) keep one static order.
        spread = {nd for nd, vs in options.items() if any(len(r.alloc) > 1 for _, r in vs)}
        static = sorted((len(vs), [k for k, _ in vs], pos[nd], nd) for nd, vs in options.items()
                        if nd not in spread)
        si = 0
        picked: list[str] = []
        taken: set[str] = set()
        left = n
        while left:
            best: tuple[tuple[float, list[VictimKey], int], str, Victims, list[str]] | None = None
            while si < len(static) and (static[si][3] in taken or extra.get(static[si][3])):
                si += 1
            if si < len(static):
                c, keys, p_, nd = static[si]
                best = ((float(c), keys, p_), nd, options[nd], [nd])
            for nd in [*spread, *(x for x in extra if x in options and extra[x])]:
                if nd in taken:
                    continue
                vs = options[nd]
                if extra.get(nd):
                    fresh = node_victims(g, cap.avail(nd) + extra[nd], self.by_node.get(nd, ()),
                                         eligible)
                    if fresh is None:
                        continue
                    vs = fresh
                gained = [nd]
                wide = [r for _, r in vs if len(r.alloc) > 1]
                if wide:
                    add = defaultdict(int, extra)
                    for _, r in vs:
                        for x, gg in r.alloc:
                            add[x] += gg
                    others = {x for r in wide for x, _ in r.alloc} - {nd}
                    gained += sorted((x for x in others if x in options and x not in taken
                                      and cap.avail(x) + add[x] >= g), key=pos.__getitem__)
                score = (len(vs) / min(len(gained), left), [k for k, _ in vs], pos[nd])
                if best is None or score < best[0]:
                    best = (score, nd, vs, gained)
            if best is None:
                return None
            _, nd, vs, gained = best
            for k, r in vs:
                mine[r.attempt_id] = (k, r)
                for x, gg in r.alloc:
                    extra[x] += gg
            for x in gained[:left]:
                picked.append(x)
                taken.add(x)
            left = n - len(picked)
        if len(mine) > 1:
            picked = drop_unneeded(self.cap, self.pos, pool, g, n, incoming, mine, picked)
        keys = sorted(k for k, _ in mine.values())
        return (len(mine), keys), pool, picked, {aid: r for aid, (_, r) in mine.items()}
