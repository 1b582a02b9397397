"""An attempt's restart phases (issue 26, part 4): how long each step between its placement and
its first progress report took, so a slow resume can be blamed on the right thing.

    fetch_code_s      the node fetched (or found cached) and copied its code snapshot
    pull_image_s      the node pulled its container image (filled by the image runner)
    setup_s           its setup commands ran, or were found done on the node (setup_cached)
    fetch_data_s      the node fetched (or found cached) and linked its data
    restore_copy_s    the broker copied its checkpoint from another store before the start
    first_progress_s  from the attempt's start to the first new step the broker saw (the
                      attempt's restart_overhead_s: includes the job's own restore)

Nodes report the first four (`pending` while the image is pulled or setup still runs); `clean`
keeps only these names with finite, bounded values, as a node's report is data. Standard library only: the
thin client shows them (`onepool status JOB`).
"""

from __future__ import annotations

import math
from typing import Any

NODE_PHASES = ("fetch_code_s", "pull_image_s", "setup_s", "fetch_data_s")
LABELS = {"fetch_code_s": "fetch code", "pull_image_s": "pull image", "setup_s": "setup",
          "fetch_data_s": "fetch data", "restore_copy_s": "restore checkpoint (copy)",
          "first_progress_s": "first progress"}
FLAGS = ("setup_cached", "pending")
MAX_S = 7 * 86400.0


def clean(raw: Any) -> dict[str, float | bool]:
    """The phases of a node's report: known names only, seconds finite in [0, a week], flags
    booleans; anything else dropped."""
    out: dict[str, float | bool] = {}
    if not isinstance(raw, dict):
        return out
    for k in NODE_PHASES:
        v = raw.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_S:
            out[k] = round(float(v), 3)
    for k in FLAGS:
        if isinstance(raw.get(k), bool):
            out[k] = raw[k]
    return out


def describe(phases: dict[str, Any], first_progress_s: float | None = None) -> str:
    """One line: `fetch code 0.12 s, setup 3.40 s (cached), ...` in the order of the restart."""
    got = {**phases, **({"first_progress_s": first_progress_s} if first_progress_s is not None else {})}
    parts = []
    for k, label in LABELS.items():
        if isinstance(got.get(k), int | float):
            note = " (cached)" if k == "setup_s" and got.get("setup_cached") else ""
            parts.append(f"{label} {got[k]:.2f} s{note}")
    if got.get("pending"):
        parts.append("image or setup still in progress")
    return ", ".join(parts)
