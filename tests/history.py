"""A recorded history for `onepool replay`'s tests: Job and Attempt rows written through the
store as a FIFO broker on a pool of 1-GPU slots would have run them."""

from __future__ import annotations

from dataclasses import dataclass

from broker.client.sdk import Client
from broker.state.model import Attempt, Job, JobState


@dataclass(frozen=True)
class Rec:
    team: str
    submit: float  # seconds after the first submission
    duration: float
    priority: str = "normal"


def record(c: Client, jobs: list[Rec], gpus: int, t0: float) -> None:
    """Write `jobs` (1 GPU each) as a FIFO broker on `gpus` GPUs ran them: Job and Attempt
    rows through the store, with their waits, starts and ends."""
    free = [t0] * gpus
    with c.store.session() as s:
        for i, r in enumerate(sorted(jobs, key=lambda r: r.submit)):
            submit = t0 + r.submit
            k = min(range(gpus), key=lambda g: free[g])
            start = max(submit, free[k])
            end = free[k] = start + r.duration
            job = Job(name=f"j{i}", team=r.team, command=["true"], priority=r.priority,
                      state=JobState.SUCCEEDED, submit_time=submit, queued_at=start, end_time=end,
                      wait_s=start - submit, attempts=1)
            s.add(job)
            s.flush()
            s.add(Attempt(job_id=job.id or 0, number=1, pool="a100", alloc=[["a100-0", [k]]],
                          priority=r.priority, state="ENDED", started_at=start, ended_at=end,
                          end_reason="COMPLETED", exit_code=0, gpus=1))
        s.commit()


def workload() -> list[Rec]:
    """Two teams take turns submitting 10-minute jobs every 100 s: a queue builds up."""
    return [Rec("nlp" if i % 2 else "vision", 100.0 * i, 600.0) for i in range(16)]
