"""Running attempts indexed for preemption, kept across cycles by a caller that owns them (the
simulator), so that plan() adjusts an index instead of reading every running attempt. Pure.

What it keeps, for the attempts not stopping (the only possible victims): each one's class as
a victim before the per-plan rules (its priority's, one higher when its job was aged when the
attempt started: `aged` below, fixed for the attempt's life), the GPUs per node
below each such class, and per class the attempts in the order of the victim key's last two
fields (the youngest first, then the job id), so that plan() sorts only by lost work, and
only the classes a search reaches.

plan() builds the same index from the snapshot's `running` when it is given none (the live
engine): an index changes how fast a plan is made, never what it decides. The per-plan rules
are applied by broker.policy.victims.VictimIndex on top: the minimum run time, the
anti-capture demotions and the top waiting class.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from broker.policy.queue import AGE_LIMIT
from broker.policy.snapshot import RunningView
from broker.spec import Priority

RANKS = 4
RANK_OF = {p: p.rank for p in Priority}
VictimKey = tuple[float, ...]


def aged(r: RunningView, rank: int, aged_after: float | None, gangs_only: bool) -> int:
    """The class a running attempt holds as a victim, given its class `rank` so far: one
    higher when its job had waited `aged_after` since submission when this attempt started
    (aging as the queue applies it to waiting jobs: low to normal only; multi-node attempts
    only, with `gangs_only`). Without it, two aged jobs of one class preempt each other in
    turn: each, requeued, is aged again at once (its age counts from submission)."""
    if (aged_after is not None and rank < AGE_LIMIT and r.started_at - r.submit_time >= aged_after
            and (not gangs_only or len(r.alloc) > 1)):
        return rank + 1
    return rank


def lost_gpu_s(r: RunningView, now: float) -> float:
    """GPU-seconds of work since the attempt's last checkpoint (or its start)."""
    ck = r.last_checkpoint(now)
    since = r.started_at if ck is None else max(r.started_at, ck)
    return max(0.0, now - since) * r.gpus


def victim_key(r: RunningView, rank: int, now: float, mode: str) -> VictimKey:
    if mode == "youngest":
        return (rank, -r.started_at, r.job_id)
    return (rank, lost_gpu_s(r, now), -r.started_at, r.job_id)


