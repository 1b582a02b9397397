"""Reservations for blocked jobs, and backfill around them (EASY, as Slurm's backfill). Pure.

The first `reservations` blocked jobs in queue order (that neither fit, nor preempt, nor rent)
get a reservation:

- Estimated start T. A node of a candidate pool (one no other reservation or preemption
  holds) would have the job's GPUs at the earliest time its available GPUs, plus those of the
  attempts on it that are expected to have ended by then, reach them. An attempt's end is its
  expected end (see RunningView.expected_end; one placed in this plan: now + its job's
  estimate); an attempt with no estimate, or running past it, has no known end; a signalled
  attempt ends within grace_s unless its GPUs go to the job it was preempted for. T is the
  n-th earliest over the pool's nodes; the pool with the earliest T wins (ties: the first
  candidate pool, the cheapest).
- What it holds (easy=True). On each of its n nodes, the available GPUs it will still need at
  T (its GPUs per node minus what is released there by T). A later job may use held GPUs
  if it is expected to end by T (its `expected_duration_s`), or, with `preemptible_backfill`
  and preemption on, if it is of a strictly lower class than the reserved job (which then
  preempts it at T, as it may) and T is at least the job's checkpoint interval away, so it
  can save a checkpoint's worth of work before it yields. A job with no estimate and no
  lower class never uses them. A reservation whose start is unknown (fewer than n nodes would ever fit, as
  far as the estimates say) holds nothing: no GPU idles for a start nobody can predict.
- easy=False: the reservation holds the free GPUs of the n nodes closest to fitting against
  every later job (the rule before EASY; it idles GPUs that short jobs could use).

An estimate is never trusted blindly: an attempt that overruns its estimate has no known end
from then on, and the plan's `wake_at` names the earliest such overrun that would move a
reservation, so a simulator replans exactly then.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from broker.policy.capacity import Capacity
from broker.policy.snapshot import Alloc, NodeView, PendingView, PoolView, RunningView

INF = math.inf
_RELEASES = attrgetter("releases")


class Backfill:
    """The plan's reservations with a known start, and the release times behind them."""

    def __init__(self, cap: Capacity, pools: Sequence[PoolView], running: Iterable[RunningView],
                 now: float, grace_s: float) -> None:
        self.cap, self.now = cap, now
        self._pools = pools
        self._running = running
        self._grace = grace_s
        self._ends: Mapping[str, Sequence[tuple[float, int]]] | None = None
        self._all_own: bool | None = None  # every node carries its own `releases`
        self._placed: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.start: dict[str, float] = {}  # node -> start of the EASY reservation holding it
        self.rank: dict[str, int] = {}  # node -> class of the job that reservation is for
        self.by_pool: dict[str, list[str]] = defaultdict(list)  # EASY-reserved nodes per pool
        self.wake: float | None = None

    def _release_times(self) -> Mapping[str, Sequence[tuple[float, int]]]:
        """Per node, (expected end, GPUs) of the attempts on it, soonest first, derived from
        the running attempts (for nodes that do not carry their own `releases`)."""
        if self._ends is None:
            ends: dict[str, list[tuple[float, int]]] = defaultdict(list)
            now = self.now
            for r in self._running:
                if r.stopping:
                    end = now + self._grace if r.stopping_for is None else INF
                else:
                    end = r.expected_end if r.expected_end is not None else INF
                for node, g in r.alloc:
                    ends[node].append((end, g))
            for lst in ends.values():
                lst.sort()
            self._ends = ends
        return self._ends

    def placed(self, alloc: Alloc, duration: float | None) -> None:
        """A job placed in this plan will release its GPUs after its estimate (if known)."""
        end = self.now + duration if duration is not None else INF
        for node, g in alloc:
            self._placed[node].append((end, g))

    def _releases(self, nv: NodeView) -> Sequence[tuple[float, int]]:
        """The node's release times: its own `releases` when every node has them, else
        derived from the running attempts; plus those of jobs placed in this plan."""
        if self._all_own is None:
            self._all_own = not any(None in map(_RELEASES, p.nodes) for p in self._pools)
        node = nv.id
        own = nv.releases if self._all_own and nv.releases is not None else (
            self._release_times().get(node, ()))
        extra = self._placed.get(node)
        return sorted([*own, *extra]) if extra else own

    def reserve(self, j: PendingView, rank: int, pools: Sequence[str], easy: bool,
                incoming: Mapping[str, int]) -> tuple[str, Alloc, float | None, int]:
        """Reserve for blocked job j (of effective class `rank`) in one of `pools`: (pool, GPUs
        held per node, estimated start or None when unknown, GPUs the reason names)."""
        cap, g, n = self.cap, j.gpus_per_node, j.nodes
        if not easy:
            best: tuple[int, str, list[str]] | None = None
            for p in pools:
                nodes = cap.fullest(p, n, dict(incoming))
                have = sum(min(cap.avail(nd), g) for nd in nodes)
                if best is None or have > best[0]:
                    best = (have, p, nodes)
            assert best is not None
            return best[1], cap.hold(best[2], g), None, best[0]
        choice: tuple[float, str, list[tuple[float, int, str]]] | None = None
        now, start_of, held_now, free = self.now, self.start, cap.held, cap.free
        placed = self._placed
        by_name = {pv.name: pv for pv in self._pools}
        derived: Mapping[str, Sequence[tuple[float, int]]] | None = None
        for p in pools:
            ready = []
            for i, nv in enumerate(by_name[p].nodes):
                nd = nv.id
                if nd in start_of or nd in held_now:
                    continue  # another reservation or a preemption has it
                have = free[nd]
                if have >= g:
                    ready.append((now, i, nd))
                    continue
                pre = nv.ready
                if (pre is not None and now < nv.ready_until and nd not in placed
                        and have == nv.gpus - (nv.used or 0)):
                    t = pre[g - 1] if g <= len(pre) else INF  # the caller's index still holds
                else:
                    own: Sequence[tuple[float, int]]
                    if nv.releases is not None:
                        own = nv.releases
                    else:
                        if derived is None:
                            derived = self._release_times()
                        own = derived.get(nd, ())
                    if nd in placed:
                        own = sorted([*own, *placed[nd]])
                    t = _ready_at(have, own, g, now)
                if t < INF:
                    ready.append((t, i, nd))
            if len(ready) < n:
                continue
            ready.sort()
            t_p = ready[n - 1][0]
            if choice is None or t_p < choice[0]:
                choice = (t_p, p, ready[:n])
        if choice is None:
            return pools[0], (), None, 0
        start, pool, chosen = choice
        hold_nodes: list[tuple[str, int]] = []
        views = by_name[pool].nodes
        for _t, i, nd in chosen:
            rel = [(end, k) for end, k in self._releases(views[i]) if now < end <= start]
            need = max(0, g - sum(k for _, k in rel))
            if need:
                hold_nodes.append((nd, need))
            self.start[nd] = start
            self.rank[nd] = rank
            self.by_pool[pool].append(nd)
            for end, _k in rel:
                if self.wake is None or end < self.wake:
                    self.wake = end  # an overrun here would move the start: replan then
        held: list[tuple[str, int]] = []
        for nd, need in hold_nodes:
            held.extend(cap.hold([nd], need, easy=True))
        return pool, tuple(held), start, sum(k for _, k in held)

    def usable(self, pool: str, g: int, end: float, rank: int, preemptible_from: float) -> list[str]:
        """EASY-reserved nodes of the pool a job of class `rank` ending at `end` may use for g
        GPUs, best fit: it ends by the start, or (preemptible backfill) it is of a lower class
        than the reserved job, which can preempt it then, and the start is at least
        `preemptible_from` away (time to save a checkpoint's worth of work first)."""
        cap, start_of, res_rank = self.cap, self.start, self.rank
        out = [nd for nd in self.by_pool.get(pool, ())
               if (start_of[nd] >= end or (rank < res_rank[nd] and start_of[nd] >= preemptible_from))
               and cap.avail(nd) + cap.easy.get(nd, 0) >= g]
        out.sort(key=lambda nd: cap.avail(nd) + cap.easy.get(nd, 0))
        return out

    def could_use(self, g: int, end: float, rank: int, preemptible_from: float) -> bool:
        """Whether any EASY-reserved node could still take g GPUs of such a job (see usable)."""
        cap, res_rank = self.cap, self.rank
        return any((t >= end or (rank < res_rank[nd] and t >= preemptible_from))
                   and cap.avail(nd) + cap.easy.get(nd, 0) >= g for nd, t in self.start.items())

def _ready_at(have: int, releases: Sequence[tuple[float, int]], g: int, now: float) -> float:
    """When a node with `have` free GPUs has g, by releases ending after `now` (inf: never)."""
    for end, k in releases:
        if end == INF:
            break
        if end <= now:
            continue  # overran its estimate: its end is unknown
        have += k
        if have >= g:
            return end
    return INF


def ready_times(free: int, releases: Sequence[tuple[float, int]], size: int,
                now: float) -> tuple[tuple[float, ...], float]:
    """(ready, until) for NodeView: ready[g - 1] = when the node has g free GPUs by the
    releases ending after `now` (inf: not known to); valid until the earliest end counted."""
    out: list[float] = []
    have = free
    until = INF
    for end, k in releases:
        if end == INF:
            break
        if end <= now:
            continue
        until = min(until, end)
        have += k
        while len(out) < min(have, size):
            out.append(now if len(out) < free else end)
    while len(out) < min(free, size):
        out.append(now)
    out.extend([INF] * (size - len(out)))
    return tuple(out), until
