"""Working copy of free GPUs per node, indexed for fast best-fit. Private to the planner."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable

from broker.policy.free_index import FreeIndex
from broker.policy.snapshot import Alloc, PoolView, RunningView
from broker.policy.warm import warm_first


def enough(buckets: list[dict[str, None]], g: int, n: int) -> bool:
    """True if the buckets (nodes by how many GPUs they have available) hold at least n nodes
    with g or more."""
    have = 0
    for f in range(g, len(buckets)):
        have += len(buckets[f])
        if have >= n:
            return True
    return False


class Capacity:
    """Free GPUs per node for one plan, and what reservations hold of them.

    Per node: `free` (GPUs no attempt holds and nothing was placed on in this plan) and
    `held` (the part of `free` held for blocked jobs). `easy` is the part of `held` an EASY
    reservation holds: jobs that end before its start may use it (see broker.policy.backfill).
    `avail` = free - held is what any job may take. Per pool, nodes sit in buckets by avail,
    so count_fit and take cost O(GPUs per node), not O(nodes). `avail` never grows during a
    plan. Iteration order is deterministic (insertion-ordered dicts).
    """

    def __init__(self, pools: tuple[PoolView, ...], running: Iterable[RunningView],
                 index: FreeIndex | None = None) -> None:
        """Free GPUs from the pools' nodes: a NodeView's `used` when it has one, else the sum
        of the running attempts' allocations on it; or copied from `index`, which must hold
        the same figures (see FreeIndex; ValueError when it visibly does not)."""
        if index is not None:
            self._from_index(pools, index)
            return
        self.free: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.easy: dict[str, int] = {}
        self.pool_of: dict[str, str] = {}
        self.size: dict[str, int] = {}
        self.nodes: dict[str, list[str]] = {}
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.listener: Callable[[str], None] | None = None  # told when a node's avail shrinks
        free, pool_of = self.free, self.pool_of
        summed: dict[str, int] | None = None
        for p in pools:
            gpn, name = p.gpus_per_node, p.name
            b: list[dict[str, None]] = [{} for _ in range(gpn + 1)]
            self.buckets[name] = b
            self.size[name] = gpn
            nodes = p.nodes
            ids = self.nodes[name] = [nd.id for nd in nodes]
            try:  # every node says what it uses (the simulator's do): no summing needed
                frees = [(nd.gpus if nd.gpus < gpn else gpn) - nd.used  # type: ignore[operator]
                         for nd in nodes]
            except TypeError:
                if summed is None:
                    summed = defaultdict(int)
                    for r in running:
                        for nd_id, g in r.alloc:
                            summed[nd_id] += g
                frees = [(nd.gpus if nd.gpus < gpn else gpn)
                         - (nd.used if nd.used is not None else summed.get(nd.id, 0)) for nd in nodes]
            pool_of.update(dict.fromkeys(ids, name))
            free.update(zip(ids, frees, strict=True))
            for nid, f in zip(ids, frees, strict=True):
                if f > 0:
                    b[f][nid] = None
                elif f:
                    free[nid] = 0  # over-committed: nothing free

    def _from_index(self, pools: tuple[PoolView, ...], index: FreeIndex) -> None:
        if len(pools) != len(index.size):
            raise ValueError("free index: its pools are not the snapshot's")
        self.free = dict(index.free)
        self.held = {}
        self.easy = {}
        self.pool_of = index.pool_of  # read-only here, like `nodes`
        self.size = {}
        self.nodes = {}
        self.buckets = {}
        self.listener = None
        for p in pools:
            name = p.name
            ids = index.nodes.get(name)
            if ids is None or len(ids) != len(p.nodes) or index.size[name] != p.gpus_per_node:
                raise ValueError(f"free index: pool {name!r} differs from the snapshot's")
            self.size[name] = p.gpus_per_node
            self.nodes[name] = ids
            self.buckets[name] = index.ordered_buckets(name)

    def avail(self, node: str) -> int:
        return self.free[node] - self.held.get(node, 0)

    def max_avail(self, pools: Iterable[str] | None = None) -> int:
        """The most GPUs any one node of these pools (default: all) has available."""
        best = 0
        for name in self.buckets if pools is None else pools:
            b = self.buckets[name]
            for f in range(len(b) - 1, best, -1):
                if b[f]:
                    best = f
                    break
        return best

    def _set(self, node: str, free: int, held: int) -> None:
        old = self.free[node] - self.held.get(node, 0)
        new = free - held
        self.free[node] = free
        if held:
            self.held[node] = held
        else:
            self.held.pop(node, None)
        if old != new:
            b = self.buckets[self.pool_of[node]]
            if old:
                del b[old][node]
            if new:
                b[new][node] = None
            if self.listener is not None:
                self.listener(node)

    def count_fit(self, pool: str, g: int, n: int) -> bool:
        """True if at least n nodes of the pool have g or more GPUs available."""
        return enough(self.buckets[pool], g, n)

    def take(self, pool: str, g: int, n: int, exclude: Collection[str] = (),
             warm: Collection[str] = ()) -> Alloc:
        """Take g available GPUs on each of n nodes, best fit (the fullest nodes that still
        fit first; among equals, the `warm` ones first: broker.policy.warm), skipping
        `exclude`. The caller checks that enough nodes fit; the result is undefined otherwise."""
        b = self.buckets[pool]
        chosen: list[str] = []
        for f in range(g, len(b)):
            for node in warm_first(b[f], warm) if warm else b[f]:
                if node in exclude:
                    continue
                chosen.append(node)
                if len(chosen) == n:
                    break
            if len(chosen) == n:
                break
        held = self.held
        for node in chosen:
            self._set(node, self.free[node] - g, held.get(node, 0))
        return tuple((node, g) for node in chosen)

    def take_easy(self, node: str, g: int) -> None:
        """A job that ends before the node's EASY reservation starts takes g GPUs: the held
        part first (it leaves before they are needed), then the available part."""
        e = min(self.easy.get(node, 0), g)
        if e:
            self.easy[node] -= e
        self._set(node, self.free[node] - g, self.held.get(node, 0) - e)

    def hold(self, nodes: Iterable[str], g: int, easy: bool = False) -> Alloc:
        """Hold up to g available GPUs on each node; returns what was actually held. `easy`:
        for an EASY reservation (jobs ending before its start may still use them)."""
        out = []
        for node in nodes:
            k = min(g, self.avail(node))
            if k > 0:
                if easy:
                    self.easy[node] = self.easy.get(node, 0) + k
                self._set(node, self.free[node], self.held.get(node, 0) + k)
                out.append((node, k))
        return tuple(out)

    def fullest(self, pool: str, n: int, extra: dict[str, int]) -> list[str]:
        """The n nodes of the pool with the most available GPUs (counting `extra` incoming)."""
        b = self.buckets[pool]
        out: list[str] = [nd for nd in extra if self.pool_of.get(nd) == pool]
        out.sort(key=lambda nd: -(self.avail(nd) + extra[nd]))
        out = out[:n]
        for f in range(len(b) - 1, 0, -1):
            if len(out) >= n:
                break
            for node in b[f]:
                if node not in extra:
                    out.append(node)
                    if len(out) >= n:
                        break
        return out
