"""`onepool demo --json` end to end: the README's first command, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(300)  # the first test here may run the demo (the session's demo_run)


def test_demo_json(tmp_path: Path, demo_run: dict[str, Any]) -> None:
    jobs = {j["name"]: j for j in demo_run["jobs"]}
    assert set(jobs) == {"sweep-0", "sweep-1", "sweep-2", "sweep-3", "sweep-4", "hotfix-eval"}
    fields = {"name", "priority", "status", "attempts", "preemptions", "wait_s", "lost_gpu_s",
              "pool", "market", "attempt_list",
              "resumed_from_step", "checkpoint_stores", "egress_bytes", "egress_usd"}
    assert all(fields <= set(j) for j in jobs.values())
    assert all(j["status"] == "SUCCEEDED" for j in jobs.values())
    victims = [j for j in jobs.values() if j["preemptions"]]
    assert len(victims) == 2 and all(j["priority"] == "low" for j in victims)
    assert all(j["attempts"] == 2 and j["resumed_from_step"] is not None for j in victims)
    assert jobs["hotfix-eval"]["attempts"] == 1 and jobs["hotfix-eval"]["preemptions"] == 0
    # The victims' checkpoints lived in the (simulated) S3 bucket of the A100 pool, and they
    # resumed in another store, paying AWS egress for the copy.
    assert any(len(j["checkpoint_stores"]) >= 2 for j in victims)
    for j in victims:
        assert j["checkpoint_stores"][0].startswith("s3://")
        if len(j["checkpoint_stores"]) >= 2:
            assert j["egress_bytes"] > 1 << 20 and j["egress_usd"] > 0
    assert jobs["hotfix-eval"]["checkpoint_stores"] == ["s3://onepool-demo/checkpoints"]
    assert demo_run["simulated_s3"]["endpoint"].startswith("http://127.0.0.1:")
    # At least one low-priority job ended on (simulated) AWS spot; no instance is left running.
    assert any(j["market"] == "spot" and j["pool"] == "aws-spot" for j in jobs.values())
    assert jobs["hotfix-eval"]["market"] == "onprem"
    assert demo_run["simulated_ec2"]["endpoint"].startswith("http://127.0.0.1:")
    assert demo_run["instances_left_running"] == 0
    # Two on-prem hosts run agents; the spot instance's agent started from its user data.
    agents = demo_run["agents"]
    assert {a["node"] for a in agents if not a["booted_from_user_data"]} == {"a100-0", "a100-1"}
    booted = [a for a in agents if a["booted_from_user_data"]]
    assert booted and all(a["pool"] == "aws-spot" and a["market"] == "spot" for a in booted)
    assert len({a["pid"] for a in agents}) == len(agents)  # separate processes
    pids = {a["node"]: a["pid"] for a in agents}
    for j in victims:  # preempted on an agent's node, resumed elsewhere
        first, last = j["attempt_list"][0], j["attempt_list"][-1]
        assert first["node"].startswith("a100-") and first["agent_pid"] == pids[first["node"]]
        assert first["end_reason"] == "PREEMPTED" and last["end_reason"] == "COMPLETED"
    assert any(j["attempt_list"][-1]["node"] in {a["node"] for a in booted} for j in victims)
    assert "job None" not in demo_run["stderr"]  # node events name their node
    # The jobs shipped their code: every agent's node fetched the snapshot once, then hit its cache.
    assert demo_run["code"].startswith("sha256:")
    caches = [*Path(demo_run["home"]).glob("hosts/*/code-cache"),
              *Path(demo_run["home"]).glob("instances/*/agent/code-cache")]
    assert len(caches) >= 3
    for cache in caches:
        assert json.loads((cache / "stats.json").read_text())["fetches"] == 1
        assert (cache / demo_run["code"].removeprefix("sha256:") / "train_numpy.py").is_file()
    # The demo refuses to wipe a home that holds other work.
    other = tmp_path / "other"
    other.mkdir()
    (other / "onepool.db").write_bytes(b"")
    bad = subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", str(other), "demo"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not the demo's" in bad.stderr


VIEWS = ["experiment", "team", "job", "pool", "market", "day"]


def _cost(home: str, by: str) -> list[dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "broker.client.cli", "--home", home, "cost", "--by", by,
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def demo_costs(demo_run: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    return {by: {r["key"]: r for r in _cost(demo_run["home"], by)} for by in VIEWS}


def test_the_demo_rented_pool_costs_money(demo_costs: dict[str, dict[str, dict[str, Any]]]) -> None:
    """The simulated AWS spot node is on the meter from its launch request to its termination at
    the catalog price: its jobs' GPU time and its unused time both cost money."""
    spot = demo_costs["pool"]["aws-spot"]
    assert spot["usd"] > 0 and spot["gpu_hours"] > 0 and spot["idle_usd"] > 0
    assert demo_costs["market"]["spot"]["usd"] > 0
    assert {"idle on-prem", "idle rented", "boot/drain"} <= set(demo_costs["experiment"])


@pytest.mark.parametrize("by", VIEWS)
def test_every_demo_view_totals_the_pool_view_to_the_cent(
        by: str, demo_costs: dict[str, dict[str, dict[str, Any]]]) -> None:
    total = sum(r["usd"] for r in demo_costs["pool"].values())
    assert total > 0
    assert round(sum(r["usd"] for r in demo_costs[by].values()), 2) == round(total, 2)
    assert sum(r["usd"] for r in demo_costs[by].values()) == pytest.approx(total, abs=1e-4)
