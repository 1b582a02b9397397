"""simulate(): several policies in worker processes give what one process gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.sim.run import simulate_loaded
from broker.sim.trace import read_trace
from tests.sim.builders import scenario, write_trace

TIMINGS = ("wall_s", "cpu_s")


def figures(r: dict[str, Any]) -> dict[str, Any]:
    return {k: {m: v for m, v in p.items() if m not in TIMINGS} for k, p in r["policies"].items()}


def test_forked_workers_replay_what_one_process_replays(tmp_path: Path) -> None:
    rows = [(f"job-{k}", k * 300.0, 2000.0 + 500 * (k % 4), (1, 2, 4, 8)[k % 4]) for k in range(40)]
    trace = read_trace(write_trace(tmp_path / "t.csv", rows))
    sc = scenario()
    seen: list[dict[str, float]] = []
    names = ["fifo", "naive-preempt", "onepool-onprem"]
    one = simulate_loaded(trace, sc, names, workers=1)
    two = simulate_loaded(trace, sc, names, workers=2, on_progress=seen.append)
    assert list(two["policies"]) == names
    assert figures(two) == figures(one)
    assert all(p["jobs_completed"] == 40 for p in two["policies"].values())
    # fifo ran in both configurations and reports the stronger, naming the other
    assert two["policies"]["fifo"]["config"] in ("no reservations", "easy")
    assert set(two["policies"]["fifo"]["alternatives"]) == {"no reservations", "easy"} - {
        two["policies"]["fifo"]["config"]}
    assert seen and set(seen[-1]) == {"fifo[no reservations]", "fifo[easy]", "naive-preempt",
                                      "onepool-onprem"}
