"""Small builders for simulator tests: a scenario dict, trace rows, and job ids of a class."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from broker.sim.scenario import Scenario, pick_band, unit_hash
from broker.spec import Priority

SEED = 7
CLASSES = {"urgent": 0.25, "high": 0.25, "normal": 0.25, "low": 0.25}


def scenario(**over: Any) -> Scenario:
    """One on-prem node of 8 GPUs, one team, classes a quarter each (see job_id)."""
    base: dict[str, Any] = {
        "name": "tiny", "seed": SEED,
        "onprem": [{"name": "op", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 1}],
        "teams": [{"name": "t", "queues": ["q"], "priority_allowance_gpus": 64}],
        "default_team": "t", "classes": CLASSES,
        "checkpoint_interval_s": 1800, "restart_overhead_s": 180, "grace_s": 60,
        "checkpoint_save_s": 30, "cycle_s": 30, "checkpoint_on_signal": 1.0,
    }
    base.update(over)
    return Scenario.model_validate(base)


def job_id(cls: str, n: int = 0, seed: int = SEED) -> str:
    """The n-th id 'job-K' whose hash puts it in class `cls` under CLASSES."""
    bands = [(Priority(c), f) for c, f in CLASSES.items()]
    found = 0
    for k in range(10_000):
        jid = f"job-{k}"
        if pick_band(unit_hash(seed, "class", jid), bands).value == cls:
            if found == n:
                return jid
            found += 1
    raise AssertionError("no id found")


def write_trace(path: Path, rows: list[tuple[str, float, float, int]], queue: str = "q") -> Path:
    """rows: (job_id, submit_s, duration_s, gpus)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time_s", "duration_s", "num_gpus", "gpu_type", "user",
                    "queue", "status"])
        for jid, sub, dur, g in rows:
            w.writerow([jid, sub, dur, g, "", "", queue, ""])
    return path
