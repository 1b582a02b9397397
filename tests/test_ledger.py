"""The cost ledger: node-seconds at the price in force, job shares, idle time, egress, queries."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from sqlmodel import select

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.spec import parse_config
from broker.state import costs, ledger
from broker.state.model import Attempt, AttemptState, Job, LedgerEntry
from tests.conftest import config

pytestmark = pytest.mark.both_dbs

AWS_POOLS = [
    {"name": "aws-od", "gpu_type": "A10G", "gpus_per_node": 1, "nodes": 0, "region": "us-east-1",
     "market": "on_demand", "price_per_node_hour": 1.006},
    {"name": "aws-spot", "gpu_type": "A100", "gpus_per_node": 8, "nodes": 0, "region": "us-east-1",
     "market": "spot", "price_per_node_hour": 9.8304},
    {"name": "local", "gpu_type": "L4", "gpus_per_node": 2, "nodes": 1},
]


def _client(tmp_path: Any, clock: FakeClock, pools: list[dict[str, Any]], **broker: Any) -> Client:
    c = Client(tmp_path / "home", clock=clock)
    broker.setdefault("server_url", "http://127.0.0.1:8421")  # where rented nodes' agents join
    c.apply(parse_config(config(pools=pools, **broker)))
    return c


def test_aws_ledger_total_equals_moto_instance_seconds_times_price(tmp_path, clock, monkeypatch):
    """A tiny rented-node lifecycle against moto's EC2: every instance is tagged with the broker's
    pool and its launch/terminate times on the fake clock; the ledger's total for the AWS pools
    equals the sum over the instances moto saw of (terminate - launch) x price, to the cent,
    including a spot price change mid-life."""
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    import boto3
    from moto import mock_aws

    c = _client(tmp_path, clock, AWS_POOLS)
    pools = {p["name"]: p for p in AWS_POOLS}
    itype = {"aws-od": "g5.xlarge", "aws-spot": "p4d.24xlarge"}
    spot_changes = [(400.0, 7.5), (1300.0, 11.25)]  # (seconds after the start, USD/node-hour)
    t0 = clock.now()
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")

        def launch(pool: str) -> str:
            market = {"InstanceMarketOptions": {"MarketType": "spot"}} if pool == "aws-spot" else {}
            iid = ec2.run_instances(ImageId="ami-12345678", InstanceType=itype[pool], MinCount=1,
                                    MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                        {"Key": "onepool:pool", "Value": pool},
                                        {"Key": "onepool:launched_at", "Value": repr(clock.now())}]}],
                                    **market)["Instances"][0]["InstanceId"]
            with c.store.session() as s:
                ledger.node_up(s, iid, pool, pools[pool]["gpus_per_node"], clock.now(), "research")
            return iid

        def terminate(iid: str) -> None:
            ec2.terminate_instances(InstanceIds=[iid])
            ec2.create_tags(Resources=[iid], Tags=[{"Key": "onepool:terminated_at",
                                                    "Value": repr(clock.now())}])
            with c.store.session() as s:
                ledger.node_down(s, iid, clock.now(), c.config())

        # (seconds after t0, action): cycles accrue between them at odd moments.
        script: list[tuple[float, str, str]] = [
            (0, "launch", "aws-od"), (17.5, "launch", "aws-spot"), (250, "launch", "aws-od"),
            (901.25, "terminate", "0"), (1800, "terminate", "1"), (3000.75, "terminate", "2")]
        ids: list[str] = []
        events = sorted([(t, "do", i) for i, (t, _, _) in enumerate(script)] +
                        [(t, "price", i) for i, (t, _) in enumerate(spot_changes)] +
                        [(float(t), "cycle", -1) for t in range(0, 3100, 37)])
        for at, kind, i in events:
            clock.advance(t0 + at - clock.now())
            with c.store.session() as s:
                if kind == "cycle":
                    ledger.accrue(s, clock.now(), c.config())
                elif kind == "price":
                    ledger.price_changed(s, "aws-spot", spot_changes[i][1], clock.now())
            if kind == "do":
                _, action, arg = script[i]
                if action == "launch":
                    ids.append(launch(arg))
                else:
                    terminate(ids[int(arg)])
        expected = 0.0
        seen = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["onepool:pool"]}])
        instances = [i for r in seen["Reservations"] for i in r["Instances"]]
        assert len(instances) == 3 and all(i["State"]["Name"] == "terminated" for i in instances)
        for inst in instances:
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            a, b, pool = float(tags["onepool:launched_at"]), float(tags["onepool:terminated_at"]), \
                tags["onepool:pool"]
            if pool == "aws-od":
                expected += (b - a) * pools[pool]["price_per_node_hour"] / 3600
            else:  # piecewise at the spot price in force
                cuts = [a] + [t0 + t for t, _ in spot_changes if a < t0 + t < b] + [b]
                prices = [pools[pool]["price_per_node_hour"]] + [p for _, p in spot_changes]
                for x, y in itertools.pairwise(cuts):
                    in_force = [p for (t, p) in zip([-1e18] + [t0 + t for t, _ in spot_changes], prices,
                                                    strict=True) if t <= x][-1]
                    expected += (y - x) * in_force / 3600
    with c.store.session() as s:
        total = costs.total_usd(s, pools=["aws-od", "aws-spot"])
        by_pool = {r.key: r for r in costs.costs(s, "pool")}
    assert round(total, 2) == round(expected, 2)
    assert total == pytest.approx(expected, abs=1e-6)
    assert by_pool["aws-od"].idle_usd == pytest.approx(by_pool["aws-od"].usd)  # no jobs: all idle
    assert "local" in by_pool  # on-prem nodes are metered too


def _attempt(s: Any, job: Job, node: str, slots: list[int], start: float, end: float | None,
             pool: str = "a100", lost_gpu_s: float = 0.0, egress_usd: float = 0.0) -> Attempt:
    a = Attempt(job_id=job.id, number=job.attempts + 1, pool=pool, alloc=[[node, slots]],
                priority=job.priority, started_at=start, ended_at=end, gpus=len(slots),
                state=AttemptState.ENDED if end is not None else AttemptState.RUNNING,
                end_reason="PREEMPTED" if lost_gpu_s else None, lost_gpu_s=lost_gpu_s,
                egress_usd=egress_usd)
    job.attempts += 1
    s.add(a)
    s.add(job)
    s.flush()
    return a


def _job(s: Any, name: str, team: str, experiment: str, t: float) -> Job:
    j = Job(name=name, team=team, experiment=experiment, command=["x"], submit_time=t, queued_at=t)
    s.add(j)
    s.flush()
    return j


POOL_2X = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "price_per_node_hour": 7.2}]


@pytest.mark.parametrize(("case", "pools", "broker", "expect"), [
    # one job holding 1 of 2 GPUs for 1000 s at $3.6/GPU-h; the other GPU idle
    ("price/gpus on-prem", POOL_2X, {}, {"job": 1.0, "idle_pool": 3.0, "team_idle": 0.0}),
    ("amortized on-prem", [{**POOL_2X[0], "amortized_usd_per_gpu_hour": 1.8}], {},
     {"job": 0.5, "idle_pool": 1.5, "team_idle": 0.0}),
    ("idle to launcher", [{**POOL_2X[0], "market": "on_demand"}], {"idle_charged_to": "launcher"},
     {"job": 1.0, "idle_pool": 3.0, "team_idle": 3.0}),
])
def test_job_share_and_idle_time(tmp_path, clock, case, pools, broker, expect):
    """Node a100-0 (2 GPUs) metered for 2000 s; a job holds 1 GPU for the first 1000 s, so
    1000 GPU-s are the job's and 3000 GPU-s idle (the pool's, or the launching team's)."""
    c = _client(tmp_path, clock, pools, **broker)
    t0 = clock.now()
    with c.store.session() as s:
        if broker.get("idle_charged_to") == "launcher":  # a rented node launched for research
            ledger.node_up(s, "a100-0", "a100", 2, t0, launched_for_team="research")
        ledger.accrue(s, t0, c.config())
        j = _job(s, "j", "prod", "exp", t0)
        _attempt(s, j, "a100-0", [0], t0, t0 + 1000)
        for dt in (250, 1000, 1500, 2000):
            ledger.accrue(s, t0 + dt, c.config())
        rows = {r.key: r for r in costs.costs(s, "job")}
        pool = costs.costs(s, "pool")[0]
        team = {r.key: r for r in costs.costs(s, "team")}
        n_rows = len(s.exec(select(LedgerEntry).where(LedgerEntry.kind == "gpu")).all())
    assert rows[str(j.id)].usd == pytest.approx(expect["job"])
    assert rows[str(j.id)].gpu_hours == pytest.approx(1000 / 3600)
    idle_key = "idle on-prem" if pools[0].get("market", "onprem") == "onprem" else "idle rented"
    assert rows[idle_key].usd == rows[idle_key].idle_usd == pytest.approx(expect["idle_pool"])
    assert pool.idle_usd == pytest.approx(expect["idle_pool"])
    assert pool.usd == pytest.approx(expect["job"] + expect["idle_pool"])
    assert team.get("research", costs.CostRow(key="", usd=0, gpu_hours=0, lost_gpu_hours=0, jobs=0)
                    ).usd == pytest.approx(expect["team_idle"])
    assert n_rows == 1, "a running share is one row, extended each cycle"


