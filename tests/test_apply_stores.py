"""`onepool apply` refuses checkpoints kept where a pool's nodes cannot reach them: a pool whose
nodes are not the server (agent, rented, Slurm) on a file:// store not declared shared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.client.sdk import Client
from broker.errors import NotConfigured
from broker.spec import parse_config, unreachable_stores

ROOT = Path(__file__).resolve().parent.parent
SLURM = {"slurm": {"partition": "gpu"}}
AWS = {"market": "spot", "max_nodes": 2, "region": "us-east-1", "instance_type": "p4d.24xlarge",
       "price_per_node_hour": 10.0}


def cfg(provider: str, store: str | None = None, shared: bool = False, broker_store: str | None = None,
        **extra: Any) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": "p", "provider": provider, "gpu_type": "A100", "gpus_per_node": 8,
                            "nodes": 0 if provider == "aws" else 2, **extra}
    if store:
        pool["store"] = store
    if shared:
        pool["store_shared"] = True
    broker: dict[str, Any] = {"server_url": "http://10.0.0.5:8421"}
    if broker_store:
        broker["checkpoint_store"] = broker_store
    return {"pools": [pool], "teams": [{"name": "t"}], "broker": broker}


@pytest.mark.parametrize("data, refused", [
    (cfg("local"), False),                                           # the server's own slots
    (cfg("local", "file:///srv/ck"), False),
    (cfg("agent"), True),                                            # default: the server's home
    (cfg("agent", "file:///srv/ck"), True),
    (cfg("agent", "file:///nfs/ck", shared=True), False),           # declared on a shared disk
    (cfg("agent", "s3://lab/ck"), False),
    (cfg("agent", broker_store="file:///srv/ck"), True),            # the broker's store, a folder
    (cfg("agent", broker_store="gs://lab/ck"), False),
    (cfg("agent", "file:///srv/ck", broker_store="s3://lab/ck"), True),  # the pool's own wins
    (cfg("slurm", "file:///shared/ck", **SLURM), True),
    (cfg("slurm", "file:///shared/ck", shared=True, **SLURM), False),
    (cfg("aws", **AWS), True),
    (cfg("aws", "s3://lab/ck", **AWS), False),
])
def test_pools_off_the_server_need_a_store_they_reach(data: dict[str, Any], refused: bool) -> None:
    problems = unreachable_stores(parse_config(data))
    if not refused:
        assert problems == []
        return
    [msg] = problems
    assert msg.startswith("pools[0] (p): ") and data["pools"][0]["provider"] in msg
    assert "store_shared: true" in msg and "s3://" in msg  # what to do


def test_apply_refuses_it_and_applies_nothing(tmp_path: Path) -> None:
    path = tmp_path / "onepool.yaml"
    path.write_text(yaml.safe_dump(cfg("agent")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPOOL_")}
    home = tmp_path / "home"
    argv = [sys.executable, "-m", "broker.client.cli", "--home", str(home), "apply", "-c", str(path)]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.startswith("error:") and "pools[0] (p)" in " ".join(r.stderr.split())
    with pytest.raises(NotConfigured):
        Client(home).config()
