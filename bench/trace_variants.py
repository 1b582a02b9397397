"""What the variant benchmarks of the shared trace have in common (bench/checkpoint_intervals.py,
bench/deadlines.py): the trace and scenario they replay, their command line (--quick, --limit,
--trace, --scenario, --workers), running each (variant, mode) replay in its own process, and
writing the result JSON to bench/results.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "ms_itp_2021.csv"
SCENARIO = HERE / "scenarios" / "itp.yaml"
OUT = HERE / "results"
QUICK_LIMIT = 8000
POLICY = "onepool"

J = TypeVar("J")
R = TypeVar("R")


def arguments() -> tuple[argparse.Namespace, int | None]:
    """The command line, and how many of the trace's jobs to replay (None: all)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--scenario", default=str(SCENARIO))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help=f"the first {QUICK_LIMIT:,} jobs")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    return a, QUICK_LIMIT if a.quick and a.limit is None else a.limit


def run_all(one: Callable[[J], R], jobs: Sequence[J], workers: int) -> list[R]:
    """`one(job)` for every job, `workers` processes at a time (a replay is CPU-bound)."""
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(one, jobs))


def write(name: str, limit: int | None, out: dict[str, Any]) -> Path:
    """bench/results/<name>.json (<name>_quick.json for a --quick run); its path."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / (f"{name}_quick.json" if limit == QUICK_LIMIT else f"{name}.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def pct(new: float, old: float) -> str:
    """The change from `old` to `new` in percent, signed ("n/a" from 0)."""
    return f"{(new - old) / old * 100:+.1f}%" if old else "n/a"