def test_costs_by_experiment_team_job_with_lost_work_egress_and_window(tmp_path, clock):
    c = _client(tmp_path, clock, POOL_2X)
    t0 = clock.now()
    with c.store.session() as s:
        ledger.accrue(s, t0, c.config())
        a = _job(s, "a", "research", "sweep", t0)
        b = _job(s, "b", "prod", "release", t0)
        _attempt(s, a, "a100-0", [0], t0, t0 + 600, lost_gpu_s=300)  # preempted: 300 GPU-s lost
        _attempt(s, a, "a100-0", [0, 1], t0 + 1200, t0 + 1800, egress_usd=0.25)
        _attempt(s, b, "a100-0", [1], t0 + 600, t0 + 1200)
        ledger.accrue(s, t0 + 1800, c.config())
        ledger.accrue(s, t0 + 1900, c.config())  # egress written once
        by_exp = {r.key: r for r in costs.costs(s, "experiment")}
        by_job = {r.key: r for r in costs.costs(s, "job")}
        late = {r.key: r for r in costs.costs(s, "experiment", since=t0 + 1500)}
    rate = 3.6 / 3600  # USD per GPU-second
    assert by_exp["sweep"].usd == pytest.approx(600 * rate + 1200 * rate + 0.25)
    assert by_exp["sweep"].lost_gpu_hours == pytest.approx(300 / 3600)
    assert by_exp["sweep"].lost_usd == pytest.approx(300 * rate)
    assert by_exp["release"].usd == pytest.approx(600 * rate) and by_exp["release"].jobs == 1
    assert by_job[str(a.id)].gpu_hours == pytest.approx(1800 / 3600)
    assert late["sweep"].usd == pytest.approx(600 * rate) and "release" not in late


