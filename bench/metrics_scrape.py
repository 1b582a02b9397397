"""What one scrape of GET /metrics costs the server: the database queries behind it
(broker.observe.metrics) and the text rendering, on a SQLite home seeded with `--ledger` ledger
rows and a tenth as many finished jobs, each with one preempted attempt.

    .venv/bin/python bench/metrics_scrape.py          # 200,000 rows -> bench/results/metrics_scrape.json
    .venv/bin/python bench/metrics_scrape.py --quick  # 10,000 rows (seconds)

Assumptions: a warm SQLite page cache (one discarded scrape first); SQLite on local disk; no
broker writing meanwhile; the machine is shared (its load average is recorded), so the
median of `--runs` scrapes is reported. 200,000 ledger rows is about a month of a lab with a
hundred nodes (rows merge while nothing changes; a job starting or ending opens new ones).
Measured (2 cores, shared by other work, load average 4.7 to 7.8): 200,000 rows: ~520 ms a
scrape before the covering index ix_ledger_spend, 94 to 214 ms after (min, median); 10,000
rows: 18 ms. What is left is mostly the team budgets' spend in their window, the query each
broker cycle runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from broker.client.sdk import Client  # noqa: E402
from broker.clock import FakeClock  # noqa: E402
from broker.observe.metrics import registry_for  # noqa: E402
from broker.spec import parse_config  # noqa: E402
from broker.state.model import Attempt, Job, LedgerEntry  # noqa: E402


def seed(home: Path, rows: int) -> Client:
    c = Client(home, clock=FakeClock())
    c.apply(parse_config({"pools": [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 4}],
                          "teams": [{"name": "research", "budget_usd": 1000.0}, {"name": "prod"}]}))
    teams = ("research", "prod")
    with c.store.session() as s:
        s.bulk_insert_mappings(LedgerEntry, [  # type: ignore[arg-type]
            {"kind": "gpu", "pool": "a100", "node": f"a100-{i % 4}", "team": teams[i % 2], "start": i,
             "end": i + 1, "usd": 0.01} for i in range(rows)])
        s.bulk_insert_mappings(Job, [  # type: ignore[arg-type]
            {"name": "j", "team": teams[i % 2], "state": "SUCCEEDED", "submit_time": 0, "queued_at": 0,
             "command": [], "env": {}, "gpu_types": []} for i in range(rows // 10)])
        s.commit()
        s.bulk_insert_mappings(Attempt, [  # type: ignore[arg-type]
            {"job_id": i + 1, "number": 1, "pool": "a100", "alloc": [], "priority": "low", "state": "ENDED",
             "started_at": 0, "end_reason": "PREEMPTED", "cause": "preempted_by=1", "preempted_by": 1,
             "lost_gpu_s": 5.0, "handles": []} for i in range(rows // 10)])
        s.commit()
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ledger", type=int, default=200_000, help="ledger rows to seed")
    ap.add_argument("--runs", type=int, default=7, help="scrapes to time")
    ap.add_argument("--quick", action="store_true", help="10,000 ledger rows")
    args = ap.parse_args()
    rows = 10_000 if args.quick else args.ledger
    with tempfile.TemporaryDirectory() as d:
        c = seed(Path(d) / "home", rows)
        reg = registry_for(c.store, c.clock)
        size = len(generate_latest(reg))  # warm-up, discarded
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            generate_latest(reg)
            times.append(time.perf_counter() - t0)
    out = {"ledger_rows": rows, "attempts": rows // 10, "runs": args.runs,
           "median_ms": round(statistics.median(times) * 1000, 1), "min_ms": round(min(times) * 1000, 1),
           "exposition_bytes": size, "load_average": os.getloadavg()}
    print(json.dumps(out))
    if not args.quick:
        (ROOT / "bench" / "results" / "metrics_scrape.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
