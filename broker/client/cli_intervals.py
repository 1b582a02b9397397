"""`onepool status JOB`'s calibration lines (issue 31): the checkpoint interval in force, the one
the broker advised at the job's last start (broker.policy.intervals) and the expected work spent
saving and lost to stops at each, per hour of running; and its deadline, with where the
deadline rule (broker.policy.deadlines) last said it may run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the CLI's HTTP fast path passes broker.wire_views.JobView: no pydantic)
    from broker.wire import JobInfo

WHERE = {"cheap": "on the cheapest capacity (it keeps pace)",
         "safe": "on capacity that will not be taken (on-prem or on demand)",
         "late": "on capacity that will not be taken, but it cannot finish in time"}


def calibration_lines(info: JobInfo) -> list[str]:
    """Every line status prints for issue 31."""
    return deadline_lines(info) + interval_lines(info)


def deadline_lines(info: JobInfo) -> list[str]:
    """Its deadline and where it runs for it (none without a deadline)."""
    if info.deadline is None:
        return []
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.deadline))
    where = WHERE.get(info.deadline_where or "", "not decided yet")
    return [f"deadline: {when}; runs {where}"]


def interval_lines(info: JobInfo) -> list[str]:
    """The lines to print (none before the job's first start)."""
    a = info.checkpoint_advice
    if a is None:
        return []
    mtbi = "none expected" if a.rate_per_h <= 0 else f"one per {1 / a.rate_per_h:.1f} h"
    mode = ("auto: the advised one" if info.checkpoint_auto
            else "fixed; `checkpoint_interval_s: auto` follows the advice")
    now_s = f"{info.checkpoint_interval_s:g} s"
    return [
        f"checkpoint interval: {now_s} ({mode}); advised {a.interval_s:.0f} s "
        f"from a save of {a.save_s:.1f} s and stops {mtbi} ({a.basis})",
        f"  expected per hour of running: at {now_s}, {a.current_saving_s_per_h:.0f} s "
        f"saving + {a.current_lost_s_per_h:.0f} s lost; at {a.interval_s:.0f} s, "
        f"{a.advised_saving_s_per_h:.0f} s saving + {a.advised_lost_s_per_h:.0f} s lost",
    ]
