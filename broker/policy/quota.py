"""Quotas with borrowing and reclaim (issue 28): the rules, and one plan's accounting. Pure.

The lab is one cohort (in Kueue's words): every team's nominal GPUs are lent to the others
while the team does not use them. A quota key is a GPU type, or "*" (every type) when the
quotas are in total (broker.spec.check_quotas: all teams alike). A team without a quota has a
nominal of 0: everything it runs is borrowed, and it has no limits.

1. **Used.** A team's GPUs on a key: its running attempts that are not stopping, on pools of
   that key; its waiting jobs that attempts are stopping for (on the key of those attempts'
   pool: a reclaim in progress keeps its quota); and what this plan placed or reclaimed for it.
2. **Within quota or borrowed.** A team's running attempts on a key, in the order (class,
   highest first; then the oldest start; then the attempt id), are within its quota while their
   GPUs add up to at most its nominal; that attempt and every later one are borrowed. A
   waiting job is within quota on a key when the team's used GPUs there plus the job's are at
   most its nominal.
3. **Borrowing.** A job that would take its team beyond its nominal on a key may use a pool of
   that key only if the team stays within `nominal + borrowing_limit` there, and, when some
   team has a lending limit on that key, the cohort's borrowed GPUs stay within what it lends:
   the GPUs in nobody's nominal plus, per team, its unused nominal up to its lending limit.
   With no lending limit anywhere (the default), borrowing is bounded by free GPUs alone:
   capacity nobody claims is lent, never idle. A lending limit is the one setting that can
   leave GPUs idle, by its owner's choice (Kueue's lendingLimit).
4. **Reclaim.** A job within quota on a key that does not fit preempts borrowed attempts of
   other teams on pools of that key, of any class (Kueue's reclaimWithinCohort: Any), with
   the fewest-victims search of broker.policy.victims (victims by the documented victim order:
   class, work lost since the last checkpoint, youngest, job id; a gang's unneeded victims
   dropped) and the minimum run time. It does so at once (no `preempt_after_s`, no checkpoint
   alignment: the guarantee is the point); its victims get the usual grace to checkpoint.
5. **Protected.** Attempts within their team's quota are never victims of preemption by
   class (urgent included): only their own team's demand moves them, by taking the quota
   from them (rule 2 orders the team's work by class). Borrowed attempts are victims by class
   as before (Kueue's borrowWithinCohort: LowerPriority), so a borrowing job may preempt
   lower-class borrowed work and nothing guaranteed.

Priority classes, fair share, aging and the urgent allowance still order the queue and still
decide who preempts by class among borrowed work; quotas only add reclaim (4), protection (5)
and the limits (3). Nothing changes when no team has a quota.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol

from broker.policy.capacity import Capacity
from broker.policy.config import PolicyConfig
from broker.policy.gang_prune import drop_unneeded
from broker.policy.queue import PendingQueue
from broker.policy.reclaim_index import VictimKey, victim_key
from broker.policy.snapshot import PendingView, PoolView, RunningView, TeamQuota, TeamView
from broker.policy.victims import Choice, OnNode, node_victims, preemptable
from broker.spec import QUOTA_TOTAL, QuotaSpec

BORROW_LIMIT = "its team is at its borrowing limit on {key} ({limit} GPUs beyond its quota of {nominal})"
LEND_LIMIT = "the other teams lend no more {key} GPUs (their lending limits)"


def _sort_key(r: RunningView) -> tuple[int, float, int]:
    return (-r.priority.rank, r.started_at, r.attempt_id)


class QuotaBook:
    """One plan's quota accounting (rules 1-3 of the module docstring), and the reclaim
    search (rule 4). Built from the snapshot's teams, pools and running attempts; updated as
    the plan places jobs and chooses victims."""

    def __init__(self, teams: Sequence[TeamView], pools: Sequence[PoolView],
                 running: Iterable[RunningView],
                 pending: Callable[[int], PendingView | None] = lambda _: None,
                 pool_of_node: Mapping[str, str] | None = None) -> None:
        """`pending`: a waiting job by id (for those that attempts are stopping for);
        `pool_of_node`: each node's pool, when the caller has it (else built here)."""
        quotas = {t.name: t.quota for t in teams if t.quota is not None}
        total = any(k == QUOTA_TOTAL for q in quotas.values() for k, _ in q.nominal)
        self.key_of_pool = {p.name: QUOTA_TOTAL if total else p.gpu_type for p in pools}
        if pool_of_node is None:
            pool_of_node = {nd.id: p.name for p in pools for nd in p.nodes}
        self.pool_of_node = pool_of_node
        self.nominal: dict[tuple[str, str], int] = {
            (t, k): n for t, q in quotas.items() for k, n in q.nominal}
        self.borrowing_limit = {t: q.borrowing_limit for t, q in quotas.items()}
        self.lending_limit = {t: q.lending_limit for t, q in quotas.items()
                              if q.lending_limit is not None}
        self.capacity: dict[str, int] = defaultdict(int)
        for p in pools:
            self.capacity[self.key_of_pool[p.name]] += p.gpus_per_node * len(p.nodes)
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self._borrowed: dict[int, tuple[str, RunningView]] | None = None
        self._within: set[int] | None = None
        groups: dict[tuple[str, str], list[RunningView]] = defaultdict(list)
        self._groups = groups
        coming: dict[int, str] = {}  # job id -> key, of jobs that attempts are stopping for
        used, key_of_pool, node_pool = self.used, self.key_of_pool, pool_of_node.get
        for r in running:
            pool = node_pool(r.alloc[0][0]) if r.alloc else None
            if pool is None:
                continue
            if not r.stopping:
                gk = (r.team, key_of_pool[pool])
                groups[gk].append(r)
                used[gk] += r.gpus
            elif r.stopping_for is not None:
                coming.setdefault(r.stopping_for, key_of_pool[pool])
        for jid, key in coming.items():
            j = pending(jid)
            if j is not None:
                self.used[(j.team, key)] += j.gpus

    @property
    def borrowed(self) -> dict[int, tuple[str, RunningView]]:
        """Running attempts beyond their team's quota (rule 2): attempt id -> (key, attempt)."""
        if self._borrowed is None:
            self._classify()
        assert self._borrowed is not None
        return self._borrowed

    @property
    def within(self) -> set[int]:
        """Ids of the running attempts within their team's quota (rules 2 and 5)."""
        if self._within is None:
            self._classify()
        assert self._within is not None
        return self._within

    def _classify(self) -> None:
        """Rule 2, on first need: only a team over a nonzero nominal needs its work sorted."""
        borrowed: dict[int, tuple[str, RunningView]] = {}
        within: set[int] = set()
        for (team, key), rs in self._groups.items():
            nominal = self.nominal.get((team, key), 0)
            if nominal <= 0:
                borrowed.update((r.attempt_id, (key, r)) for r in rs)
                continue
            if sum(r.gpus for r in rs) <= nominal:
                within.update(r.attempt_id for r in rs)
                continue
            acc = 0
            over = False
            for r in sorted(rs, key=_sort_key):
                acc += r.gpus
                over = over or acc > nominal
                if over:
                    borrowed[r.attempt_id] = (key, r)
                else:
                    within.add(r.attempt_id)
        self._borrowed, self._within = borrowed, within

    # -- rules 1-3 --------------------------------------------------------------------------
    def room(self, team: str) -> int:
        """The most GPUs the team could still take within its quota, on any one key."""
        return max((n - self.used[(t, k)] for (t, k), n in self.nominal.items() if t == team), default=0)

    def is_within(self, team: str, key: str, gpus: int) -> bool:
        """Whether `gpus` more GPUs on `key` keep the team within its nominal (rule 2)."""
        return self.used[(team, key)] + gpus <= self.nominal.get((team, key), 0)

    def refusal(self, team: str, key: str, gpus: int) -> str | None:
        """Why the team may not take `gpus` more GPUs on `key` (rule 3); None: it may."""
        nominal = self.nominal.get((team, key), 0)
        used = self.used[(team, key)]
        new = max(0, used + gpus - nominal) - max(0, used - nominal)
        if new <= 0:
            return None
        limit = self.borrowing_limit.get(team)
        shown = "any GPU type" if key == QUOTA_TOTAL else key
        if limit is not None and used + gpus > nominal + limit:
            return BORROW_LIMIT.format(key=shown, limit=limit, nominal=nominal)
        if self.lending_limit and self._borrowed_gpus(key) + new > self._lendable(key, team, gpus):
            return LEND_LIMIT.format(key=shown)
        return None

    def _borrowed_gpus(self, key: str) -> int:
        return sum(max(0, u - self.nominal.get((t, k), 0)) for (t, k), u in self.used.items() if k == key)

    def _lendable(self, key: str, team: str, gpus: int) -> int:
        """GPUs the cohort lends on `key` once `team` takes `gpus` more: those in nobody's
        nominal, plus each team's unused nominal up to its lending limit."""
        claimed = sum(n for (_, k), n in self.nominal.items() if k == key)
        out = max(0, self.capacity[key] - claimed)
        for (t, k), n in self.nominal.items():
            if k != key:
                continue
            unused = max(0, n - self.used[(t, k)] - (gpus if t == team else 0))
            lend = self.lending_limit.get(t)
            out += unused if lend is None else min(lend, unused)
        return out

    def allowed(self, j: PendingView, cands: list[PoolView]) -> tuple[list[PoolView], str | None]:
        """The candidate pools whose key the job's team may still use (rule 3), and why none
        when the list is empty."""
        out: list[PoolView] = []
        why: str | None = None
        seen: dict[str, str | None] = {}
        for p in cands:
            key = self.key_of_pool[p.name]
            if key not in seen:
                seen[key] = self.refusal(j.team, key, j.gpus)
            if seen[key] is None:
                out.append(p)
            elif why is None:
                why = seen[key]
        return out, why

    def charge(self, team: str, pool: str, gpus: int) -> None:
        """The plan placed (or reclaimed for) `gpus` GPUs of the team in `pool`."""
        self.used[(team, self.key_of_pool[pool])] += gpus

    def release(self, victims: Iterable[RunningView]) -> None:
        """The plan chose these attempts as victims: their GPUs no longer count as used."""
        for r in victims:
            pool = self.pool_of_node.get(r.alloc[0][0]) if r.alloc else None
            if pool is not None:
                self.used[(r.team, self.key_of_pool[pool])] -= r.gpus
            self.borrowed.pop(r.attempt_id, None)
            self.within.discard(r.attempt_id)

    # -- rule 4: reclaim --------------------------------------------------------------------
    def reclaim(self, j: PendingView, cands: Sequence[PoolView], cap: Capacity, taken: Collection[int],
                now: float, min_run_s: float, mode: str) -> Choice | None:
        """The fewest borrowed attempts of other teams to preempt so that the job, within its
        quota on a pool's key, fits n nodes of that pool (None: no pool where it can). Pools
        are tried in the caller's order; the fewest victims win, the first pool on a tie.
        `taken`: attempts already chosen as victims in this plan."""
        g, n = j.gpus_per_node, j.nodes
        best: Choice | None = None
        by_pool: dict[str, dict[str, list[OnNode]]] = {}
        for p in cands:
            key = self.key_of_pool[p.name]
            if not self.is_within(j.team, key, j.gpus):
                continue
            on = by_pool.get(p.name)
            if on is None:
                on = by_pool[p.name] = self._victims_on(p.name, j.team, taken, now, min_run_s, mode)
            if not on:
                continue
            got = _search(cap, p.name, g, n, on)
            if got is not None and (best is None or got[0] < best[0]):
                best = got
        return best

    def _victims_on(self, pool: str, team: str, taken: Collection[int], now: float, min_run_s: float,
                    mode: str) -> dict[str, list[OnNode]]:
        """Per node of the pool, the borrowed attempts of other teams that may be preempted
        now, as (key, attempt, GPUs there, node), in victim order."""
        key = self.key_of_pool[pool]
        out: dict[str, list[OnNode]] = defaultdict(list)
        for aid, (k, r) in self.borrowed.items():
            if k != key or r.team == team or aid in taken or not preemptable(r, now, min_run_s):
                continue
            vk: VictimKey = victim_key(r, r.priority.rank, now, mode)
            for nd, gg in r.alloc:
                if self.pool_of_node.get(nd) == pool:
                    out[nd].append((vk, r, gg, nd))
        for lst in out.values():
            lst.sort(key=lambda e: e[0])
        return out