def test_price_changed_rejects_negative_prices(tmp_path, clock):
    c = _client(tmp_path, clock, POOL_2X)
    with c.store.session() as s, pytest.raises(ValueError, match="cannot be negative"):
        ledger.price_changed(s, "a100", -1.0, clock.now())


def test_costs_rejects_unknown_grouping(tmp_path, clock):
    c = _client(tmp_path, clock, POOL_2X)
    with pytest.raises(ValueError, match="experiment, team, job, pool, market, day"):
        c.costs("region")  # type: ignore[arg-type]




MIDNIGHT = 86400.0 * 20718  # a UTC midnight: the day view must split rows across it
VIEW_POOLS = [
    {"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1,
     "amortize": {"purchase_usd_per_node": 150_000, "years": 4, "power_usd_per_gpu_hour": 0.1,
                  "hosting_usd_per_gpu_hour": 0.05}},
    {"name": "rent", "provider": "aws", "gpu_type": "A10G", "gpus_per_node": 4, "nodes": 0,
     "max_nodes": 2, "market": "spot", "region": "us-east-1", "zone": "us-east-1d",
     "instance_type": "g5.12xlarge"},  # priced by the catalog (dearest zone: no account mapping)
]


def _money_home(tmp_path: Any, idle_charged_to: str) -> tuple[Client, dict[str, int]]:
    """An hour on each side of a UTC midnight: on-prem time used and idle, a rented node that
    boots, runs a job, drains and ends, checkpoint egress, and a checkpoint kept in S3."""
    from broker.state.model import Checkpoint

    clock = FakeClock(MIDNIGHT - 3600)
    c = _client(tmp_path, clock, VIEW_POOLS, idle_charged_to=idle_charged_to)
    cfg = c.config()
    t0 = clock.now()
    with c.store.session() as s:
        ledger.accrue(s, t0, cfg)
        a = _job(s, "a", "research", "sweep", t0)
        b = _job(s, "b", "prod", "release", t0)
        _attempt(s, a, "a100-0", [0, 1], t0, t0 + 1800, lost_gpu_s=600)
        ledger.node_up(s, "rent-1", "rent", 4, t0 + 600, "prod", rented=True)
        ledger.node_ready(s, "rent-1", t0 + 900)
        _attempt(s, b, "rent-1", [0, 1], t0 + 1000, t0 + 5000, pool="rent", egress_usd=0.125)
        s.add(Checkpoint(job_id=b.id, step=4, uri="s3://bkt/x/step-4", observed_at=t0 + 2000,
                         bytes=3 << 30, store="s3://bkt", attempt_id=None))
        _attempt(s, a, "a100-0", [0], t0 + 2400, t0 + 6000)
        for dt in range(0, 7201, 450):
            if dt == 5400:  # an interruption notice came at 5100, after the job ended at 5000
                ledger.node_draining(s, "rent-1", t0 + 5100)
            if dt == 6300:  # the cloud confirmed the end
                ledger.node_down(s, "rent-1", t0 + 6300, cfg)
            ledger.accrue(s, t0 + dt, cfg)
    return c, {"a": a.id or 0, "b": b.id or 0, "t0": int(t0)}


