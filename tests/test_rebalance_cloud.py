"""Rebalancing rented capacity (moto in-process, instances booted from their user data, real
job processes): a spot job moves off a pool whose interruption rate spiked, onto an
on-demand node launched for it first (make before break)."""

from __future__ import annotations

from typing import Any

from broker.control.config_apply import applied_config
from broker.policy import plan
from broker.spec import parse_config
from tests.agents.harness import wait_for
from tests.conftest import drive, train
from tests.test_cloud_engine import ONPREM, fill_onprem, finish, nodes, spot_pool

# SQLite only: the database is not what these tests are about (see tests/conftest.py)


def on_demand_pool() -> dict[str, Any]:
    return spot_pool("od", price=8.0, market="on_demand", idle_timeout_s=0,
                     interruption_rate_per_h=0.0)


def set_rate(c: Any, pool: str, rate: float) -> None:
    """`onepool apply` of the same config with the pool's interruption rate changed."""
    with c.store.session() as s:
        data = applied_config(s).model_dump(mode="json", exclude_none=True)
    for p in data["pools"]:
        if p["name"] == pool:
            p["interruption_rate_per_h"] = rate
    c.apply(parse_config(data))


def test_a_spot_job_moves_off_a_pool_whose_interruption_rate_spiked(cloud_cluster, clock, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool(), on_demand_pool()], cloud_after_wait_s=0, min_run_s=0)
    hog = fill_onprem(c, eng)
    j = c.submit(name="sweep", team="research", command=train(3000, step_s=0.02, ckpt_every=20),
                 gpus_per_node=2, priority="low", expected_duration_s=10 * 3600).id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 0)  # running, and its runtime is up
    assert c.get(j).attempt_list[0].pool == "spot"
    assert eng.rebalancer.decide(clock.now()) == []  # at 0.01 reclaims/h spot stays cheapest
    set_rate(c, "spot", 30.0)  # a spike: a reclaim every two minutes
    eng.cycle()
    (m,) = eng.rebalancer.decide(clock.now())
    assert (m.from_pool, m.to_pool, m.reason, m.launch) == ("spot", "od", "interruption rate spike", 1)
    # The od node comes up (its agent joins) before the move's next step claims it: it is held
    # for the move, not given back as idle (od's idle timeout is 0) nor filled by other work.
    wait_for("the od node up", lambda: [n.state for n in nodes(c) if n.pool == "od"] == ["up"])
    with eng.store.session() as s:
        assert plan(eng.snapshot(s, clock.now())).terminations == ()
    drive(eng, lambda: len(c.get(j).attempt_list) == 2 and c.get(j).status == "RUNNING", timeout=60)
    first, second = c.get(j).attempt_list
    assert (first.pool, first.end_reason, second.pool) == ("spot", "REBALANCED", "od")
    assert second.restored_step is not None and second.restored_step == first.reached_step
    kinds = [e.kind for e in c.events(j)]
    after = kinds[kinds.index("rebalance_move"):]  # the od node is up before the checkpoint
    assert after.index("node_launching") < after.index("checkpoint_requested") \
        < after.index("rebalance_stopping") < after.index("rebalance_moved")
    c.cancel(j)
    drive(eng, lambda: c.get(j).status == "CANCELLED")
    finish(c, eng, hog)


def test_idle_rented_nodes_are_terminated_after_the_timeout_and_not_before(cloud_cluster, clock, aws_mock):
    c, eng = cloud_cluster(pools=[ONPREM, spot_pool(idle_timeout_s=600)], cloud_after_wait_s=0)
    hog = fill_onprem(c, eng)
    j = c.submit(name="short", team="research", command=train(3), gpus_per_node=2, priority="low").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    eng.cycle()  # the node is seen idle from now
    [node] = nodes(c)
    assert node.state == "up" and node.idle_since == clock.now()
    clock.advance(599)
    eng.cycle()
    assert nodes(c)[0].state == "up"  # one second short of the timeout: kept
    clock.advance(1)
    drive(eng, lambda: nodes(c)[0].state == "terminated")
    assert nodes(c)[0].end_reason == "idle"
    events = [e for e in c.events() if e.kind == "node_releasing"]
    assert [e.time - node.idle_since for e in events] == [600]
    finish(c, eng, hog)