def _search(cap: Capacity, pool: str, g: int, n: int, on: dict[str, list[OnNode]]) -> Choice | None:
    """The fewest victims among `on` that make n nodes of the pool fit g GPUs each: nodes are
    added one at a time, the one whose fewest victims make the most nodes fit first (a victim
    spanning nodes frees all of them), then the earliest victims in order, then the node's
    place; unneeded victims are dropped at the end (broker.policy.gang_prune)."""
    order = cap.nodes[pool]
    pos = {nd: i for i, nd in enumerate(order)}
    nodes = [nd for nd in order if nd in on or cap.avail(nd) >= g]
    mine: dict[int, tuple[VictimKey, RunningView]] = {}
    extra: dict[str, int] = defaultdict(int)
    picked: list[str] = []

    def free(r: RunningView, _k: VictimKey) -> bool:
        return r.attempt_id not in mine

    def fits(x: str) -> bool:
        return cap.avail(x) + extra[x] >= g

    while len(picked) < n:
        left = n - len(picked)
        best: tuple[tuple[float, list[VictimKey], int], list[tuple[VictimKey, RunningView]], list[str]] | None
        best = None
        for nd in nodes:
            if nd in picked:
                continue
            vs = node_victims(g, cap.avail(nd) + extra[nd], on.get(nd, ()), free)
            if vs is None:
                continue
            add: dict[str, int] = defaultdict(int)
            for _, r in vs:
                for x, gg in r.alloc:
                    add[x] += gg
            others = sorted((x for x in add if x != nd and x in pos and x not in picked
                             and cap.avail(x) + extra[x] + add[x] >= g), key=pos.__getitem__)
            gained = [nd, *others]
            score = (len(vs) / min(len(gained), left), [k for k, _ in vs], pos[nd])
            if best is None or score < best[0]:
                best = (score, vs, gained)
        if best is None:
            return None
        _, vs, gained = best
        for k, r in vs:
            mine[r.attempt_id] = (k, r)
            for x, gg in r.alloc:
                extra[x] += gg
        picked += [x for x in gained if fits(x)][:left]
    if not mine:
        return None  # it fits without victims: not a reclaim (the caller places it)
    picked = drop_unneeded(cap, pos, pool, g, n, {}, mine, picked)
    keys = sorted(k for k, _ in mine.values())
    return (len(mine), keys), pool, picked, {aid: r for aid, (_, r) in mine.items()}


