"""Rebalancing in the live engine with real processes and an injected clock: a move is
"checkpoint now, wait for the commit, stop, place in B", its saving recorded as events."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import drive, train

# SQLite only, but for the tests marked both_dbs (transactions they depend on): see tests/conftest.py

# A local pool billed like on-demand capacity ($32 per node-hour: $16/GPU-h) and an on-prem
# pool of the same shape: plan() fills on-prem first, so a job lands on "od" only while
# on-prem is busy.
POOLS = [{"name": "od", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "market": "on_demand",
          "price_per_node_hour": 32.0},
         {"name": "prem", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}]


def kinds(c: Any, job: int) -> list[str]:
    return [e.kind for e in c.events(job)]


def on_demand_job_with_prem_freed(make_cluster, clock, expected_s: float):  # type: ignore[no-untyped-def]
    c, eng = make_cluster(pools=POOLS)
    blocker = c.submit(name="blocker", team="research", command=train(40), gpus_per_node=2).id  # 2 s
    drive(eng, lambda: c.get(blocker).status == "RUNNING")
    job = c.submit(name="long", team="research", command=train(600, step_s=0.02, ckpt_every=10_000),
                   gpus_per_node=2, expected_duration_s=expected_s).id
    drive(eng, lambda: c.get(job).status == "RUNNING" and c.get(job).attempt_list[0].pool == "od")
    drive(eng, lambda: c.get(blocker).status == "SUCCEEDED")  # on-prem frees up
    clock.advance(600)  # past min_run_s; the job has run 10 minutes
    return c, eng, job


@pytest.mark.both_dbs
def test_an_on_demand_job_moves_to_freed_onprem_at_its_next_checkpoint(make_cluster, clock):
    c, eng, job = on_demand_job_with_prem_freed(make_cluster, clock, expected_s=10 * 3600)
    (m,) = eng.rebalancer.decide(clock.now())
    assert (m.job_id, m.from_pool, m.to_pool, m.reason) == (job, "od", "prem", "on-demand to freed on-prem")
    assert m.saving_usd > m.cost_usd
    first = c.get(job).attempt_list[0]
    # no stop before the checkpoint asked for is committed
    drive(eng, lambda: "rebalance_stopping" in kinds(c, job))
    with c.store.session() as s:
        from broker.state.model import Attempt

        a = s.get(Attempt, first.id)
        assert a is not None and a.last_checkpoint_at is not None and a.reached_step is not None
        saved = a.reached_step
    drive(eng, lambda: len(c.get(job).attempt_list) == 2)
    info = c.get(job)
    assert [a.pool for a in info.attempt_list] == ["od", "prem"]
    assert info.attempt_list[0].end_reason == "REBALANCED"
    assert info.attempt_list[1].restored_step >= saved  # resumed from the move's checkpoint
    assert info.preemptions == 0
    ks = kinds(c, job)
    assert ks.index("rebalance_move") < ks.index("checkpoint_requested") < ks.index("rebalance_stopping") \
        < ks.index("rebalance_moved")
    clock.advance(3600)
    drive(eng, lambda: c.get(job).status == "SUCCEEDED", timeout=60)
    drive(eng, lambda: "rebalance_realized" in kinds(c, job))
    ev = next(e for e in c.events(job) if e.kind == "rebalance_realized")
    assert ev.data["expected_saving_usd"] == pytest.approx(m.saving_usd)
    # it ran about an hour on prem instead of od: ~$16/GPU-h x 2 GPUs saved, less the move
    assert 20.0 < ev.data["realized_saving_usd"] < 32.0


def test_it_stays_when_the_saving_does_not_exceed_the_cost(make_cluster, clock):
    c, eng, job = on_demand_job_with_prem_freed(make_cluster, clock, expected_s=600 + 30)
    assert eng.rebalancer.decide(clock.now()) == []  # 30 s left: the move costs more
    drive(eng, lambda: c.get(job).status == "RUNNING")
    assert "rebalance_move" not in kinds(c, job)
    assert [a.pool for a in c.get(job).attempt_list] == ["od"]


def test_a_gang_that_fits_only_after_two_small_jobs_move_starts_after_they_move(make_cluster, clock):
    pool = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 4}]
    c, eng = make_cluster(pools=pool, rebalance={"defrag_after_s": 300})
    # long and short 1-GPU jobs alternate, so each node gets one of each (best fit) ...
    ids = [c.submit(name=f"j{i}", team="research", gpus_per_node=1,
                    command=train(2000, step_s=0.02, ckpt_every=25) if i % 2 == 0 else train(2)).id
           for i in range(8)]
    longs, shorts = ids[0::2], ids[1::2]
    drive(eng, lambda: all(c.get(j).status == "SUCCEEDED" for j in shorts)
          and all((c.get(j).last_step or -1) >= 0 for j in longs))
    nodes = {c.get(j).attempt_list[0].alloc[0][0] for j in longs}
    assert len(nodes) == 4  # ... and the free GPUs are scattered: one per node
    gang = c.submit(name="gang", team="research", gpus_per_node=2, nodes=2, command=train(4)).id
    eng.cycle()
    assert c.get(gang).status == "PENDING"
    assert eng.rebalancer.decide(clock.now()) == []  # it has not waited defrag_after_s yet
    clock.advance(600)
    moves = eng.rebalancer.decide(clock.now())
    assert len(moves) == 2 and {m.reason for m in moves} == {f"defragment for gang job {gang}"}
    drive(eng, lambda: c.get(gang).status in ("RUNNING", "SUCCEEDED"), timeout=60)
    moved = [j for j in longs if len(c.get(j).attempt_list) == 2]
    assert sorted(moved) == sorted(m.job_id for m in moves)
    for j in moved:
        first, second = c.get(j).attempt_list
        assert first.end_reason == "REBALANCED" and second.restored_step == first.reached_step
        assert second.alloc[0][0] != first.alloc[0][0]
    gang_nodes = {node for node, _ in c.get(gang).attempt_list[0].alloc}
    assert gang_nodes == {c.get(j).attempt_list[0].alloc[0][0] for j in moved}
    for j in longs:
        c.cancel(j)
    drive(eng, lambda: all(c.get(j).status == "CANCELLED" for j in longs))


def test_rebalance_dry_run_lists_the_moves_and_changes_nothing(make_cluster, clock):
    import json

    from typer.testing import CliRunner

    from broker.client.cli import app
    from broker.control.rebalancer import dry_run

    c, eng, job = on_demand_job_with_prem_freed(make_cluster, clock, expected_s=None)
    # while the leader runs (it holds the lease), from the database alone
    [m] = [x.as_dict() for x in dry_run(c.store, clock)]
    assert {k: m[k] for k in ("job", "from_pool", "to_pool", "reason")} == {
        "job": job, "from_pool": "od", "to_pool": "prem", "reason": "on-demand to freed on-prem"}
    assert m["saving_usd"] > m["cost_usd"] > 0
    res = CliRunner().invoke(app, ["--home", str(c.store.home), "rebalance", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    [shown] = json.loads(res.stdout)
    assert set(shown) >= {"job", "from_pool", "to_pool", "saving_usd", "cost_usd", "reason"}
    assert (shown["job"], shown["to_pool"]) == (job, "prem")
    table = CliRunner().invoke(app, ["--home", str(c.store.home), "rebalance", "--dry-run"])
    assert "on-demand to freed on-prem" in " ".join(table.stdout.split())
    refused = CliRunner().invoke(app, ["--home", str(c.store.home), "rebalance"])
    assert refused.exit_code != 0 and "--dry-run" in str(refused.exception or refused.output)
    eng.cycle()
    assert "rebalance_move" not in kinds(c, job) and c.get(job).attempt_list[-1].pool == "od"
