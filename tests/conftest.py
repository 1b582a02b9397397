"""Shared builders: a broker home with a config, the example training command, and a driver
that cycles an engine until a condition holds (woken by process exits, bounded in time)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.engine import Engine
from broker.spec import parse_config
from providers.local import LocalProcesses

os.environ.setdefault("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # fast EC2 mocks; AMI ids are made up
os.environ.setdefault("ONEPOOL_PROVIDER_RETRY_MAX_S", "0.05")  # retries back off briefly in tests
# Jobs get a clean environment (providers.isolation): these host variables reach them (this
# checkout's code, the object-store emulators of tests/cloud_stores.py). Run as root, the
# suite's jobs stay root (they use files in pytest's private tmp folders); tests/
# test_isolation.py runs ranks as other users.
os.environ.setdefault("ONEPOOL_PASS_ENV", ",".join((
    "PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3",
    "STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "NO_GCE_CHECK")))
if os.geteuid() == 0:
    os.environ.setdefault("ONEPOOL_RUN_AS", "root")
HOST_SETTINGS = ("ONEPOOL_RUN_AS", "ONEPOOL_PASS_ENV")  # kept by tests that clear ONEPOOL_*

# S3 / GCS on 127.0.0.1 (s3_bucket, gcs_bucket, backend, ...); the Compute REST fake (gcp_fake)
pytest_plugins = ["tests.cloud_stores", "tests.providers.gcp_fake"]

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_numpy.py"


def config(pools: list[dict[str, Any]] | None = None, teams: list[dict[str, Any]] | None = None,
           **broker: Any) -> dict[str, Any]:
    """A valid config dict: by default one local pool of 1 node x 2 'A100' and two teams."""
    return {
        "pools": pools or [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}],
        "teams": teams or [{"name": "research"}, {"name": "prod", "priority_allowance_gpus": 8}],
        "broker": {"cycle_s": 0.2, "grace_s": 30, "min_run_s": 0, **broker},
    }


def train(steps: int = 20, step_s: float = 0.05, ckpt_every: int = 2,
          done_file: Path | None = None, state_kb: int = 0) -> list[str]:
    cmd = [sys.executable, str(TRAIN), "--steps", str(steps), "--step-s", str(step_s),
           "--ckpt-every", str(ckpt_every), "--state-kb", str(state_kb)]
    return cmd + (["--done-file", str(done_file)] if done_file else [])


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`: two workers, --dist loadgroup) every test of the one
    shared Slurm test cluster (tests/slurm) runs on one worker, one at a time; so do all the
    tests that use the session's demo run (`demo_run`: made once per worker, so once), and the
    tests of a module with a module-scoped fixture (made once). Every other test goes to
    whichever worker is free."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if module.startswith("tests/slurm/"):
            group = "slurm"
        elif "demo_run" in getattr(item, "fixturenames", ()):
            group = "demo"
        elif any(d.scope == "module" for ds in defs.values() for d in ds):
            group = module
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _no_home_in_the_checkout() -> Iterator[None]:
    """No test may leave a broker home (./.onepool, the default) in the checkout: `make demo`
    after `make test` would find a home that is not the demo's."""
    stray = ROOT / ".onepool"
    before = stray.exists()
    yield
    if not before and stray.exists():
        import shutil

        shutil.rmtree(stray, ignore_errors=True)
        pytest.fail(f"this test created {stray}: give every Client, CLI call and process a home")