@pytest.mark.parametrize("idle_charged_to", ["pool", "launcher"])
@pytest.mark.parametrize(("since", "until"), [(None, None), (-3000.0, None), (0.0, 1800.0),
                                              (-600.0, 600.0)], ids=["all", "since", "window", "midnight"])
def test_every_view_sums_to_the_same_total(tmp_path, idle_charged_to, since, until):
    """One total, many views: by experiment, team, job, pool, market and day, in any window."""
    c, ids = _money_home(tmp_path, idle_charged_to)
    lo = None if since is None else MIDNIGHT + since
    hi = None if until is None else MIDNIGHT + until
    views = {by: {r.key: r for r in c.costs(by, lo, hi)} for by in costs.COST_BY}  # type: ignore[arg-type]
    totals = {by: sum(r.usd for r in rows.values()) for by, rows in views.items()}
    assert totals["pool"] > 0
    for by, total in totals.items():
        assert total == pytest.approx(totals["pool"], abs=1e-9), by
    if since is None and until is None:
        exp, team, market, day = views["experiment"], views["team"], views["market"], views["day"]
        assert {"idle on-prem", "boot/drain"} <= set(exp) and "idle rented" in exp
        assert len(day) == 2 and costs.day_of(MIDNIGHT) in day and costs.day_of(MIDNIGHT - 1) in day
        assert {"onprem", "spot", "egress", "storage"} == set(market)
        assert market["egress"].usd == pytest.approx(0.125)
        assert market["storage"].usd > 0 and exp["release"].usd > market["egress"].usd
        unused_rented = exp["idle rented"].usd + exp["boot/drain"].usd
        if idle_charged_to == "launcher":  # the launching team pays its node's unused time
            assert "idle rented" not in team and "boot/drain" not in team
            assert team["prod"].usd == pytest.approx(exp["release"].usd + unused_rented)
        else:
            assert team["prod"].usd == pytest.approx(exp["release"].usd)
        assert views["job"][str(ids["a"])].usd == pytest.approx(exp["sweep"].usd)


