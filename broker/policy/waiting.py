"""Why the jobs plan() did not reach wait (the "why waiting" reasons the live engine asks for
with explain=True). Pure.

A job the walk did not reach waits for its list's reason when its list was dropped, else for
the reason the walk ended with; a job no pool could take waits for that instead. At 100,000
pending jobs this is most of a plan's work, so it is done per run of jobs rather than per job:
the jobs of a run that share what candidate pools depend on (GPU types, spot policy, team,
shape, class) are answered once, and their (job id, reason) pairs are made in C
(zip/repeat/map) rather than one by one in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from operator import attrgetter, itemgetter

from broker.policy.snapshot import PendingView

_ID = attrgetter("job_id")
_FIRST = itemgetter(0)
# what a job's candidate pools depend on, besides the pools (broker.policy.plan_state.PlanState._candidates)
_CAND_ATTRS = [attrgetter(a) for a in ("gpu_types", "spot", "team", "gpus_per_node", "nodes", "priority")]
_BEYOND_LIST_KEY = _CAND_ATTRS[:2]  # what the jobs of one list (broker.policy.queue) may differ in


def _alike(jobs: list[PendingView], same_list: bool) -> bool:
    """Whether every job of `jobs` shares what candidate pools depend on (`same_list`: they
    share a list key, so only GPU types and spot policy are compared). list.count compares in
    C, identity first: no hashing (an enum hashes in Python)."""
    n = len(jobs)
    for get in _BEYOND_LIST_KEY if same_list else _CAND_ATTRS:
        vals = list(map(get, jobs))
        if vals.count(vals[0]) != n:
            return False
    return True


def rest_reasons(runs: Iterable[tuple[list[PendingView], str | None, bool]], unreached: str,
                 no_pool: str, has_pool: Callable[[PendingView], bool]) -> list[tuple[int, str]]:
    """(job id, reason) for every job of `runs` (the walk's rest: runs of jobs with their list's
    reason, None when not reached, and whether they share a list key), by job id. A run's
    reason, else `unreached`, unless no pool takes the job (`has_pool(job)` false): then
    `no_pool`."""
    rest: list[tuple[int, str]] = []
    known: dict[tuple[object, ...], bool] = {}  # per (types, spot, team, shape, class)
    get = known.get

    def ok(j: PendingView) -> bool:
        k = (j.gpu_types, id(j.spot), j.team, j.gpus_per_node, j.nodes, id(j.priority))
        got = get(k)
        if got is None:
            got = known[k] = has_pool(j)
        return got

    for jobs, why, same_list in runs:
        if not jobs:
            continue
        why = why or unreached
        if _alike(jobs, same_list):
            rest.extend(zip(map(_ID, jobs), repeat(why if ok(jobs[0]) else no_pool)))
        else:
            rest.extend((j.job_id, why if ok(j) else no_pool) for j in jobs)
    rest.sort(key=_FIRST)
    return rest
