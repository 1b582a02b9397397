"""Working copy of free GPUs per node, indexed for fast best-fit. Private to the planner."""

from __future__ import annotations

from broker.policy.snapshot import Alloc, PoolView


class Capacity:
    """Free GPUs per node with, per pool, buckets of nodes by free count.

    `count_fit` and `take` cost O(gpus_per_node), not O(nodes): plan() stays fast at
    thousands of nodes. Iteration order is deterministic (insertion-ordered dicts).
    """

    def __init__(self, pools: tuple[PoolView, ...], used: dict[str, int] | None) -> None:
        """`used`: GPUs held per node id; None means every NodeView carries its own `used`."""
        self.free: dict[str, int] = {}
        self.pool_of: dict[str, str] = {}
        self.size: dict[str, int] = {}
        self.buckets: dict[str, list[dict[str, None]]] = {}
        free, pool_of = self.free, self.pool_of
        for p in pools:
            gpn, name = p.gpus_per_node, p.name
            b: list[dict[str, None]] = [{} for _ in range(gpn + 1)]
            self.buckets[name] = b
            self.size[name] = gpn
            for node in p.nodes:
                nid = node.id
                held = node.used if used is None else used.get(nid, 0)
                f = min(node.gpus, gpn) - (held or 0)
                if f < 0:
                    f = 0
                free[nid] = f
                pool_of[nid] = name
                if f:
                    b[f][nid] = None

    def max_free(self) -> int:
        """The most free GPUs on any one node, over all pools."""
        best = 0
        for b in self.buckets.values():
            for f in range(len(b) - 1, best, -1):
                if b[f]:
                    best = f
                    break
        return best

    def set_free(self, node: str, value: int) -> None:
        b = self.buckets[self.pool_of[node]]
        old = self.free[node]
        if old:
            del b[old][node]
        if value:
            b[value][node] = None
        self.free[node] = value

    def count_fit(self, pool: str, g: int, n: int) -> bool:
        """True if at least n nodes of the pool have g or more free GPUs."""
        b = self.buckets[pool]
        have = 0
        for f in range(g, len(b)):
            have += len(b[f])
            if have >= n:
                return True
        return False

    def take(self, pool: str, g: int, n: int) -> Alloc:
        """Take g GPUs on each of n nodes, best fit (fullest nodes that still fit first).

        The caller checks count_fit first; the result is undefined otherwise.
        """
        b = self.buckets[pool]
        chosen: list[str] = []
        for f in range(g, len(b)):
            for node in b[f]:
                chosen.append(node)
                if len(chosen) == n:
                    break
            if len(chosen) == n:
                break
        for node in chosen:
            self.set_free(node, self.free[node] - g)
        return tuple((node, g) for node in chosen)

    def hold(self, nodes: list[str], g: int) -> Alloc:
        """Reserve up to g free GPUs on each node; returns what was actually held."""
        held = []
        for node in nodes:
            k = min(g, self.free[node])
            if k:
                self.set_free(node, self.free[node] - k)
                held.append((node, k))
        return tuple(held)

    def fullest(self, pool: str, n: int, extra: dict[str, int]) -> list[str]:
        """The n nodes of the pool with the most free GPUs (counting `extra` incoming ones)."""
        b = self.buckets[pool]
        out: list[str] = [nd for nd in extra if self.pool_of.get(nd) == pool]
        out.sort(key=lambda nd: -(self.free[nd] + extra[nd]))
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
