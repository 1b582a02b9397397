"""Table tests for bugs plan() had (issue 11): each row is the smallest snapshot that showed it."""

from __future__ import annotations

import dataclasses

import pytest

from broker.policy import PolicyConfig, PoolView, plan
from broker.spec import BrokerSettings, parse_config

from .builders import (
    NOW,
    held,
    job,
    placed,
    placed_pools,
    pool,
    preempted_for,
    running,
    snap,
    team,
    waiting,
)

# -- a gang preempted a job it did not need when a victim spans several nodes ------------------
# pool a: 3 nodes x 8. Job 11 (low) runs on a-0:8 and a-1:8 since 900; job 12 (low) on a-2:8
# since 990. High job 9 needs 2 nodes x 8. Job 12 is the cheaper victim on its own node, but
# preempting 11 alone frees two nodes: one victim, not two.
GANG_CASES = [
    pytest.param([running(1, 11, alloc={"a-0": 8, "a-1": 8}, started=900),
                  running(2, 12, alloc={"a-2": 8}, started=990)],
                 [(1, 9)], id="issue-case:one-victim-frees-both-nodes"),
    pytest.param([running(1, 11, alloc={"a-0": 8, "a-1": 8}, started=990),
                  running(2, 12, alloc={"a-2": 8}, started=900)],
                 [(1, 9)], id="spanning-victim-is-also-the-cheaper"),
    pytest.param([running(1, 11, alloc={"a-0": 8}, started=900),
                  running(2, 12, alloc={"a-1": 8}, started=990),
                  running(3, 13, alloc={"a-2": 8}, started=995)],
                 [(2, 9), (3, 9)], id="one-node-victims:the-two-cheapest"),
    pytest.param([running(1, 11, alloc={"a-0": 8, "a-1": 8}, started=900),
                  running(2, 12, alloc={"a-2": 4}, started=990),
                  running(3, 13, alloc={"a-2": 4}, started=995)],
                 [(1, 9)], id="spanning-victim-beats-two-small-ones"),
    pytest.param([running(1, 11, alloc={"a-0": 4, "a-1": 4}, started=900),
                  running(2, 12, alloc={"a-0": 4}, started=990),
                  running(3, 13, alloc={"a-2": 8}, started=500)],
                 [(1, 9), (2, 9)], id="spanning-victim-and-the-rest-of-one-node"),
]


@pytest.mark.parametrize(("run", "expect"), GANG_CASES)
def test_gang_preempts_only_the_victims_it_needs(run, expect):
    p = plan(snap([pool("a", nodes=3)], running=run,
                  pending=[job(9, prio="high", gpus=8, nodes=2)]))
    assert sorted(preempted_for(p)) == sorted(expect)
    assert waiting(p)[9].startswith("preempting")


# -- a team of fair-share weight 0 made plan() divide by zero ---------------------------------
# Weight 0 is best effort: its jobs come after every weighted team's (lighter usage first),
# whatever their usages are.
WEIGHT0_CASES = [
    pytest.param([team("be", weight=0.0, usage=0.0), team("w", weight=1.0, usage=1e9)],
                 ["w", "be"], id="best-effort-after-a-heavy-weighted-team"),
    pytest.param([team("be1", weight=0.0, usage=50.0), team("be2", weight=0.0, usage=10.0),
                  team("w", weight=2.0, usage=1e6)],
                 ["w", "be2", "be1"], id="best-effort-teams-by-usage"),
    pytest.param([team("w", weight=0.5, usage=0.0), team("be", weight=0.0, usage=0.0)],
                 ["w", "be"], id="no-usage-anywhere"),
]


@pytest.mark.parametrize(("teams", "order"), WEIGHT0_CASES)
def test_weight_zero_is_best_effort(teams, order):
    # one free GPU per job in queue order: the placement order is the queue order
    pending = [job(i + 1, team=t.name, submit=float(10 - i)) for i, t in enumerate(teams)]
    p = plan(snap([pool("a", nodes=1, gpus=len(teams))], pending=pending, teams=teams))
    names = {j.job_id: j.team for j in pending}
    assert [names[pl.job_id] for pl in p.placements] == order