def index_key(r: RunningView, rank: int, now: float, youngest: bool) -> VictimKey:
    """victim_key(), inlined for the index (it runs over every eligible
    attempt): the same values, bit for bit."""
    if youngest:
        return (rank, -r.started_at, r.job_id)
    since = r.started_at
    ck = r.last_checkpoint_at
    if ck is not None and ck > since:
        since = ck
    period = r.checkpoint_period_s
    if period and now >= r.checkpoint_origin + period:
        ck = r.checkpoint_origin + ((now - r.checkpoint_origin) // period) * period
        if ck > since:
            since = ck
    return (rank, (now - since) * r.gpus if now > since else 0.0, -r.started_at, r.job_id)


def age_key(r: RunningView) -> tuple[float, int]:
    """The victim key's last two fields, as a sort key: the youngest first, then job id."""
    return (-r.started_at, r.job_id)


class ReclaimIndex:
    """A snapshot's running attempts, for preemption (see the module docstring).

    The contract, whenever the index goes to plan() (Snapshot.reclaim_index): it holds exactly
    the snapshot's `running`, each by its very view, and was made with the `aged_after` and
    `gangs_only` that plan()'s config gives (PolicyConfig.promote_after_s when classes are on,
    else None, and promote_gangs_only). The caller keeps it so by calling `add` when an
    attempt starts, `remove` when it ends and `update` when its view changes. plan() only
    reads it, and raises ValueError when it visibly disagrees (another number of attempts or
    of stopping ones, other aging parameters).
    """

    def __init__(self, running: Iterable[RunningView] = (), aged_after: float | None = None,
                 gangs_only: bool = True) -> None:
        """An index of `running` (empty by default). Raises ValueError on a repeated id."""
        self.aged_after, self.gangs_only = aged_after, gangs_only
        self.size = 0  # attempts indexed, stopping or not
        self.stopping: set[int] = set()
        self.live: dict[int, RunningView] = {}  # the attempts not stopping, by id
        self.rank: dict[int, int] = {}  # per attempt not stopping: its class as a victim
        # per node: [0, GPUs of attempts not stopping below class 1, below 2, below 3, below 4]
        self.below: dict[str, list[int]] = {}
        self.count = [0] * RANKS  # attempts not stopping, per class
        self.restarted: dict[int, RunningView] = {}  # not stopping, preempted before (min run)
        self.wide: dict[int, RunningView] = {}  # not stopping, on several nodes
        # per class, its attempts not stopping, the youngest first, then by job id; `keys`
        # alongside
        self.order: list[list[RunningView]] = [[] for _ in range(RANKS)]
        self.keys: list[list[tuple[float, int]]] = [[] for _ in range(RANKS)]
        for r in running:
            self.add(r)

    def add(self, r: RunningView) -> None:
        """An attempt started (or its new view, see update). Raises ValueError if its id is
        already indexed."""
        aid = r.attempt_id
        if aid in self.rank or aid in self.stopping:
            raise ValueError(f"attempt {aid} is already indexed")
        self.size += 1
        if r.stopping:
            self.stopping.add(aid)
            return
        rank = aged(r, RANK_OF[r.priority], self.aged_after, self.gangs_only)
        self.rank[aid] = rank
        self.live[aid] = r
        self.count[rank] += 1
        if r.times_preempted:
            self.restarted[aid] = r
        if len(r.alloc) > 1:
            self.wide[aid] = r
        below = self.below
        for node, g in r.alloc:
            rc = below.get(node)
            if rc is None:
                rc = below[node] = [0] * (RANKS + 1)
            for c in range(rank + 1, RANKS + 1):
                rc[c] += g
        k = age_key(r)
        keys = self.keys[rank]
        i = bisect_left(keys, k)
        keys.insert(i, k)
        self.order[rank].insert(i, r)

    def remove(self, r: RunningView) -> None:
        """The attempt ended (`r`: its view as indexed). Raises KeyError if not indexed."""
        aid = r.attempt_id
        if aid in self.stopping:
            self.stopping.remove(aid)
            self.size -= 1
            return
        rank = self.rank.pop(aid)
        del self.live[aid]
        self.size -= 1
        self.count[rank] -= 1
        self.restarted.pop(aid, None)
        self.wide.pop(aid, None)
        below = self.below
        for node, g in r.alloc:
            rc = below[node]
            for c in range(rank + 1, RANKS + 1):
                rc[c] -= g
            if not rc[RANKS]:
                del below[node]
        keys, order = self.keys[rank], self.order[rank]
        i = bisect_left(keys, age_key(r))
        if order[i].attempt_id != aid:
            raise KeyError(aid)
        del keys[i]
        del order[i]

    def update(self, old: RunningView, new: RunningView) -> None:
        """The attempt's view changed from `old` to `new` (same id)."""
        self.remove(old)
        self.add(new)


def drop(kept: ReclaimIndex, aids: Iterable[int], gone: set[int], counts: list[int],
         recl: dict[str, list[int]], own: set[str]) -> None:
    """Take the attempts `aids` of `kept` out of a plan's copy of its sums (see
    broker.policy.victims.VictimIndex): each one not yet `gone` goes there, its class's count
    in `counts` drops, and per node `recl[node][c]` (GPUs of victims of a class below c)
    loses its GPUs, the node's list copied first unless it is in `own` (then added there)."""
    live, ranks = kept.live, kept.rank
    delta: dict[str, list[int]] = {}
    for aid in aids:
        r = live.get(aid)
        if r is None or aid in gone:
            continue
        gone.add(aid)
        rank = ranks[aid]
        counts[rank] -= 1
        for node, g in r.alloc:
            d = delta.get(node)
            if d is None:
                d = delta[node] = [0] * RANKS
            d[rank] += g
    for node, d in delta.items():
        rc = writable(recl, own, node)
        if rc is None:
            continue
        acc = 0
        for c in range(1, RANKS + 1):
            acc += d[c - 1]
            rc[c] -= acc


def writable(recl: dict[str, list[int]], own: set[str], node: str) -> list[int] | None:
    """`recl[node]` made this plan's own before its first change (copied unless `node` is in
    `own`, then added there); None for a node with no sums."""
    rc = recl.get(node)
    if rc is not None and node not in own:
        rc = recl[node] = rc.copy()
        own.add(node)
    return rc
