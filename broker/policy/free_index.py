"""Free GPUs per node, kept across cycles by a caller that owns the nodes (the simulator), so
plan() copies an index instead of reading every node of every pool. Pure (no IO).

plan() builds the same figures itself from the snapshot's nodes when it is not given one
(the live engine): handing it an index changes how fast a plan is, never what it decides.
"""

from __future__ import annotations


class FreeIndex:
    """Free GPUs per node of a fixed set of pools, with the nodes bucketed by free count.

    The contract, whenever the index goes to plan() (Snapshot.free_index):
    - its pools are exactly the snapshot's pools (names and GPUs per node);
    - `nodes[pool]` lists the ids of the pool's PoolView.nodes, in that order;
    - `free[node]` is what plan() would derive from the node's view:
      max(0, min(gpus, gpus_per_node) - used).
    The caller keeps it so by calling `add` when a node joins a pool (it goes last in the
    pool's order, as a new node does in the caller's PoolView), `set` whenever a node's free
    GPUs change, and `drop` when a node leaves. Reordering a pool's nodes breaks the
    contract: build a new index then. plan() only reads the index; it raises ValueError
    when the index visibly disagrees with the snapshot (other pools, other node counts).
    """

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.pool_of: dict[str, str] = {}
        self.size: dict[str, int] = {}
        self.nodes: dict[str, list[str]] = {}
        # per pool, per free count f (index f; f > 0): node -> its place among the pool's
        # nodes (ever-increasing, so sorting by it gives the pool's order)
        self.buckets: dict[str, list[dict[str, int]]] = {}
        self._seq: dict[str, int] = {}
        self._next = 0
        # per pool and free count, the bucket's nodes in pool order (None: to sort again)
        self._ordered: dict[str, list[tuple[str, ...] | None]] = {}

    def add_pool(self, pool: str, gpus_per_node: int) -> None:
        """A pool with no nodes yet. Raises ValueError if the pool is known."""
        if pool in self.size:
            raise ValueError(f"pool {pool!r} is already indexed")
        self.size[pool] = gpus_per_node
        self.nodes[pool] = []
        self.buckets[pool] = [{} for _ in range(gpus_per_node + 1)]
        self._ordered[pool] = [None] * (gpus_per_node + 1)

    def add(self, pool: str, node: str, free: int) -> None:
        """A node joins the pool, last in its order, with `free` GPUs (clamped to 0..size).
        Raises ValueError if the node is known, KeyError if the pool is not."""
        if node in self.pool_of:
            raise ValueError(f"node {node!r} is already indexed")
        self.nodes[pool].append(node)
        self.pool_of[node] = pool
        self._seq[node] = self._next
        self._next += 1
        self.free[node] = 0
        self.set(node, free)

    def set(self, node: str, free: int) -> None:
        """The node now has `free` GPUs (clamped to 0..its pool's GPUs per node)."""
        pool = self.pool_of[node]
        size = self.size[pool]
        new = 0 if free < 0 else (size if free > size else free)
        old = self.free[node]
        if new == old:
            return
        b, ordered = self.buckets[pool], self._ordered[pool]
        if old:
            del b[old][node]
            ordered[old] = None
        if new:
            b[new][node] = self._seq[node]
            ordered[new] = None
        self.free[node] = new

    def drop(self, node: str) -> None:
        """The node leaves its pool (a no-op for a node not indexed)."""
        pool = self.pool_of.pop(node, None)
        if pool is None:
            return
        f = self.free.pop(node)
        if f:
            del self.buckets[pool][f][node]
            self._ordered[pool][f] = None
        self.nodes[pool].remove(node)
        del self._seq[node]

    def ordered_buckets(self, pool: str) -> list[dict[str, None]]:
        """A fresh copy of the pool's buckets (index: free GPUs), each in the pool's order."""
        ordered = self._ordered[pool]
        out: list[dict[str, None]] = []
        for f, d in enumerate(self.buckets[pool]):
            nodes = ordered[f]
            if nodes is None:
                nodes = ordered[f] = tuple(sorted(d, key=d.__getitem__))
            out.append(dict.fromkeys(nodes))
        return out
