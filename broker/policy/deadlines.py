"""Where a job with a deadline may run now: cheap capacity while it keeps pace, capacity that will
not be taken once it must (issue 31; SkyPilot's Uniform Progress, Wu et al., "Can't Be Late",
NSDI 2024). Pure: the caller passes what it knows; the live broker (broker.control.snapshots)
and the simulator apply the answer.

The rule, for a job submitted (or first started) at `start` with a deadline D, needing W seconds
of work of which it has done w at `now`, and paying `restart_s` to move:

1. Remaining work R = W - w: from its progress when it reports it (broker.runtime.progress:
   total and done steps, at its measured steps per second), else from its expected duration
   minus the work it has done; with neither, unknown.
2. Unknown R: SAFE (a deadline is a promise that cannot be checked without a measure).
3. Slack S = D - now - R. S < 0: LATE (even capacity that will not be taken cannot finish it in
   time; it runs there anyway, and says so).
4. S <= restart_s + margin_s: SAFE, the safety net: one more stop (a restart, and the work since
   its last checkpoint, `margin_s`) would make it late.
5. Uniform progress: the pace it must keep is a straight line from (start, 0) to (D, W). Ahead
   of the line (w >= W (now - start) / (D - start)): CHEAP. Behind: SAFE, until it is ahead by
   `restart_s` of work again when it already runs SAFE (hysteresis: a job is not moved back and
   forth across the line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Where(StrEnum):
    CHEAP = "cheap"  # the cheapest capacity it may use (spot, preemptible on-prem)
    SAFE = "safe"  # capacity that will not be taken (on demand, or a class nothing preempts)
    LATE = "late"  # cannot finish in time even there: SAFE, flagged


@dataclass(frozen=True, slots=True)
class DeadlineFacts:
    """What is known of one job with a deadline (times in seconds on the caller's clock).

    progress: (done steps, total steps, steps per second) when it reports them, else None;
    expected_s: its expected total duration (None: unknown); worked_s: seconds of work it has
    kept so far (used with expected_s when it reports no progress); on_safe: it runs, or was
    last told to run, on SAFE capacity."""

    now: float
    start: float
    deadline: float
    restart_s: float = 180.0
    margin_s: float = 0.0
    progress: tuple[int, int, float] | None = None
    expected_s: float | None = None
    worked_s: float = 0.0
    on_safe: bool = False

    def __post_init__(self) -> None:
        for name in ("now", "start", "deadline", "restart_s", "margin_s", "worked_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or (name in ("restart_s", "margin_s", "worked_s") and v < 0):
                raise ValueError(f"{name}: must be a finite number" + (" >= 0" if name != "now" else "")
                                 + f" (got {v!r})")
        if self.deadline <= self.start:
            raise ValueError(f"deadline: must be after start ({self.deadline!r} <= {self.start!r})")


@dataclass(frozen=True, slots=True)
class Decision:
    where: Where
    remaining_s: float | None  # seconds of work left (None: unknown)
    slack_s: float | None  # deadline - now - remaining (None: unknown)
    reason: str


def _work(f: DeadlineFacts) -> tuple[float, float] | None:
    """(done, total) seconds of work, or None when unknown."""
    if f.progress is not None:
        done, total, rate = f.progress
        if total > 0 and rate > 0 and done >= 0:
            return min(done, total) / rate, total / rate
    if f.expected_s is not None and f.expected_s > 0:
        return min(f.worked_s, f.expected_s), f.expected_s
    return None


def decide(f: DeadlineFacts) -> Decision:
    """Where the job should run now (module docstring)."""
    work = _work(f)
    if work is None:
        return Decision(Where.SAFE, None, None, "no progress reported and no expected duration: "
                        "it cannot be shown to keep pace")
    done, total = work
    remaining = total - done
    slack = f.deadline - f.now - remaining
    if slack < 0:
        return Decision(Where.LATE, remaining, slack, f"{remaining:.0f} s of work left, "
                        f"{max(0.0, f.deadline - f.now):.0f} s to the deadline")
    if slack <= f.restart_s + f.margin_s:
        return Decision(Where.SAFE, remaining, slack,
                        f"slack {slack:.0f} s: one more stop would make it late")
    pace = total * min(1.0, max(0.0, (f.now - f.start) / (f.deadline - f.start)))
    ahead = done - pace
    need = f.restart_s if f.on_safe else 0.0
    if ahead >= need:
        return Decision(Where.CHEAP, remaining, slack, f"ahead of its pace by {ahead:.0f} s of work")
    return Decision(Where.SAFE, remaining, slack, f"behind its pace by {-ahead:.0f} s of work"
                    if ahead < 0 else f"ahead by only {ahead:.0f} s of work since it moved to safe capacity")