def test_rented_node_phases_are_charged_as_boot_job_idle_drain(tmp_path):
    """The rented node, metered 600..6300: boot 600..900 (4 GPUs), the job's 2 GPUs 1000..5000,
    drain 5100..6300 (4 GPUs), everything else idle; at the catalog price of the pool's zone."""
    c, ids = _money_home(tmp_path, "pool")
    t0 = ids["t0"]
    with c.store.session() as s:
        rows = s.exec(select(LedgerEntry).where(LedgerEntry.pool == "rent",
                                                LedgerEntry.kind != "egress")).all()
    gpu_s = {k: sum(r.gpus * (r.end - r.start) for r in rows if r.kind == k) for k in
             ("boot", "gpu", "idle", "drain")}
    assert gpu_s == {"boot": 4 * 300, "gpu": 2 * 4000, "drain": 4 * 1200,
                     "idle": 4 * 5700 - 4 * 300 - 2 * 4000 - 4 * 1200}
    rate = 2.7324 / 4  # us-east-1d without the account's AZ mapping: the dearest zone's price
    assert sum(r.usd for r in rows) == pytest.approx(4 * 5700 * rate / 3600)
    assert min(r.start for r in rows) == t0 + 600 and max(r.end for r in rows) == t0 + 6300


def test_checkpoint_storage_is_charged_to_its_experiment_until_deleted(tmp_path, clock):
    from broker.state.model import Checkpoint

    c = _client(tmp_path, clock, POOL_2X)
    t0 = clock.now()
    with c.store.session() as s:
        j = _job(s, "j", "research", "sweep", t0)
        s3 = Checkpoint(job_id=j.id, step=1, uri="s3://b/p/1", observed_at=t0, bytes=1 << 30, store="s3://b")
        disk = Checkpoint(job_id=j.id, step=2, uri="file:///x/2", observed_at=t0, bytes=1 << 30,
                          store="file:///x")
        s.add(s3)
        s.add(disk)
        s.flush()
        ledger.accrue(s, t0 + 365 * 3600, c.config())
        s3.state, s3.deleted_at = "deleted", t0 + 730 * 3600
        s.add(s3)
        ledger.accrue(s, t0 + 1000 * 3600, c.config())
        rows = {r.checkpoint_id: r for r in s.exec(select(LedgerEntry).where(LedgerEntry.kind == "storage"))}
    assert rows[s3.id].usd == pytest.approx(0.023)  # 1 GiB x one 730-hour month of S3 Standard
    assert rows[s3.id].end == t0 + 730 * 3600  # not charged after its deletion
    assert rows[disk.id].usd == 0.0 and rows[disk.id].end == t0 + 1000 * 3600  # on-prem disk: free
    assert {r.experiment for r in rows.values()} == {"sweep"}
    assert {r.key: r.usd for r in c.costs("experiment")}["sweep"] == pytest.approx(0.023)


def test_a_rented_pool_nothing_prices_is_refused_not_free(tmp_path, clock):
    from broker.errors import NotConfigured, SpecError

    pools = [POOL_2X[0], {"name": "fake", "provider": "aws", "gpu_type": "A100", "gpus_per_node": 8,
                          "nodes": 0, "max_nodes": 1, "market": "spot", "region": "us-east-1",
                          "instance_type": "p9.fake"}]
    with pytest.raises(SpecError) as e:
        _client(tmp_path, clock, pools)
    assert "pools.1.price_per_node_hour" in str(e.value) and "p9.fake" in str(e.value)
    c = Client(tmp_path / "home", clock=clock)
    with pytest.raises(NotConfigured):  # nothing was written
        c.config()
    priced = [POOL_2X[0], {**pools[1], "price_per_node_hour": 30.0}]
    assert [p.name for p in _client(tmp_path, clock, priced).config().pools] == ["a100", "fake"]