# -- the database: SQLite, and PostgreSQL for modules marked `both_dbs` ------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_dbs` (a module's `pytestmark` or one test's decorator) run twice: on
    SQLite (the broker home's file) and on a fresh database of a real PostgreSQL server.
    Whole modules where the database is the subject (store, lease, ledger, budgets, crash and
    containment, retention, telemetry, scheduled tasks, price refresh, engine e2e); in the
    process-, CLI- and cloud-level modules only the tests whose outcome rests on transactions
    (exactly once across a crash or a notice, a cancel racing the broker, health), so the
    suite stays within its time on two cores."""
    if metafunc.definition.get_closest_marker("both_dbs") is not None:
        metafunc.parametrize("db", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster for this test session (tests/postgres.py)."""
    from tests.postgres import PgServer

    srv = PgServer.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database brought to the newest migration by Alembic, once per test process."""
    from broker.state.store import make_engine, upgrade

    path = tmp_path_factory.mktemp("template") / "onepool.db"
    eng = make_engine(f"sqlite:///{path}")
    upgrade(eng)
    eng.dispose()
    return path


def _from_template(template: Path, real_upgrade: Callable[[Any], None]) -> Callable[[Any], None]:
    """upgrade() for this process's tests: an empty SQLite database (a new broker home) gets
    a copy of the migrated template (SQLite's backup API, page for page), which is what
    Alembic would build (the template is Alembic's own result); any other database, and every
    subprocess, goes through Alembic itself."""
    import sqlite3

    from sqlalchemy import inspect

    def upgrade(engine: Any) -> None:
        if engine.url.get_backend_name() == "sqlite" and not inspect(engine).get_table_names():
            raw = engine.raw_connection()
            try:
                with sqlite3.connect(template) as src:
                    src.backup(raw.driver_connection)
            finally:
                raw.close()
        real_upgrade(engine)

    return upgrade


@pytest.fixture(autouse=True)
def db(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The backend of this test: "sqlite" (default) or "postgresql", where
    ONEPOOL_DATABASE_URL names a fresh migrated database (inherited by subprocesses). A new
    SQLite home opened in this process starts from a migrated template (migrating every home
    from scratch was a fifth of the suite's in-process time); PostgreSQL does the same with
    CREATE DATABASE ... TEMPLATE (tests/postgres.py)."""
    import broker.state.store

    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        monkeypatch.delenv("ONEPOOL_DATABASE_URL", raising=False)
        if request.node.get_closest_marker("real_migrations") is None:
            monkeypatch.setattr(broker.state.store, "upgrade", _from_template(
                request.getfixturevalue("sqlite_template"), broker.state.store.upgrade))
        yield backend
        return
    srv = request.getfixturevalue("pg_server")
    url = srv.fresh_database()
    monkeypatch.setenv("ONEPOOL_DATABASE_URL", url)
    yield backend
    srv.drop_database(url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_cluster(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., tuple[Client, Engine]]]:
    """make_cluster(containment="auto"|"cgroup"|"group", **config kwargs) -> (client, engine)
    on a fresh home with a fake clock, running jobs as local processes."""

    engines: list[Engine] = []

    def make(containment: str = "auto", **kw: Any) -> tuple[Client, Engine]:
        c = Client(tmp_path / "home", clock=clock)
        c.apply(parse_config(config(**kw)))
        procs = LocalProcesses(c.store.home / "runs", containment=containment)
        engines.append(Engine(c.store, clock, procs))
        return c, engines[-1]

    yield make
    for e in engines:
        e.capacity.close()
    kill_leftovers(tmp_path / "home" / "runs")


def kill_leftovers(runs: Path) -> None:
    """No job process outlives its test: kill every process of every rank still alive (and
    wait until they are gone, which also removes their cgroups)."""
    if not runs.exists():
        return
    procs = LocalProcesses(runs)
    handles = []
    for d in runs.glob("attempt-*/rank-*"):
        h = procs.adopt(int(d.parent.name.split("-")[1]), int(d.name.split("-")[1]))
        if h is not None:
            procs.kill(h)
            handles.append(h)
    deadline = time.monotonic() + 10
    while left := [h for h in handles if procs.status(h).state in ("running", "orphaned")]:
        assert time.monotonic() < deadline, f"job processes survived SIGKILL: {left}"
        for h in left:
            procs.kill(h)
        time.sleep(0.05)
    procs.sweep()


def drive(engine: Engine, until: Callable[[], bool], timeout: float = 30.0,
          advance: float = 0.0) -> None:
    """Cycle the engine until `until()` holds. Between cycles it waits for a job process to
    exit (at most 50 ms: checkpoints appearing on disk have no event to wait on). Optionally
    advances a FakeClock by `advance` per cycle. Fails the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        engine.cycle()
        if until():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached in {timeout}s")
        if advance:
            engine.clock.advance(advance)  # type: ignore[attr-defined]
        engine.executor.wait_for_change(0.05)  # type: ignore[attr-defined]


@pytest.fixture
def cloud_cluster(tmp_path: Path, clock: FakeClock, aws_mock: str):  # type: ignore[no-untyped-def]
    """cloud_cluster(**config kwargs) -> (client, engine), for rented pools in moto: an API
    server the agents reach, and every instance the broker launches booted from its user
    data (broker.client.demo_instances.InstanceBooter)."""
    import boto3

    from broker.client.demo_instances import Ec2Instances, InstanceBooter
    from tests.agents.harness import make_site

    sites = []

    def make(**kw: Any) -> tuple[Client, Engine]:
        site = make_site(tmp_path / "home", clock, **kw)
        sites.append(site)
        return site.client, site.engine

    ec2 = boto3.client("ec2", region_name=aws_mock)
    with InstanceBooter(Ec2Instances(lambda: ec2), tmp_path / "instances"):
        yield make
        for s in sites:
            s.close()
    kill_leftovers(tmp_path / "home" / "runs")


AWS_REGION = "us-east-1"


@pytest.fixture
def aws_mock(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """moto's in-process AWS (EC2, SQS), throwaway credentials. Yields the region."""
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": AWS_REGION}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_SQS", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    with mock_aws():
        import boto3

        from providers.aws.session import new_session

        # moto clears boto3's default session; this one reads the service models once per
        # process (providers.aws.session), like every session the providers build
        boto3.DEFAULT_SESSION = new_session()
        yield AWS_REGION


@pytest.fixture(autouse=True)
def _no_instance_left_in_moto(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Every test that uses moto's EC2 must end with no instance pending or running."""
    if "aws_mock" not in request.fixturenames:
        yield
        return
    region = request.getfixturevalue("aws_mock")  # set up first, so torn down after this check
    yield
    import boto3

    resp = boto3.client("ec2", region_name=region).describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
    left = [i["InstanceId"] for r in resp["Reservations"] for i in r["Instances"]]
    assert not left, f"instances left running in moto: {left}"


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`onepool demo --json` run once, as a user runs it, in a fresh home: its parsed output
    (with "home" and the process's "stderr"). Shared by the demo, money and dashboard tests."""
    import subprocess

    home = tmp_path_factory.mktemp("demo") / "home"
    env = {**os.environ, "ONEPOOL_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "broker.client.cli", "demo", "--json"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    return {**json.loads(out.stdout), "stderr": out.stderr}
