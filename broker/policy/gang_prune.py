"""Fewest victims for gangs: drop the victims a gang search no longer needs. Pure.

broker.policy.victims searches greedily, node by node; this pass makes its answer
irredundant (issue 28 part 4: two victims spanning two nodes each free both, so a third
victim taken first for another node is not needed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from broker.policy.capacity import Capacity
from broker.policy.reclaim_index import VictimKey
from broker.policy.snapshot import RunningView


def drop_unneeded(cap: Capacity, pos: Mapping[str, int], pool: str, g: int, n: int,
                  incoming: Mapping[str, int], mine: dict[int, tuple[VictimKey, RunningView]],
                  picked: list[str]) -> list[str]:
    """Drop from `mine` (in place) every victim the gang no longer needs, the latest in
    victim order first, and return the n nodes to hold.

    The greedy search adds victims node by node, so a victim taken early can become
    unneeded once later ones free whole nodes (a victim spanning nodes). One pass from the
    latest victim leaves no removable member: a victim kept because the rest were not
    enough without it stays needed as others are dropped (fewer victims never fit more
    nodes). Nodes: the ones picked that still fit, then others that the remaining victims
    or incoming GPUs make fit (by their place in the pool), then the fullest free ones."""
    pool_of = cap.pool_of
    freed: dict[str, int] = defaultdict(int, incoming)
    for _, r in mine.values():
        for x, gg in r.alloc:
            freed[x] += gg
    b = cap.buckets[pool]
    fit = sum(len(b[f]) for f in range(g, len(b)))  # fit without victims or incoming
    fit += sum(1 for x, gg in freed.items()
               if pool_of.get(x) == pool and cap.avail(x) < g <= cap.avail(x) + gg)
    dropped = False
    for aid, (_, r) in sorted(mine.items(), key=lambda e: e[1][0], reverse=True):
        lost = 0
        for x, gg in r.alloc:
            if pool_of.get(x) == pool:
                a = cap.avail(x)
                if a < g <= a + freed[x] and a + freed[x] - gg < g:
                    lost += 1
        if fit - lost >= n:
            fit -= lost
            del mine[aid]
            for x, gg in r.alloc:
                freed[x] -= gg
            dropped = True
    if not dropped:
        return picked

    def fits(x: str) -> bool:
        return cap.avail(x) + freed.get(x, 0) >= g

    out = [x for x in picked if fits(x)]
    more = sorted((x for x, gg in freed.items() if gg > 0 and pool_of.get(x) == pool
                   and x not in out and fits(x)), key=pos.__getitem__)
    out += more[:n - len(out)]
    if len(out) < n:
        out += [x for x in cap.fullest(pool, n + len(out), {}) if x not in out][:n - len(out)]
    return out

