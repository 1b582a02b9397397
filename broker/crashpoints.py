"""Crash points: where the chaos suite (`make chaos`) kills the broker on purpose.

`crash_point("launch")` SIGKILLs this process, with the armed probability, when the
environment arms that point: ONEPOOL_CRASH_AT="launch:0.3,db_write:0.01". The points sit
exactly where a real crash hurts most (a launch in flight, a database write in flight, a
preemption's grace period, a checkpoint copy, a cloud launch whose answer is not written,
a notice recorded but not acknowledged). Unarmed (always, outside the chaos suite) a call
is one dictionary lookup. A leaf: imports nothing of the broker.
"""

from __future__ import annotations

import os
import random
import signal

ENV = "ONEPOOL_CRASH_AT"
POINTS = ("launch", "db_write", "preempt_grace", "checkpoint_copy", "cloud_launch", "notice")


def _armed() -> dict[str, float]:
    out: dict[str, float] = {}
    for item in os.environ.get(ENV, "").split(","):
        name, _, p = item.strip().partition(":")
        if name in POINTS:
            out[name] = float(p or 1.0)
    return out


ARMED = _armed()


def crash_point(name: str) -> None:
    """Die here (SIGKILL: no cleanup, like a power cut) if `name` is armed and the dice say so.
    One line on stderr says where."""
    p = ARMED.get(name)
    if p is not None and random.random() < p:
        os.write(2, f"onepool: crash point {name}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