def team_quota(spec: QuotaSpec | None) -> TeamQuota | None:
    """The policy's view of a team's configured quota (broker.spec.QuotaSpec)."""
    if spec is None:
        return None
    return TeamQuota(tuple(sorted(spec.nominal().items())), spec.borrowing_limit, spec.lending_limit)


class _Planner(Protocol):
    """What the pre-pass needs of broker.policy.plan's planner (its hooks)."""

    quota: QuotaBook | None
    cap: Capacity
    now: float
    cfg: PolicyConfig
    launching_for: set[int]

    @property
    def chosen(self) -> Collection[int]: ...
    def _candidates(self, j: PendingView, prank: int) -> tuple[list[PoolView], tuple[str, ...]]: ...
    def _try_place(self, j: PendingView, rank: int, cands: list[PoolView],
                   names: tuple[str, ...]) -> bool: ...
    def _commit_victims(self, j: PendingView, choice: Choice, defer_until: float | None = None) -> None: ...


def within_first(pl: _Planner, queue: PendingQueue, incoming: Collection[int]) -> set[int]:
    """Step 0 of a plan with quotas: the waiting jobs within their team's quota go first, as
    Kueue admits what fits without borrowing before what borrows. Per team with a quota, its
    jobs in (class, submit time, job id) order, as far as its nominal reaches: each is placed
    on free GPUs of the pools where it is within quota, else reclaims borrowed GPUs there
    (rule 4). Returns the ids dealt with (the walk skips them); the others, jobs with GPUs on
    their way (`incoming`), waiting for rented nodes or avoiding nodes among them, go
    through the walk as usual. Without it a job that reclaimed GPUs could see them taken,
    once its victims exit, by borrowing work earlier in the queue, and reclaim again."""
    book = pl.quota
    assert book is not None
    by_team: dict[str, list[PendingView]] = defaultdict(list)
    for (_, team, g, n), lst in queue.lists.items():
        room = book.room(team)
        if room >= g * n:
            by_team[team].extend(lst[:room // (g * n)])
    done: set[int] = set()
    for jobs in by_team.values():
        jobs.sort(key=lambda j: (-j.priority.rank, j.submit_time, j.job_id))
        for j in jobs:
            if j.job_id in incoming or j.job_id in pl.launching_for or j.failed_on:
                continue
            rank = j.priority.rank
            cands, _ = pl._candidates(j, rank)
            mine = [p for p in cands if book.is_within(j.team, book.key_of_pool[p.name], j.gpus)]
            if not mine:
                continue
            if pl._try_place(j, rank, mine, tuple(p.name for p in mine)):
                done.add(j.job_id)
                continue
            if not pl.cfg.preemption:
                continue
            got = book.reclaim(j, mine, pl.cap, pl.chosen, pl.now, pl.cfg.min_run_s, pl.cfg.victim_order)
            if got is not None:
                book.release(got[3].values())
                book.charge(j.team, got[1], j.gpus)
                pl._commit_victims(j, got)
                done.add(j.job_id)
    return done
