"""The metrics read from the database (broker.observe.metrics.StateCollector): rows written with
real SQL by small builders, every value checked by hand, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.lease import Lease
from broker.observe.metrics import gpu_type_label, registry_for
from broker.spec import parse_config
from broker.state.model import Attempt, Job, LedgerEntry, Node
from broker.state.model_access import NodeAgent
from tests.conftest import config

pytestmark = pytest.mark.both_dbs
POOLS = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 2},
         {"name": "onprem", "provider": "agent", "gpu_type": "L4", "gpus_per_node": 2, "nodes": 2}]
TEAMS = [{"name": "research", "budget_usd": 10.0}, {"name": "prod"}]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def home(tmp_path: Path, clock: FakeClock) -> Iterator[Client]:
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(pools=POOLS, teams=TEAMS, node_lost_after_s=30)))
    yield c


def scrape(c: Client) -> Samples:
    text = generate_latest(registry_for(c.store, c.clock)).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(got: Samples, name: str, **labels: str) -> float | None:
    return got.get((name, frozenset(labels.items())))


def add(c: Client, *rows: Any) -> list[Any]:
    with c.store.session() as s:
        for r in rows:
            s.add(r)
            s.flush()
        s.commit()
        for r in rows:
            s.refresh(r)
        s.expunge_all()
    return list(rows)


def job(team: str = "research", priority: str = "normal", gpus: int = 1, nodes: int = 1,
        state: str = "PENDING", types: list[str] | None = None) -> Job:
    return Job(name="j", team=team, priority=priority, gpus_per_node=gpus, nodes=nodes, state=state,
               gpu_types=types or [], submit_time=0.0, queued_at=0.0)


def attempt(j: Job, pool: str = "a100", alloc: list[Any] | None = None, state: str = "ENDED",
            reason: str | None = None, cause: str | None = None, lost: float = 0.0,
            by: Job | None = None) -> Attempt:
    assert j.id is not None
    return Attempt(job_id=j.id, number=1, pool=pool, alloc=alloc or [], priority=j.priority,
                   state=state, started_at=0.0, end_reason=reason, cause=cause, lost_gpu_s=lost,
                   preempted_by=by.id if by else None)


def test_pending_jobs_and_gpus_by_class_team_and_gpu_type(home: Client):
    add(home, job(gpus=2), job(gpus=1, nodes=2), job(priority="high", types=["L4", "A100"]),
        job(team="prod", state="RUNNING"), job(state="SUCCEEDED", gpus=8))
    got = scrape(home)
    any_ = {"priority": "normal", "team": "research", "gpu_type": "any"}
    assert value(got, "onepool_jobs_pending", **any_) == 2
    assert value(got, "onepool_jobs_pending_gpus", **any_) == 4
    typed = {"priority": "high", "team": "research", "gpu_type": "A100|L4"}
    assert value(got, "onepool_jobs_pending", **typed) == 1
    assert value(got, "onepool_jobs_running", team="prod") == 1
    assert value(got, "onepool_jobs_running", team="research") == 0
    assert gpu_type_label([]) == "any"


@pytest.mark.parametrize(("node_state", "held", "expect"), [
    # a100-0 (4 GPUs) in a given state, 3 GPUs held by a live attempt; a100-1 stays up and free.
    ("up", 0, {"in_use": 3, "free": 1 + 4, "draining": 0, "unavailable": 0, "held_elsewhere": 0}),
    ("up", 2, {"in_use": 3, "free": 0 + 4, "draining": 0, "unavailable": 0, "held_elsewhere": 1}),
    ("draining", 0, {"in_use": 3, "free": 4, "draining": 1, "unavailable": 0, "held_elsewhere": 0}),
    ("lost", 0, {"in_use": 3, "free": 4, "draining": 0, "unavailable": 1, "held_elsewhere": 0}),
])
def test_gpus_by_pool_and_state(home: Client, node_state: str, held: int, expect: dict[str, int]):
    with home.store.session() as s:
        n = s.get(Node, "a100-0")
        assert n is not None
        n.state, n.held_elsewhere = node_state, held
        s.add(n)
        s.commit()
    [j] = add(home, job(gpus=3, state="RUNNING"))
    add(home, attempt(j, alloc=[["a100-0", [0, 1, 2]]], state="RUNNING"))
    got = scrape(home)
    for state, v in expect.items():
        labels = {"pool": "a100", "gpu_type": "A100", "market": "onprem", "state": state}
        assert value(got, "onepool_gpus", **labels) == v, state
    assert value(got, "onepool_attempts", pool="a100", state="RUNNING") == 1
    assert value(got, "onepool_nodes", pool="a100", state=node_state) == (2 if node_state == "up" else 1)
    assert value(got, "onepool_nodes", pool="onprem", state="waiting") == 2


def test_preemptions_interruptions_and_lost_work_by_cause_and_team(home: Client):
    victim, urgent, other = add(home, job(state="RUNNING"), job(team="prod", priority="urgent"),
                                job(team="prod"))
    add(home,
        attempt(victim, reason="PREEMPTED", cause=f"preempted_by={urgent.id}", lost=100.0, by=urgent),
        attempt(victim, reason="PREEMPTED", cause=f"preempted_by={urgent.id}", lost=20.0, by=urgent),
        attempt(victim, pool="onprem", reason="INTERRUPTED", cause="spot_interruption", lost=7.0),
        attempt(other, pool="onprem", reason="LOST", cause="node_failure", lost=5.0),
        attempt(other, reason="COMPLETED"),
        attempt(other, reason="FAILED", cause="failed", lost=3.0),
        attempt(other, state="RUNNING"))
    got = scrape(home)
    assert value(got, "onepool_preemptions_total", team="research", by_team="prod") == 2
    assert value(got, "onepool_interruptions_total", cause="spot_interruption", team="research",
                 pool="onprem") == 1
    assert value(got, "onepool_interruptions_total", cause="node_failure", team="prod", pool="onprem") == 1
    lost = "onepool_lost_gpu_seconds_total"
    assert value(got, lost, reason="preempted", cause="preempted", team="research", by_team="prod") == 120.0
    assert value(got, lost, reason="interrupted", cause="spot_interruption", team="research",
                 by_team="") == 7.0
    assert value(got, lost, reason="failed", cause="failed", team="prod", by_team="") == 3.0
    assert not [k for k in got if "job" in dict(k[1]) or str(urgent.id) in dict(k[1]).values()]


def test_spend_by_team_pool_market_and_kind_and_team_budgets(home: Client, clock: FakeClock):
    now = clock.now()
    entry = {"start": now - 10, "end": now, "node": "a100-0"}
    add(home, LedgerEntry(kind="gpu", pool="a100", team="research", usd=2.5, **entry),
        LedgerEntry(kind="gpu", pool="a100", team="research", usd=6.0, **entry),
        LedgerEntry(kind="idle", pool="a100", team=None, usd=1.0, **entry))
    got = scrape(home)
    spend = "onepool_spend_usd_total"
    assert value(got, spend, team="research", pool="a100", market="onprem", kind="gpu") == 8.5
    assert value(got, spend, team="", pool="a100", market="onprem", kind="idle") == 1.0
    assert value(got, "onepool_team_budget_usd", team="research", window="month") == 10.0
    assert value(got, "onepool_team_budget_spent_usd", team="research", window="month") == 8.5
    assert value(got, "onepool_team_budget_usd", team="prod", window="month") is None


def test_agents_connected_and_heartbeat_age(home: Client, clock: FakeClock):
    now = clock.now()
    add(home, NodeAgent(node="onprem-0", credential_id="a" * 12, seen_at=now - 4),
        NodeAgent(node="onprem-1", credential_id="b" * 12, seen_at=now - 40),
        NodeAgent(node="gone", credential_id="c" * 12, seen_at=now - 1))  # no live node
    got = scrape(home)
    assert value(got, "onepool_agents_connected") == 1  # onprem-1 is past node_lost_after_s
    assert value(got, "onepool_agent_heartbeat_age_seconds", node="onprem-0", pool="onprem") == 4
    assert value(got, "onepool_agent_heartbeat_age_seconds", node="onprem-1", pool="onprem") == 40
    assert not [k for k in got if dict(k[1]).get("node") == "gone"]


@pytest.mark.parametrize(("steps", "up", "held", "age"), [
    ([], 0, 0, None),
    (["acquire"], 0, 1, None),  # leads, no cycle yet
    (["acquire", "cycle"], 1, 1, 0.0),
    (["acquire", "cycle", "release"], 0, 0, 0.0),
])
def test_leader_lease_and_last_cycle(home: Client, clock: FakeClock, steps: list[str], up: int,
                                     held: int, age: float | None):
    lease = Lease(home.store, clock, 10.0)
    acts: dict[str, Callable[[], object]] = {"acquire": lease.try_acquire,
                                             "cycle": lambda: lease.renew(cycled=True),
                                             "release": lease.release}
    for step in steps:
        acts[step]()
    got = scrape(home)
    assert value(got, "onepool_broker_up") == up
    assert value(got, "onepool_lease_held") == held
    assert value(got, "onepool_last_cycle_age_seconds") == age
    leaders = [dict(k[1])["holder"] for k in got if k[0] == "onepool_leader"]
    assert leaders == ([lease.holder] if held else [])
    assert value(got, "onepool_lease_fencing") == (1 if steps else 0)
