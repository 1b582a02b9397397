"""Waiting for jobs to stop, the same way for the embedded and the HTTP client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from broker.wire import JobInfo

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STOPPED = FINAL | {"BUDGET_EXHAUSTED"}  # what wait() returns on


def wait_stopped(get: Callable[[int], JobInfo], job_ids: Iterable[int], timeout: float,
                 poll_s: float) -> list[JobInfo]:
    """Poll `get` until every job has ended (or stopped as BUDGET_EXHAUSTED). Raises
    TimeoutError naming the ones still open. A wall-clock wait: the broker is elsewhere."""
    ids = list(job_ids)
    deadline = time.monotonic() + timeout
    while True:
        infos = [get(i) for i in ids]
        if all(i.status in STOPPED for i in infos):
            return infos
        if time.monotonic() > deadline:
            open_ = [f"{i.id} ({i.status})" for i in infos if i.status not in STOPPED]
            raise TimeoutError(f"jobs still not finished after {timeout:g}s: {', '.join(open_)}")
        time.sleep(poll_s)
