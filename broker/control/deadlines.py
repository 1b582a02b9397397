"""Deadlines in the live broker (issue 31): the engine's hands for broker.policy.deadlines.

Every cycle, before the snapshot, `cycle()` decides for each pending or running job with a
deadline where it may run (cheap | safe | late) from what the broker measured, keeps it on the
job (`deadline_where`, shown by `onepool status`) and records a `deadline` event when it
changes. The snapshot then gives a job that must run safe the spot policy `never`, and one that
keeps pace `only` (unless its own is `never`): broker.control.snapshots.pending_view. A
running attempt on the wrong side is moved: one on a spot pool that must run safe, and one on
an on-demand pool that is ahead of its pace again (by a restart: the rule's hysteresis) is
asked to stop (SIGTERM: it checkpoints and exits, stop reason "rebalanced", the job requeues)
and the plan places it again. (A job that does not checkpoint on SIGTERM loses its work since
its last checkpoint in a move: the margin of the rule counts it.)

What the rule is given (broker.policy.deadlines.DeadlineFacts):
- start: its submission; deadline: the job's;
- progress: its newest step (its newest attempt's report, else the step it resumed from) with
  the total and steps per second of its newest attempt that measured them
  (broker.runtime.progress); expected_s: its expected_duration_s;
- worked_s: seconds of work it kept: each ended attempt's time from its first step to its last
  checkpoint, and the running one's from its first step to now;
- restart_s: the mean restart overhead its attempts measured (DEFAULT_RESTART_S before any);
- margin_s: a running attempt's work since its last checkpoint (lost by a stop);
- on_safe: the rule's previous answer was safe or late.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from broker.policy.deadlines import DeadlineFacts, Decision, Where, decide
from broker.spec import Market, SpotPolicy
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, Job, JobState

if TYPE_CHECKING:
    from broker.control.engine import Engine

log = logging.getLogger("onepool.deadlines")
DEFAULT_RESTART_S = 180.0
SAFE = (Where.SAFE.value, Where.LATE.value)


def facts(j: Job, attempts: list[Attempt], now: float) -> DeadlineFacts:
    """The rule's facts for `j` (module docstring); `attempts`: all of its attempts."""
    assert j.deadline is not None
    progress = None
    ordered = sorted(attempts, key=lambda a: a.number, reverse=True)
    rated = next((a for a in ordered if a.progress_total and a.progress_rate), None)
    if rated is not None and rated.progress_total and rated.progress_rate:
        newest = ordered[0]  # its own step, else the step it resumed from, else the rated one's
        step = next((v for v in (newest.progress_step, newest.restored_step, rated.progress_step)
                     if v is not None), 0)
        progress = (step, rated.progress_total, rated.progress_rate)
    worked, margin = 0.0, 0.0
    for a in attempts:
        first = a.first_step_at or a.started_at
        if a.state == AttemptState.ENDED:
            worked += max(0.0, (a.last_checkpoint_at or first) - first)
        else:
            worked += max(0.0, now - first)
            margin = max(0.0, now - (a.last_checkpoint_at or first))
    if j.deadline_where in SAFE:
        # On (or bound for) safe capacity, it goes back to cheap only if it could afford a stop
        # there, which may cost up to one checkpoint interval of work: not the little it risks
        # just after a move (waiting, or freshly restored), which would send it straight back
        # to cheap and then off again (thrash).
        margin = max(margin, j.checkpoint_interval_s)
    overheads = [a.restart_overhead_s for a in attempts if a.restart_overhead_s is not None]
    return DeadlineFacts(now=now, start=j.submit_time, deadline=max(j.deadline, j.submit_time + 1.0),
                         restart_s=sum(overheads) / len(overheads) if overheads else DEFAULT_RESTART_S,
                         margin_s=margin, progress=progress, expected_s=j.expected_duration_s,
                         worked_s=worked, on_safe=j.deadline_where in SAFE)


def decide_all(s: Session, now: float) -> list[tuple[Job, Decision]]:
    """Decide for every pending or running job with a deadline; keep the answer on the job and
    record a `deadline` event when it changed. Returns (job, decision) pairs."""
    jobs = s.exec(select(Job).where(col(Job.deadline).is_not(None),
                                    col(Job.state).in_([JobState.PENDING, JobState.RUNNING]))).all()
    if not jobs:
        return []
    ids = [j.id for j in jobs]
    by_job: dict[int, list[Attempt]] = {}
    for a in s.exec(select(Attempt).where(col(Attempt.job_id).in_(ids))).all():
        by_job.setdefault(a.job_id, []).append(a)
    out = []
    for j in jobs:
        d = decide(facts(j, by_job.get(j.id or 0, []), now))
        if j.deadline_where != d.where.value:
            record(s, now, "deadline", f"runs {d.where.value}: {d.reason}", job_id=j.id,
                   where=d.where.value, remaining_s=d.remaining_s, slack_s=d.slack_s)
            j.deadline_where = d.where.value
            s.add(j)
        out.append((j, d))
    return out


def cycle(engine: Engine, now: float) -> None:
    """Decide (decide_all), then move running attempts: off spot pools for jobs that must run
    safe, off on-demand pools for jobs ahead of their pace again whose spot policy allows spot."""
    with engine.store.session() as s:
        decided = decide_all(s, now)
        s.commit()
        market = {p.name: p.market for p in engine.config.pools}
        for j, d in decided:
            if j.state != JobState.RUNNING:
                continue
            leave = Market.ON_DEMAND if d.where is Where.CHEAP and j.spot != SpotPolicy.NEVER else (
                Market.SPOT if d.where is not Where.CHEAP else None)
            for a in s.exec(select(Attempt).where(Attempt.job_id == j.id,
                                                  Attempt.state == AttemptState.RUNNING)).all():
                if leave is not None and market.get(a.pool) is leave:
                    to = "spot" if leave is Market.ON_DEMAND else "capacity that will not be taken"
                    record(s, now, "deadline_move", f"attempt {a.number} leaves {leave.value} pool {a.pool} "
                           f"for {to}: {d.reason}", job_id=j.id, attempt_id=a.id, to=d.where.value)
                    engine._request_stop(s, a, now, "rebalanced")