def test_weight_zero_is_refused_in_the_config():
    bad = {"pools": [{"name": "a", "gpu_type": "A100", "gpus_per_node": 1, "nodes": 1}],
           "teams": [{"name": "t", "weight": 0}]}
    with pytest.raises(Exception, match=r"teams\.0\.weight: Input should be greater than 0"):
        parse_config(bad)


# -- the user's broker.grace_s never reached the preempt-or-buy rule --------------------------
@pytest.mark.parametrize(
    ("broker", "expect"),
    [
        pytest.param({}, {"grace_s": 60.0, "min_run_s": 300.0, "cloud_after_wait_s": 600.0},
                     id="defaults"),
        pytest.param({"grace_s": 240, "min_run_s": 30, "cloud_after_wait_s": 5,
                      "checkpoint_on_signal": 1.0, "reservations": 3,
                      "promote_after_s": 21600, "promote_gangs_only": False},
                     {"grace_s": 240.0, "min_run_s": 30.0, "cloud_after_wait_s": 5.0,
                      "checkpoint_on_signal": 1.0, "reservations": 3,
                      "promote_after_s": 21600.0, "promote_gangs_only": False},
                     id="every-knob-reaches-it"),
    ],
)
def test_policy_config_is_built_from_the_broker_settings(broker, expect):
    cfg = PolicyConfig.from_settings(BrokerSettings(**broker))
    assert {k: getattr(cfg, k) for k in expect} == expect


def test_the_engine_plans_with_the_configured_grace(make_cluster):
    _c, eng = make_cluster(grace_s=240)
    assert eng.policy.grace_s == 240.0
    assert eng.policy == PolicyConfig.from_settings(eng.settings)


def test_grace_changes_the_preempt_or_buy_choice():
    """A longer grace makes preempting cost more waiting: with 20 min of grace, renting wins."""
    spot = pool("s", market="spot", price=1.0, nodes=0)
    spot = spot.__class__(**{**{f: getattr(spot, f) for f in spot.__slots__}, "max_nodes": 2,
                             "launch_latency_s": 60.0})
    run = [running(1, 11, alloc={"a-0": 8}, started=990)]
    pend = [job(9, prio="urgent", gpus=8)]
    quick = plan(snap([pool("a", nodes=1), spot], running=run, pending=pend, grace_s=30.0))
    slow = plan(snap([pool("a", nodes=1), spot], running=run, pending=pend, grace_s=1200.0))
    assert preempted_for(quick) == [(1, 9)] and quick.launches == ()
    assert preempted_for(slow) == [] and [la.pool for la in slow.launches] == ["s"]
    assert held(quick) == {9: {}} and placed(slow) == {}


# -- a spot stock-out sent non-urgent work to on-demand at three times the price -----------------
def _rented(name: str, market: str, price: float, closed: bool = False, full: bool = False) -> PoolView:
    """A rented pool: closed (a stock-out), at its quota of 2 (`full`: two nodes, which the
    test keeps busy with urgent work), or with no nodes and room for 2."""
    p = pool(name, market=market, price=price, nodes=2 if full else 0)
    return dataclasses.replace(p, max_nodes=0 if closed else 2, closed=closed)


STOCKOUT_CASES = [
    pytest.param("low", [("s", "spot", 1.0, True), ("od", "on_demand", 3.0, False)], [],
                 id="low-waits-for-the-closed-spot-pool"),
    pytest.param("low", [("s", "spot", 1.0, True), ("s2", "spot", 2.0, False),
                         ("od", "on_demand", 3.0, False)], ["s2"], id="another-spot-pool-still-does"),
    pytest.param("urgent", [("s", "spot", 1.0, True), ("od", "on_demand", 3.0, False)], ["od"],
                 id="urgent-takes-on-demand-at-once"),
    pytest.param("low", [("s", "spot", 1.0, False), ("od", "on_demand", 3.0, False)], ["s"],
                 id="in-stock:spot"),
    pytest.param("normal", [("s", "spot", 1.0, False, True), ("od", "on_demand", 3.0, False)], [],
                 id="normal-waits-for-a-spot-quota-slot"),
    pytest.param("high", [("s", "spot", 1.0, False, True), ("od", "on_demand", 3.0, False)],
                 ["od"], id="high-takes-on-demand-when-spot-is-full"),
    pytest.param("normal", [("s", "spot", 1.0, False, True), ("s2", "spot", 2.0, False),
                            ("od", "on_demand", 3.0, False)], ["s2"],
                 id="full-spot-pool:another-spot-pool-does"),
]


