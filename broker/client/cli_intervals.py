"""`onepool status JOB`'s checkpoint interval lines (issue 31): the interval in force, the one the
broker advised at the job's last start (broker.policy.intervals), and the expected work spent
saving and lost to stops at each, per hour of running."""

from __future__ import annotations

from broker.wire import JobInfo


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
