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
  only if it is expected to end by T (its `expected_duration_s`); a job with no estimate
  never does. A reservation whose start is unknown (fewer than n nodes would ever fit, as
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

from broker.policy.capacity import Capacity
from broker.policy.snapshot import Alloc, PendingView, RunningView

INF = math.inf


class Backfill:
    """The plan's reservations with a known start, and the release times behind them."""

    def __init__(self, cap: Capacity, running: Iterable[RunningView], now: float, grace_s: float) -> None:
        self.cap, self.now = cap, now
        self._running = running
        self._grace = grace_s
        self._ends: dict[str, list[tuple[float, int]]] | None = None
        self.start: dict[str, float] = {}  # node -> start of the EASY reservation holding it
        self.by_pool: dict[str, list[str]] = defaultdict(list)  # EASY-reserved nodes per pool
        self.latest = -INF  # the latest start of any EASY reservation
        self.wake: float | None = None

    def _release_times(self) -> dict[str, list[tuple[float, int]]]:
        """Per node, (expected end, GPUs) of the attempts on it, soonest first."""
        if self._ends is None:
            ends: dict[str, list[tuple[float, int]]] = defaultdict(list)
            now = self.now
            for r in self._running:
                if r.stopping:
                    end = now + self._grace if r.stopping_for is None else INF
                else:
                    e = r.expected_end
                    end = e if e is not None and e > now else INF
                for node, g in r.alloc:
                    ends[node].append((end, g))
            for lst in ends.values():
                lst.sort()
            self._ends = ends
        return self._ends

    def placed(self, alloc: Alloc, duration: float | None) -> None:
        """A job placed in this plan will release its GPUs after its estimate (if known)."""
        ends = self._release_times()
        end = self.now + duration if duration is not None else INF
        for node, g in alloc:
            lst = ends[node]
            lst.append((end, g))
            lst.sort()

    def _ready_at(self, node: str, g: int) -> tuple[float, float | None]:
        """(when the node could hold g GPUs, the latest attempt end that counts for it)."""
        have = self.cap.avail(node)
        if have >= g:
            return self.now, None
        for end, k in self._release_times().get(node, ()):
            if end == INF:
                break
            have += k
            if have >= g:
                return end, end
        return INF, None

    def reserve(self, j: PendingView, pools: Sequence[str], easy: bool,
                incoming: Mapping[str, int]) -> tuple[str, Alloc, float | None, int]:
        """Reserve for blocked job j in one of `pools`: (pool, GPUs held per node, estimated
        start or None when unknown, GPUs the reason names)."""
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
        for p in pools:
            ready = []
            for i, nd in enumerate(cap.nodes[p]):
                if nd in self.start or cap.held.get(nd):
                    continue  # another reservation or a preemption has it
                t, _ = self._ready_at(nd, g)
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
        ends = self._release_times()
        hold_nodes: list[tuple[str, int]] = []
        for _t, _i, nd in chosen:
            released = sum(k for end, k in ends.get(nd, ()) if end <= start)
            need = max(0, g - released)
            if need:
                hold_nodes.append((nd, need))
            self.start[nd] = start
            self.by_pool[pool].append(nd)
            for end, _k in ends.get(nd, ()):
                if self.now < end <= start and (self.wake is None or end < self.wake):
                    self.wake = end  # an overrun here would move the start: replan then
        held: list[tuple[str, int]] = []
        for nd, need in hold_nodes:
            held.extend(cap.hold([nd], need, easy=True))
        self.latest = max(self.latest, start)
        return pool, tuple(held), start, sum(k for _, k in held)

    def usable(self, pool: str, g: int, end: float) -> list[str]:
        """EASY-reserved nodes of the pool a job ending at `end` may use for g GPUs, best fit."""
        cap = self.cap
        out = [nd for nd in self.by_pool.get(pool, ())
               if self.start[nd] >= end and cap.avail(nd) + cap.easy.get(nd, 0) >= g]
        out.sort(key=lambda nd: cap.avail(nd) + cap.easy.get(nd, 0))
        return out

    def could_use(self, g: int) -> bool:
        """Whether any EASY-reserved node could still take g GPUs of a short enough job."""
        cap = self.cap
        return any(cap.avail(nd) + cap.easy.get(nd, 0) >= g for nd in self.start)
