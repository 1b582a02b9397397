"""The queue order (step 3 of the cycle), walked lazily over FIFO lists. Pure.

Order: effective class (urgent first); then the team's fair share, its decayed usage divided
by its weight, lighter first (a team of weight 0 is best effort: it comes after every
weighted team, lighter usage first); then submit time (a requeued job keeps its original
one); then job id. Without classes the order is submit time, then job id (FIFO).

Oldest gangs first (PolicyConfig.oldest_gangs_first, with aging on): within its class, a
multi-node job that has waited `promote_after_s` since submission comes before every team's
share, oldest first. Without backfill reservations a gang starts only when whole nodes are
free at once, and whoever comes before it then takes them piecemeal: behind lighter teams'
work, a heavier team's gang would wait for as long as that team stays heavier.

Effective class: aging first (a job that has waited `promote_after_s` since submission is
scheduled one class higher, never above high), then anti-capture (per team, high/urgent GPUs
beyond its allowance are scheduled as normal; pending jobs take what the team's running
high/urgent work left of it, in queue order).

Pending jobs sit in FIFO lists, one per (class, team, GPUs per node, nodes), each sorted by
(submit time, job id). A class's order is its lists merged by fair share: teams of equal
share interleave by submit time. So plan() touches only the jobs it reaches, and can drop a
whole list (a source) once no job of that shape can do anything in this cycle. plan() builds
the lists from a snapshot, or reads the ones a caller keeps across cycles (PendingQueue).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from operator import attrgetter, is_not

from broker.policy.config import PolicyConfig
from broker.policy.snapshot import PendingView, TeamView
from broker.spec import Priority

HIGH_RANK = 2
NORMAL_RANK = 1
# Aging lifts a job one class, up to normal: never into high or urgent, the classes a team's
# priority allowance limits (an aged job would spend the allowance, or outrank high work).
AGE_LIMIT = NORMAL_RANK
PRIORITY_RANKS = (2, 3)
Entry = PendingView  # lists hold the views, sorted by _TIME
ListKey = tuple[int, str, int, int]  # (class rank, team, GPUs per node, nodes)
ShareKey = tuple[int, float]
UNKILLABLE = -1
OLDEST: ShareKey = (-1, 0.0)  # the share group of the gangs that waited (walked first)


_RANK = {p: p.rank for p in Priority}
_TIME = attrgetter("submit_time", "job_id")
_SUBMIT = attrgetter("submit_time")
_ID = attrgetter("job_id")


def _sort(jobs: list[PendingView]) -> None:
    """Sort by (submit time, job id): two stable sorts on one number each, which compare
    faster than tuples."""
    jobs.sort(key=_ID)
    jobs.sort(key=_SUBMIT)
_ESTIMATE = attrgetter("expected_duration_s")
_KNOWN = partial(is_not, None)


def list_key(j: PendingView) -> ListKey:
    return (_RANK[j.priority], j.team, j.gpus_per_node, j.nodes)


class PendingQueue:
    """Pending jobs in FIFO lists by (class, team, GPUs per node, nodes), each sorted by
    (submit time, job id). add/remove cost O(log n) plus a list insert."""

    def __init__(self, jobs: Iterable[PendingView] = ()) -> None:
        by: defaultdict[tuple[Priority, str, int, int], list[Entry]] = defaultdict(list)
        for j in jobs:
            by[(j.priority, j.team, j.gpus_per_node, j.nodes)].append(j)
        rank = _RANK
        self.lists: dict[ListKey, list[Entry]] = {(rank[p], t, g, n): lst for (p, t, g, n), lst in by.items()}
        self._jobs: dict[int, PendingView] | None = None
        self._shortest: dict[ListKey, float] = {}
        for lst in by.values():
            _sort(lst)

    @property
    def jobs(self) -> dict[int, PendingView]:
        """Pending jobs by id (built on first use, then kept current by add/remove)."""
        if self._jobs is None:
            self._jobs = {j.job_id: j for lst in self.lists.values() for j in lst}
        return self._jobs

    def __len__(self) -> int:
        return len(self.jobs)

    def shortest(self, key: ListKey) -> float:
        """The shortest runtime estimate in the list (inf: none has one). Kept until the
        list changes."""
        got = self._shortest.get(key)
        if got is None:
            ests = map(_ESTIMATE, self.lists.get(key, ()))
            got = self._shortest[key] = min(filter(_KNOWN, ests), default=math.inf)
        return got

    def add(self, j: PendingView) -> None:
        k = list_key(j)
        insort(self.lists.setdefault(k, []), j, key=_TIME)
        self.jobs[j.job_id] = j
        self._shortest.pop(k, None)

    def remove(self, j: PendingView) -> None:
        """Remove the job (matched by submit time and id). Raises KeyError if absent (and
        then changes nothing)."""
        jobs = self.jobs  # built before the lists change: it is derived from them
        lst = self.lists.get(list_key(j))
        i = -1 if lst is None else bisect_left(lst, (j.submit_time, j.job_id), key=_TIME)
        if lst is None or i >= len(lst) or lst[i].job_id != j.job_id:
            raise KeyError(j.job_id)
        del lst[i]
        k = list_key(j)
        if not lst:
            del self.lists[k]
        del jobs[j.job_id]
        self._shortest.pop(k, None)


def share_key(t: TeamView | None, fair_share: bool) -> ShareKey:
    """The fair-share sort key of a team: (0, usage / weight), or (1, usage) for weight 0."""
    if not fair_share or t is None:
        return (0, 0.0)
    if t.weight > 0:
        return (0, t.usage / t.weight)
    return (1, t.usage)


class _Seg:
    """A run of one FIFO list scheduled at one effective class: entries[pos:end]. `alike`: its
    entries share a list key (class, team, GPUs per node, nodes); anti-capture's demoted runs
    do not."""

    __slots__ = ("alike", "end", "entries", "key", "pos", "rank")

    def __init__(self, entries: list[Entry], start: int, end: int, rank: int, key: ListKey | None,
                 alike: bool = True) -> None:
        self.entries, self.pos, self.end, self.rank, self.key = entries, start, end, rank, key
        self.alike = alike


class QueueWalk:
    """Yields (effective class, job, source) in queue order. `kill(source, reason)` drops the
    rest of a source (its jobs keep `reason`); `rest()` yields what was not walked, with the
    reason of its source (None: not reached), in runs. `demoted` lists the job ids anti-capture
    schedules as normal, in queue order, all of them (computed up front)."""

    def __init__(self, queue: PendingQueue, teams: Mapping[str, TeamView], cfg: PolicyConfig,
                 now: float, priority_used: dict[str, int]) -> None:
        self.segs: list[_Seg] = []
        self.reasons: dict[int, str] = {}
        self.dropped: list[tuple[int, int]] = []  # (source, where it was dropped)
        self.demoted: list[int] = []
        self.top: list[tuple[int, PendingView]] = []  # anti-capture's materialized classes
        self.top_pos = 0
        self.order: list[tuple[int, list[list[int]]]] = []  # (class, groups of source ids)
        lists = queue.lists
        # when the next waiting job is aged up, or its gang goes first
        self.next_promotion: float | None = None
        self.gang_cut = -math.inf
        if not cfg.classes:
            ids = [self._seg(lst, 0, len(lst), -1, k) for k, lst in lists.items()]
            self.order = [(-1, [ids])]
            return
        share = {t: share_key(teams.get(t), cfg.fair_share) for t in {k[1] for k in lists}}
        by_class: dict[int, dict[ShareKey, list[int]]] = defaultdict(lambda: defaultdict(list))
        age = cfg.promote_after_s
        cut = now - age if age is not None else -math.inf
        # submitted at or before this: a gang that goes first (see the module docstring)
        self.gang_cut = cut if age is not None and cfg.oldest_gangs_first else -math.inf
        for k, lst in lists.items():
            r, team, _g, n = k
            split = 0
            ages = age is not None and r < AGE_LIMIT and (not cfg.promote_gangs_only or n > 1)
            goes_first = n > 1 and self.gang_cut > -math.inf
            if (ages or goes_first) and age is not None:
                split = bisect_right(lst, (cut, math.inf), key=_TIME)
                if split < len(lst):
                    t = lst[split].submit_time + age
                    if self.next_promotion is None or t < self.next_promotion:
                        self.next_promotion = t
            if split:
                by_class[r + 1 if ages else r][OLDEST if goes_first else share[team]].append(
                    self._seg(lst, 0, split, r + 1 if ages else r, k))
            if split < len(lst):
                by_class[r][share[team]].append(self._seg(lst, split, len(lst), r, k))
        first = 1 if cfg.anti_capture else 3
        if cfg.anti_capture:
            self._anti_capture(by_class, share, teams, priority_used)
        for c in range(first, -1, -1):
            groups = by_class.get(c)
            if groups:
                self.order.append((c, [groups[s] for s in sorted(groups)]))

    def _seg(self, entries: list[Entry], start: int, end: int, rank: int, key: ListKey | None,
             alike: bool = True) -> int:
        self.segs.append(_Seg(entries, start, end, rank, key, alike))
        return len(self.segs) - 1

    def _anti_capture(self, by_class: dict[int, dict[ShareKey, list[int]]],
                      share: dict[str, ShareKey], teams: Mapping[str, TeamView],
                      used: dict[str, int]) -> None:
        demoted: dict[str, list[Entry]] = defaultdict(list)
        for c in (3, 2):
            groups = by_class.get(c, {})
            for s in sorted(groups):
                for sid in groups[s]:
                    self.segs[sid].key = None  # walked here, never dropped as a list
                for _c, j, _sid in self._merged(groups[s], c):
                    t = teams.get(j.team)
                    allowance = t.priority_allowance_gpus if t is not None else 1 << 30
                    if used[j.team] + j.gpus <= allowance:
                        used[j.team] += j.gpus
                        self.top.append((c, j))
                    else:
                        self.demoted.append(j.job_id)
                        demoted[j.team].append(j)
        cut = self.gang_cut
        for team, entries in demoted.items():
            _sort(entries)
            waited = [j for j in entries if j.nodes > 1 and j.submit_time <= cut]
            if waited:  # gangs that waited go first at normal too
                by_class[NORMAL_RANK][OLDEST].append(self._seg(waited, 0, len(waited),
                                                               NORMAL_RANK, None, False))
                entries = [j for j in entries if not (j.nodes > 1 and j.submit_time <= cut)]
            if entries:
                by_class[NORMAL_RANK][share[team]].append(self._seg(entries, 0, len(entries),
                                                                    NORMAL_RANK, None, False))

    def _merged(self, sids: list[int], c: int) -> Iterator[tuple[int, PendingView, int]]:
        """(class, job, source) of these sources in (submit, id) order, advancing their
        positions; a source dropped meanwhile stops yielding. The class is `c`, or the job's
        own when c < 0 (no classes); the source is UNKILLABLE for a source not kept as a list."""
        segs = self.segs
        if len(sids) == 1:
            sid = sids[0]
            sg = segs[sid]
            src = UNKILLABLE if sg.key is None else sid
            entries = sg.entries
            while sg.pos < sg.end:
                j = entries[sg.pos]
                sg.pos += 1
                yield (_RANK[j.priority] if c < 0 else c), j, src
            return
        heap = [(e.submit_time, e.job_id, sid)
                for sid in sids for sg in (segs[sid],) if sg.pos < sg.end for e in (sg.entries[sg.pos],)]
        heapq.heapify(heap)
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        while heap:
            sid = heap[0][2]
            sg = segs[sid]
            pos = sg.pos
            if pos >= sg.end:  # dropped meanwhile
                heappop(heap)
                continue
            entries = sg.entries
            j = entries[pos]
            pos += 1
            sg.pos = pos
            if pos < sg.end:
                nxt = entries[pos]
                heapreplace(heap, (nxt.submit_time, nxt.job_id, sid))
            else:
                heappop(heap)
            yield (_RANK[j.priority] if c < 0 else c), j, (UNKILLABLE if sg.key is None else sid)

    def __iter__(self) -> Iterator[tuple[int, PendingView, int]]:
        top = self.top
        while self.top_pos < len(top):
            r, j = top[self.top_pos]
            self.top_pos += 1
            yield r, j, UNKILLABLE
        for c, groups in self.order:
            for sids in groups:
                yield from self._merged(sids, c)

    def kill(self, sid: int, reason: str) -> None:
        """Drop the rest of source `sid`: its jobs wait with `reason`."""
        sg = self.segs[sid]
        self.reasons[sid] = reason
        self.dropped.append((sid, sg.pos))
        sg.pos = sg.end

    def key_of(self, sid: int) -> ListKey | None:
        return self.segs[sid].key

    def rest(self) -> Iterator[tuple[list[PendingView], str | None, bool]]:
        """The jobs not walked, in runs that share a reason: dropped sources' remainders
        (with their reason), then everything not reached (None), in no particular order; each
        run with whether its jobs share a list key (class, team, GPUs per node, nodes)."""
        for sid, pos in self.dropped:
            sg = self.segs[sid]
            yield sg.entries[pos:sg.end], self.reasons[sid], sg.alike
        yield [j for _r, j in self.top[self.top_pos:]], None, False
        for sg in self.segs:
            if sg.pos < sg.end:
                yield sg.entries[sg.pos:sg.end], None, sg.alike
