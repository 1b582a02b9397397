"""Fewest victims for gangs, checked on seeded random snapshots: no victim a plan chooses for
a gang can be removed with the gang still fitting (issue 28 part 4). Pure and fast."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from broker.policy import RunningView, plan

from .builders import job, pool, running, snap

GPN = 8


def _snapshot_parts(rng: random.Random) -> tuple[int, list[RunningView], int, int]:
    """A pool of 3-6 nodes of 8 GPUs filled with low and normal attempts (about 40% of them
    on two nodes) and a few urgent ones nobody may preempt; a high gang's shape."""
    nodes = rng.randint(3, 6)
    free = [GPN] * nodes
    run: list[RunningView] = []
    aid = 0
    for _ in range(rng.randint(3, 14)):
        prio = rng.choices(["low", "normal", "urgent"], weights=[6, 3, 1])[0]
        started = float(rng.randint(0, 999))
        ckpt = float(rng.randint(0, 999)) if rng.random() < 0.5 else None
        if rng.random() < 0.4:
            pair = rng.sample(range(nodes), 2)
            per = rng.choice([1, 2, 4])
            if all(free[i] >= per for i in pair):
                for i in pair:
                    free[i] -= per
                aid += 1
                run.append(running(aid, 100 + aid, prio=prio, started=started, ckpt=ckpt,
                                   alloc={f"a-{i}": per for i in sorted(pair)}))
            continue
        i = rng.randrange(nodes)
        g = rng.choice([1, 2, 4, 8])
        if free[i] >= g:
            free[i] -= g
            aid += 1
            run.append(running(aid, 100 + aid, prio=prio, started=started, ckpt=ckpt,
                               alloc={f"a-{i}": g}))
    return nodes, run, rng.choice([4, 6, 8]), rng.randint(2, min(3, nodes))


def _fitting_nodes(nodes: int, run: list[RunningView], victims: set[int], g: int) -> int:
    used: dict[str, int] = defaultdict(int)
    for r in run:
        if r.attempt_id not in victims:
            for nd, k in r.alloc:
                used[nd] += k
    return sum(1 for i in range(nodes) if GPN - used[f"a-{i}"] >= g)


@pytest.mark.parametrize("seed", range(4))
def test_no_gang_victim_is_removable(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    for _ in range(1500):
        nodes, run, g, n = _snapshot_parts(rng)
        s = snap([pool("a", nodes=nodes)], running=run,
                 pending=[job(9, prio="high", gpus=g, nodes=n)])
        chosen = {pe.attempt_id for pe in plan(s).preemptions}
        if not chosen:
            continue
        checked += 1
        assert _fitting_nodes(nodes, run, chosen, g) >= n, "the victims do not make the gang fit"
        for v in chosen:
            assert _fitting_nodes(nodes, run, chosen - {v}, g) < n, (
                f"victim {v} of {sorted(chosen)} is not needed: {run}")
    assert checked > 300  # the generator makes gangs preempt often enough to mean something
