"""The simulator: hand-checked runs, determinism, visible policy changes, cloud, bad traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.sim.policies import resolve
from broker.sim.simulator import Simulator
from broker.sim.trace import read_trace
from tests.sim.builders import job_id, scenario, write_trace

H = 3600.0


def run(tmp_path: Path, rows, policy: str, **sc_over):  # type: ignore[no-untyped-def]
    sc = scenario(**sc_over)
    trace = read_trace(write_trace(tmp_path / "t.csv", rows))
    (pol,) = resolve([policy], sc, sc.policy)
    sim = Simulator(trace, sc, pol)
    result = sim.run()
    jobs = {j.trace.job_id: j for j in sim.jobs}
    return result, jobs


LOW, URGENT, NORMAL = job_id("low"), job_id("urgent"), job_id("normal")
THREE = [(LOW, 0, 7200, 8), (URGENT, 1000, 600, 8), (NORMAL, 1100, 600, 4)]


SAVES = ({LOW: 1200, URGENT: 30, NORMAL: 530}, {LOW: 8610, URGENT: 1630, NORMAL: 2230}, 1,
         (240 + 1440) / H)
KILLED = ({LOW: 1200, URGENT: 60, NORMAL: 560}, {LOW: 9640, URGENT: 1660, NORMAL: 2260}, 1,
          (1060 * 8 + 1440) / H)


@pytest.mark.parametrize(
    ("policy", "share", "expect"),
    [
        # t=1000 the urgent job preempts the low one. If it checkpoints on the signal
        # (checkpoint_on_signal share 1), it saves and exits at 1030 (save 30 s): lost =
        # drain 30x8 + restart 180x8. Urgent runs 1030-1630; normal 1630-2230; low resumes
        # 2230, +180 s overhead, 6200 s of work left: done at 8610.
        pytest.param("onepool-onprem", 1.0, SAVES, id="onepool-onprem:job-saves"),
        # A job that does not (share 0) is killed after the 60 s grace; its last checkpoint
        # was never (1060 s < 1800 s): all 1060 s x 8 lost, plus the restart overhead.
        pytest.param("onepool-onprem", 0.0, KILLED, id="onepool-onprem:job-does-not-save"),
        # Who saves is the workload's trait: the naive policy gets the same jobs.
        pytest.param("naive-preempt", 0.0, KILLED, id="naive-preempt:job-does-not-save"),
        pytest.param("naive-preempt", 1.0, SAVES, id="naive-preempt:job-saves"),
        # fifo: nobody is preempted; urgent waits for the low job to finish.
        pytest.param("fifo", 1.0, ({LOW: 0, URGENT: 6200, NORMAL: 6700},
                                   {LOW: 7200, URGENT: 7800, NORMAL: 8400}, 0, 0.0), id="fifo"),
    ],
)
def test_three_jobs_by_hand(tmp_path, policy, share, expect):
    waits, done, preemptions, lost_gpu_h = expect
    result, jobs = run(tmp_path, THREE, policy, checkpoint_on_signal=share)
    assert {k: j.wait for k, j in jobs.items()} == pytest.approx(waits)
    assert {k: j.done_at for k, j in jobs.items()} == pytest.approx(done)
    assert result["preemptions"] == preemptions
    assert result["lost_gpu_hours_preemption"] == pytest.approx(lost_gpu_h, abs=0.01)
    assert result["jobs_completed"] == 3
    assert result["gpu_hours_delivered"] == pytest.approx((7200 * 8 + 600 * 8 + 600 * 4) / H, abs=0.1)


CLOUD = [{"name": "spot", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8,
          "market": "spot", "price_per_node_hour": 8.0, "on_demand_price_per_node_hour": 24.0,
          "max_nodes": 2, "launch_latency_s": 120, "interruption_rate_per_h": 0.5,
          "idle_timeout_s": 600}]


def many(n: int) -> list[tuple[str, float, float, int]]:
    return [(f"job-{k}", k * 200.0, 3000.0 + 100 * k, 8) for k in range(n)]


def test_same_seed_same_result_and_another_seed_differs(tmp_path):
    a, _ = run(tmp_path, many(12), "onepool", cloud=CLOUD)
    b, _ = run(tmp_path, many(12), "onepool", cloud=CLOUD)
    c, _ = run(tmp_path, many(12), "onepool", cloud=CLOUD, seed=8)
    for r in (a, b, c):
        r.pop("wall_s", None)
    assert a == b
    assert a["interruptions"] > 0  # rate 0.5/h on a few node-hours: the draw is exercised
    assert a != c


def test_policy_change_is_visible_in_the_metrics(tmp_path):
    rows = [(job_id("low", i), i * 10.0, 5000.0, 8) for i in range(3)]
    rows += [(job_id("urgent", 0), 600.0, 600.0, 8)]
    fifo, _ = run(tmp_path, rows, "fifo")
    prio, _ = run(tmp_path, rows, "onepool-onprem")
    assert fifo["wait_s"]["urgent"]["p50"] > 10_000 > 100 > prio["wait_s"]["urgent"]["p50"]
    assert prio["preemptions"] == 1 and fifo["preemptions"] == 0


def test_cloud_rents_after_waiting_and_bills_node_hours(tmp_path):
    """Two 8-GPU low jobs on one 8-GPU node: the second waits 600 s (cloud_after_wait_s),
    rents a spot node (ready 120 s later), runs 3000 s, and the node is released after
    its 600 s idle timeout: billed (120 + 3000 + 600) s at $8/h."""
    rows = [(job_id("low", 0), 0, 10_000, 8), (job_id("low", 1), 0, 3000, 8)]
    cloud = [dict(CLOUD[0], interruption_rate_per_h=0.0)]
    result, jobs = run(tmp_path, rows, "onepool", cloud=cloud, cycle_s=1)
    second = jobs[job_id("low", 1)]
    assert second.first_start == pytest.approx(600 + 120)
    assert result["cloud_cost_usd"] == pytest.approx((120 + 3000 + 600) / H * 8.0, abs=0.01)
    assert result["cloud_cost_on_demand_usd"] == pytest.approx((120 + 3000 + 600) / H * 24.0,
                                                               abs=0.01)
    assert result["cloud_gpu_hours"] == pytest.approx(3000 * 8 / H, abs=0.1)
    (pool, billed), = result["cloud_by_pool"].items()
    assert pool == cloud[0]["name"]
    assert billed["node_hours"] == pytest.approx((120 + 3000 + 600) / H, abs=0.1)
    assert billed["cost_usd"] == result["cloud_cost_usd"]
    assert billed["on_demand_usd"] == result["cloud_cost_on_demand_usd"]
    fifo, _ = run(tmp_path, rows, "onepool-onprem", cloud=cloud)
    assert fifo["cloud_cost_usd"] == 0


def test_partitions_leave_gpus_idle_while_others_wait(tmp_path):
    sc = dict(onprem=[{"name": "op", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 2}],
              teams=[{"name": "a", "queues": ["q"], "weight": 1},
                     {"name": "b", "queues": ["other"], "weight": 1}], default_team="a")
    rows = [(job_id("low", i), 0, 3600, 8) for i in range(2)]
    part, _ = run(tmp_path, rows, "partitioned", **sc)
    pooled, _ = run(tmp_path, rows, "fifo", **sc)
    assert part["idle_while_waiting_gpu_hours"] == pytest.approx(8.0, abs=0.2)
    assert pooled["idle_while_waiting_gpu_hours"] == 0
    assert part["wait_s"]["all"]["p99"] > 3000 > pooled["wait_s"]["all"]["p99"]


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ("job_id,submit_time_s,duration_s,num_gpus,queue\na,0,10,1,q\nb,x,10,1,q\n",
         "line 3, field submit_time_s: must be a number"),
        ("job_id,submit_time_s,duration_s,num_gpus,queue\na,-5,10,1,q\n",
         "line 2, field submit_time_s: must be >= 0"),
        ("job_id,submit_time_s,duration_s,num_gpus,queue\na,0,10,0,q\n",
         "line 2, field num_gpus: must be >= 1"),
        ("job_id,submit_time_s,duration_s,num_gpus,queue\na,0,10,1.5,q\n",
         "line 2, field num_gpus: must be a whole number"),
        ("job_id,submit_time_s,duration_s,num_gpus,queue\n,0,10,1,q\n",
         "line 2, field job_id: must not be empty"),
        ("job_id,submit_time_s,num_gpus,queue\na,0,1,q\n", "missing column(s) duration_s"),
    ],
    ids=["not-a-number", "negative", "zero-gpus", "fractional-gpus", "empty-id", "missing-column"],
)
def test_malformed_trace_rows_fail_clearly(tmp_path, content, expect):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(SpecError) as e:
        read_trace(p)
    assert expect in str(e.value) and "bad.csv" in str(e.value)


def test_unknown_policy_and_override_are_refused():
    sc = scenario()
    with pytest.raises(SpecError, match="allowed: partitioned, fifo"):
        resolve(["best"], sc, {})
    with pytest.raises(SpecError, match=r"policy\.fifo\.nonsense"):
        resolve(["fifo"], sc, {"fifo": {"nonsense": 1}})


def test_fragments_no_waiting_job_can_use_are_not_idle_while_waiting(tmp_path):
    """One 8-GPU node: a 4-GPU job runs for an hour while an 8-GPU job waits. The 4 free GPUs
    are idle, but no waiting job could use them: they do not count."""
    rows = [(job_id("low", 0), 0, 3600, 4), (job_id("low", 1), 10, 600, 8)]
    result, jobs = run(tmp_path, rows, "fifo")
    assert jobs[job_id("low", 1)].wait == pytest.approx(3590, abs=31)
    assert result["idle_while_waiting_gpu_hours"] == 0


def test_unplaceable_jobs_are_counted_and_their_waits_censored(tmp_path):
    """A 16-GPU job on a one-node cluster can never start: it is reported, and its wait runs
    to the end of the replay instead of being dropped from the percentiles."""
    rows = [(job_id("low", 0), 0, 3600, 8), (job_id("low", 1), 100, 600, 16)]
    result, _jobs = run(tmp_path, rows, "fifo")
    assert result["jobs_unplaceable"] == 1
    assert result["jobs_completed"] == 1
    assert result["wait_s"]["low"]["p99"] == pytest.approx(3600 - 100, rel=0.05)


OUT_OF_STOCK = dict(CLOUD[0], interruption_rate_per_h=0.0, stockouts_per_day=86400.0,
                    stockout_mean_s=365 * 86400.0)  # a stock-out a second, lasting a year
IN_STOCK = dict(CLOUD[0], name="spot2", price_per_node_hour=12.0, interruption_rate_per_h=0.0)
ON_DEMAND = {"name": "od", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8,
             "market": "on_demand", "price_per_node_hour": 24.0, "max_nodes": 2,
             "launch_latency_s": 120, "idle_timeout_s": 600}


@pytest.mark.parametrize(
    ("cloud", "usd"),
    [
        # the cheapest spot pool refuses and closes (broker.policy.pools); the job rents the
        # other spot pool: (launch latency + run + idle timeout) x $12/h
        pytest.param([OUT_OF_STOCK, IN_STOCK, ON_DEMAND], (120 + 3000 + 600) / H * 12.0,
                     id="next-spot-offer"),
        # no other spot pool: a low job waits out the stock-out rather than pay on-demand; it
        # runs on-prem when the first job is done
        pytest.param([OUT_OF_STOCK, ON_DEMAND], 0.0, id="waits-rather-than-on-demand"),
    ],
)
def test_a_stocked_out_spot_pool_refuses_and_closes(tmp_path, cloud, usd):
    rows = [(job_id("low", 0), 0, 10_000, 8), (job_id("low", 1), 0, 3000, 8)]
    result, jobs = run(tmp_path, rows, "onepool", cloud=cloud, cycle_s=1)
    assert result["launches_refused"] >= 1
    assert result["jobs_completed"] == 2
    assert result["cloud_cost_usd"] == pytest.approx(usd, abs=0.5)
    if not usd:
        assert jobs[job_id("low", 1)].first_start == pytest.approx(10_000, abs=2)


def test_a_node_under_notice_takes_no_new_work():
    from broker.sim.state import SimNode, SimPool
    from broker.spec import Market

    p = SimPool("s", "A100", 8, Market.SPOT, True, max_nodes=1)
    node = SimNode("s-1", 8)
    p.add_node(node)
    assert p.fits(8, 1)
    p.drain(node, now=10.0)
    assert not p.fits(1, 1) and p.free_total == 0
    assert node.view is not None and node.view.gpus == node.view.used == 0


def test_scenario_knobs_reach_every_policy_like_onepool_yaml_reaches_the_engine():
    sc = scenario(grace_s=30, reservations=3, min_run_s=100, checkpoint_on_signal=0.25)
    for pol in resolve(["fifo", "onepool-onprem", "onepool"], sc):
        assert (pol.config.grace_s, pol.config.checkpoint_on_signal) == (30, 0.25)
    onprem = resolve(["onepool-onprem"], sc)[0].config
    assert (onprem.reservations, onprem.min_run_s) == (3, 100)
    with pytest.raises(SpecError, match="reservations"):
        resolve(["fifo"], sc, {"fifo": {"reservations": -1}})


def test_fifo_runs_at_its_strongest():
    sc = scenario()
    tries = resolve(["fifo"], sc, strongest=True)
    assert [(p.variant, p.config.reservations) for p in tries] == [
        ("no reservations", 0), ("easy", 1)]  # whatever the scenario's default