@pytest.mark.parametrize(("prio", "pools", "expect"), STOCKOUT_CASES)
def test_work_below_high_waits_out_a_spot_stockout(prio, pools, expect):
    rented = [_rented(*p) for p in pools]
    run = [running(1, 11, prio="urgent", alloc={"a-0": 8})]  # nothing to preempt
    run += [running(2 + i, 12 + i, prio="urgent", alloc={nd.id: 8})
            for i, nd in enumerate(nd for p in rented for nd in p.nodes)]
    p = plan(snap([pool("a", nodes=1), *rented], running=run,
                  pending=[job(9, prio=prio, gpus=8)],
                  cloud_after_wait_s=0.0))
    assert [la.pool for la in p.launches] == expect


@pytest.mark.parametrize(("promote_after_s", "expect"), [
    pytest.param(None, [], id="normal-waits-for-a-spot-quota-slot"),
    # aged to high in the queue, it still rents as normal: aging grants no on-demand spending
    pytest.param(900.0, [], id="aged-normal-still-waits-for-a-spot-quota-slot"),
])
def test_aging_does_not_let_work_below_high_rent_on_demand(promote_after_s, expect):
    rented = [_rented("s", "spot", 1.0, False, True), _rented("od", "on_demand", 3.0)]
    run = [running(1, 11, prio="urgent", alloc={"a-0": 8})]
    run += [running(2 + i, 12 + i, prio="urgent", alloc={nd.id: 8})
            for i, nd in enumerate(nd for p in rented for nd in p.nodes)]
    p = plan(snap([pool("a", nodes=1), *rented], running=run,
                  pending=[job(9, prio="normal", gpus=8, submit=0)],
                  cloud_after_wait_s=0.0, promote_after_s=promote_after_s, promote_gangs_only=False))
    assert [la.pool for la in p.launches] == expect


# -- an attempt holding no GPUs yet (the live engine's, while it starts) broke the victim index --
def test_an_attempt_without_an_allocation_is_no_victim_and_breaks_nothing():
    run = [running(1, 11, alloc={}), running(2, 12, alloc={"a-0": 8})]
    p = plan(snap([pool("a", nodes=1)], running=run, pending=[job(9, prio="urgent", gpus=8)]))
    assert preempted_for(p) == [(2, 9)]


# -- work that may not rent on demand kept on-demand nodes rented for urgent work alive --------
# (on the shared trace: 1,079 on-demand node-hours against 254, most of them running normal work
# on nodes launched for urgent jobs, each placement restarting the idle timeout)
def _idle_od_node() -> PoolView:
    """A rented on-demand pool with one idle node (launched for work that has finished)."""
    return dataclasses.replace(pool("od", market="on_demand", price=3.0, nodes=1), max_nodes=2)


@pytest.mark.parametrize(("prio", "spot", "with_spot_pool", "expect"), [
    pytest.param("normal", "allowed", True, {}, id="normal-leaves-it-while-spot-could-take-it"),
    pytest.param("low", "allowed", True, {}, id="low-leaves-it"),
    pytest.param("high", "allowed", True, {9: "od"}, id="high-takes-it"),
    pytest.param("urgent", "never", True, {9: "od"}, id="urgent-takes-it"),
    pytest.param("normal", "never", True, {9: "od"}, id="normal-that-may-not-run-on-spot-takes-it"),
    pytest.param("normal", "allowed", False, {9: "od"}, id="normal-with-no-spot-pool-takes-it"),
])
def test_only_work_that_may_rent_on_demand_takes_an_idle_on_demand_node(prio, spot, with_spot_pool,
                                                                          expect):
    spot_pool = [_rented("s", "spot", 1.0)] if with_spot_pool else []
    run = [running(1, 11, prio="urgent", alloc={"a-0": 8})]  # on-prem full, nothing to preempt
    p = plan(snap([pool("a", nodes=1), _idle_od_node(), *spot_pool], running=run,
                  pending=[job(9, prio=prio, gpus=8, spot=spot, submit=NOW)],
                  cloud_after_wait_s=600.0))
    assert placed_pools(p) == expect
