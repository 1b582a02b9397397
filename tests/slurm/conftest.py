"""A real single-node Slurm (tests/slurm/start_slurm.sh: slurmctld + slurmd + munge from
Debian's packages, four fake `gpu:a100` GRES, partitions `onepool` and `urgent`), and a
broker home whose pool `slurm-a100` submits into partition `onepool`."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.engine import Engine
from broker.spec import parse_config
from tests.conftest import config

HERE = Path(__file__).resolve().parent
START = HERE / "start_slurm.sh"
POOL = "slurm-a100"


@pytest.fixture(scope="session")
def slurm_node() -> str:
    """Start (or reuse) the test cluster; the Slurm name of its one node. Skips, saying why,
    where it cannot run (not root, no Debian packages)."""
    try:
        p = subprocess.run([str(START)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot start the test Slurm cluster: {e}")
    if p.returncode != 0:
        pytest.skip(f"cannot start the test Slurm cluster (exit {p.returncode}): {p.stderr.strip()[-500:]}")
    return socket.gethostname().split(".")[0]


def slurm_pool(**over: Any) -> dict[str, Any]:
    slurm = {"partition": "onepool", "gres_type": "a100", "start_timeout_s": 60,
             "jobcomp_log": "/var/log/slurm/jobcomp.log", **over.pop("slurm", {})}
    return {"name": POOL, "provider": "slurm", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 1,
            "amortized_usd_per_gpu_hour": 1.5, "slurm": slurm, **over}


def _jobs_named(prefix: str) -> list[str]:
    out = subprocess.run(["squeue", "--me", "-h", "-o", "%i %j"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if len(line.split()) > 1
            and line.split()[1].startswith(prefix)]


def scancel_all(prefix: str, wait_s: float = 30.0) -> None:
    """Cancel this user's Slurm jobs whose names start with `prefix` (test teardown), and wait
    until squeue no longer lists them, so the next test starts on a node with all its GPUs free.
    Slurm has no event to await here, so this polls squeue every 0.2 s, at most `wait_s`."""
    ids = _jobs_named(prefix)
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True)
    deadline = time.monotonic() + wait_s
    while _jobs_named(prefix) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture
def slurm_site(slurm_node: str, tmp_path: Path, clock: FakeClock
               ) -> Iterator[Callable[..., tuple[Client, Engine]]]:
    """slurm_site(**config kwargs) -> (client, engine): a broker home with the Slurm pool."""
    made: list[Client] = []

    def make(pools: list[dict[str, Any]] | None = None, **kw: Any) -> tuple[Client, Engine]:
        c = Client(tmp_path / "home", clock=clock)
        c.apply(parse_config(config(pools=pools or [slurm_pool()], **kw)))
        made.append(c)
        return c, Engine(c.store, clock)

    yield make
    for c in made[:1]:
        from broker.control.capacity_manager import broker_id

        with c.store.session() as s:
            scancel_all(f"onepool-{broker_id(s)}-")


GANG_POOL = "slurm-gang"


@pytest.fixture(scope="session")
def two_nodes(slurm_node: str) -> list[str]:
    """The nodes of partition `gang` (this one and `sn2` in a network namespace). Skips, saying
    why, where the second node could not be made."""
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "gang", "-o", "%N %T"], capture_output=True, text=True)
    nodes = [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == ["idle"]
             or line.split()[1:2] in (["mixed"], ["allocated"])]
    if len(nodes) < 2:
        pytest.skip("the test Slurm has no second node (no network namespace here): "
                    f"sinfo -p gang says {out.stdout.strip() or out.stderr.strip()!r}")
    return nodes


@pytest.fixture(scope="session")
def sshd(slurm_node: str) -> tuple[int, str]:
    """(port, client key) of an sshd on 127.0.0.1 that lets the key in as root
    (tests/slurm/start_sshd.sh). Skips, saying why, where it cannot start."""
    try:
        p = subprocess.run([str(HERE / "start_sshd.sh")], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot start the test sshd: {e}")
    if p.returncode != 0:
        pytest.skip(f"cannot start the test sshd (exit {p.returncode}): {p.stderr.strip()[-500:]}")
    port, key = p.stdout.split()
    return int(port), key
