"""Jobs whose checkpoints move between stores, with real processes, real protocols (S3 on a
moto server, GCS on fake-gcs-server) and a fake clock."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from broker.checkpoint.checkpoints import CheckpointStore, job_prefix
from broker.spec import parse_config
from broker.state.model import Checkpoint
from pricing.egress import GIB
from tests.conftest import config, drive, train
from tests.test_engine_e2e import out_log

# SQLite only: the database is not what these tests are about (see tests/conftest.py)

GATE = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def gated(path: Path) -> list[str]:
    """A job that runs until `path` exists."""
    return [sys.executable, "-c", GATE, str(path)]


def journey_pools(s3: str, gcs: str, aws_nodes: int, gcp_nodes: int) -> list[dict[str, Any]]:
    return [
        {"name": "onprem", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1},
        {"name": "aws", "gpu_type": "A10G", "gpus_per_node": 2, "nodes": aws_nodes, "market": "spot",
         "region": "us-east-1", "price_per_node_hour": 2.0, "store": f"{s3}/ckpt"},
        {"name": "gcp", "gpu_type": "L4", "gpus_per_node": 2, "nodes": gcp_nodes,
         "market": "on_demand", "region": "us-central1", "price_per_node_hour": 3.0,
         "store": f"{gcs}/ckpt"},
    ]


def test_preempted_on_file_resumes_on_s3_then_interrupted_on_s3_resumes_on_gcs(
        make_cluster, s3_bucket, gcs_bucket, tmp_path):
    c, eng = make_cluster(pools=journey_pools(s3_bucket, gcs_bucket, aws_nodes=1, gcp_nodes=0))
    j = c.submit(name="traveller", team="research", command=train(60, 0.05, 2, state_kb=64),
                 gpus_per_node=2, priority="low").id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 3)
    stop = tmp_path / "stop-urgent"
    u = c.submit(name="urgent", team="prod", command=gated(stop), gpus_per_node=2,
                 gpu_types=["A100"], priority="urgent").id

    def moved_and_progressed(n: int) -> bool:
        atts = c.get(j).attempt_list
        return (len(atts) == n and atts[-1].state == "RUNNING" and atts[-1].reached_step is not None
                and atts[-1].reached_step > (atts[-1].restored_step or -1))

    drive(eng, lambda: moved_and_progressed(2))
    a1, a2 = c.get(j).attempt_list
    assert (a1.pool, a1.end_reason, a1.cause) == ("onprem", "PREEMPTED", f"preempted_by={u}")
    assert a2.pool == "aws" and a2.restored_step == a1.reached_step
    assert a2.checkpoint_uri == job_prefix(f"{s3_bucket}/ckpt", "research", "default", j)
    assert a2.egress_bytes == a2.restore_bytes > 64 * 1024
    assert a2.egress_usd == 0.0  # leaving on-prem is free; entering AWS is free

    # The spot capacity is reclaimed (an interruption notice) and GCP has room now.
    c.apply(parse_config(config(pools=journey_pools(s3_bucket, gcs_bucket, aws_nodes=0, gcp_nodes=1))))
    assert eng.interrupt(a2.id) is True
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    a1, a2, a3 = info.attempt_list
    assert (a2.end_reason, a2.cause) == ("INTERRUPTED", "spot_interruption")
    assert a3.pool == "gcp" and a3.restored_step == a2.reached_step and a3.cause is None
    assert f"resumed from step {a2.reached_step} (attempt 3)" in out_log(c, a3.id)
    assert a3.egress_bytes == a3.restore_bytes > 64 * 1024
    assert a3.egress_usd == pytest.approx(a3.egress_bytes / GIB * 0.09)  # AWS -> internet
    assert info.last_step == 59 and info.preemptions == 1
    home_store = c.checkpoint_root(c.config())
    assert info.checkpoint_stores == [home_store, f"{s3_bucket}/ckpt", f"{gcs_bucket}/ckpt"]
    assert info.egress_bytes == a2.egress_bytes + a3.egress_bytes
    assert info.egress_usd == pytest.approx(a3.egress_usd)
    copied = [e for e in c.events(j) if e.kind == "checkpoint_copied"]
    assert [(e.data["from"], e.data["to"]) for e in copied] == [
        (home_store, f"{s3_bucket}/ckpt"), (f"{s3_bucket}/ckpt", f"{gcs_bucket}/ckpt")]
    assert [e.data["bytes"] for e in copied] == [a2.egress_bytes, a3.egress_bytes]
    assert {"interrupting", "interrupted", "checkpoint_requested"} <= {e.kind for e in c.events(j)}
    stop.touch()
    drive(eng, lambda: c.get(u).status == "SUCCEEDED")


def test_flipped_byte_makes_the_resume_fall_back_and_says_so(make_cluster, s3_bucket, tmp_path):
    pools = [{"name": "aws", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1, "store": s3_bucket}]
    c, eng = make_cluster(pools=pools)
    j = c.submit(name="victim", team="research", command=train(30, 0.05, 2), gpus_per_node=2,
                 priority="low").id
    drive(eng, lambda: (c.get(j).last_step or -1) >= 5)
    go = tmp_path / "go"
    u = c.submit(name="u", team="prod", command=gated(go), gpus_per_node=2, priority="urgent").id
    drive(eng, lambda: c.get(j).status == "PENDING")
    st = CheckpointStore(c.get(j).checkpoint_uri)
    newest, previous = [m.step for m in st.committed()[:2]]
    assert newest == c.get(j).attempt_list[0].reached_step
    path = st.step_path(newest, "arrays.npz")
    data = bytearray(st.fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    st.fs.pipe_file(path, bytes(data))
    go.touch()
    drive(eng, lambda: c.get(j).status == "SUCCEEDED" and c.get(u).status == "SUCCEEDED")
    a2 = c.get(j).attempt_list[1]
    assert a2.restored_step == previous
    assert f"resumed from step {previous} (attempt 2)" in out_log(c, a2.id)
    evs = {e.kind: e for e in c.events(j)}
    assert evs["checkpoint_damaged"].data["step"] == newest
    assert "arrays.npz: sha256 mismatch" in evs["checkpoint_damaged"].message
    assert f"resuming from step {previous} instead" in evs["checkpoint_fallback"].message
    with c.store.session() as s:
        row = s.exec(select(Checkpoint).where(Checkpoint.job_id == j, Checkpoint.step == newest)).one()
    assert row.state == "damaged"


SHARDED = """
from broker import runtime
from broker.errors import CheckpointError
rank = runtime.context().rank
for step in range(4):
    if not (rank == 1 and step == 2):  # rank 1 never writes its shard of step 2
        runtime.save(step, arrays={"who": [rank, step]})
try:
    runtime.wait()
except CheckpointError as e:
    print("not committed:", e, flush=True)
"""


def test_multi_node_job_with_a_missing_shard_has_no_such_checkpoint(make_cluster, gcs_bucket, monkeypatch):
    from broker import runtime

    pools = [{"name": "gang", "gpu_type": "A100", "gpus_per_node": 1, "nodes": 2, "store": gcs_bucket}]
    c, eng = make_cluster(pools=pools, grace_s=1)
    j = c.submit(name="gang", team="research", command=[sys.executable, "-c", SHARDED],
                 gpus_per_node=1, nodes=2).id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    info = c.get(j)
    st = CheckpointStore(info.checkpoint_uri)
    assert st.steps() == [0, 1, 2, 3]
    assert [m.step for m in st.committed()] == [3, 1, 0]
    assert st.missing_shards(2, 2) == [1]
    assert "rank(s) [1] wrote no shard" in out_log(c, info.attempt_list[0].id, 0)
    assert info.last_step == 3
    for rank in (0, 1):
        monkeypatch.setattr(runtime, "_ctx", [runtime.Context.from_env({
            "ONEPOOL_CHECKPOINT_URI": info.checkpoint_uri, "ONEPOOL_RANK": str(rank),
            "ONEPOOL_WORLD_SIZE": "2"})])
        r = runtime.restore()
        assert r is not None and r.step == 3 and r.arrays["who"].tolist() == [rank, 3]


HOSTILE = """
import hashlib, json, sys, time
import fsspec
from broker import runtime
restored = runtime.restore()
if restored is not None:
    print(f"resumed from step {restored.step}", flush=True)
    sys.exit(0)
runtime.save(1, arrays={"x": [1]}, block=True)
name = "../" * 40 + sys.argv[1].lstrip("/")
data = b"the job's bytes"
fs, root = fsspec.core.url_to_fs(runtime.context().checkpoint_uri)
step = f"{root}/step-000000000002"
fs.pipe_file(f"{step}/{name}", data)  # an object whose key holds the traversal
fs.pipe_file(f"{step}/manifest.json", json.dumps({
    "format": 1, "step": 2, "time": time.time(), "written_by": {}, "world_size": 1, "writer": "x",
    "files": {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}).encode())
print("planted", flush=True)
while not runtime.preempted():
    time.sleep(0.02)
runtime.exit_preempted()
"""


def attack_pools(s3: str, onprem_nodes: int) -> list[dict[str, Any]]:
    return [{"name": "aws", "gpu_type": "A10G", "gpus_per_node": 2, "nodes": 1, "store": s3},
            {"name": "onprem", "gpu_type": "A100", "gpus_per_node": 2, "nodes": onprem_nodes}]


def test_a_manifest_naming_a_path_outside_is_damaged_and_writes_nothing_on_the_server(
        make_cluster, s3_bucket, tmp_path):
    """Issue 24's critical finding, end to end: a job on an S3-store pool writes a manifest
    naming `../` x 40 + a path on the server, is preempted and resumes on a pool with a file
    store. The broker refuses that step as damaged (the event names the entry), resumes from
    the step before, and the path never appears."""
    target = tmp_path / "pwned.txt"
    c, eng = make_cluster(pools=attack_pools(s3_bucket, onprem_nodes=0))
    j = c.submit(name="hostile", team="research", command=[sys.executable, "-c", HOSTILE, str(target)],
                 gpus_per_node=2, priority="low").id
    drive(eng, lambda: "planted" in _log_or_empty(c, j))
    c.apply(parse_config(config(pools=attack_pools(s3_bucket, onprem_nodes=1))))
    go = tmp_path / "go"
    u = c.submit(name="u", team="prod", command=gated(go), gpus_per_node=2, gpu_types=["A10G"],
                 priority="urgent").id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    a1, a2 = c.get(j).attempt_list
    assert (a1.pool, a1.end_reason, a2.pool) == ("aws", "PREEMPTED", "onprem")
    assert a2.restored_step == 1 and "resumed from step 1" in out_log(c, a2.id)
    assert not target.exists()
    evs = {e.kind: e for e in c.events(j)}
    assert evs["checkpoint_damaged"].data["step"] == 2
    assert "bad checkpoint file name '../../" in evs["checkpoint_damaged"].message
    assert "resuming from step 1 instead" in evs["checkpoint_fallback"].message
    with c.store.session() as s:
        rows = {r.step: r.state for r in s.exec(select(Checkpoint).where(
            Checkpoint.job_id == j, Checkpoint.store == s3_bucket))}
    assert rows == {1: "committed", 2: "damaged"}
    home = CheckpointStore(a2.checkpoint_uri)
    assert home.steps() == [1] and home.verify(home.manifest(1)) == []  # type: ignore[arg-type]
    go.touch()
    drive(eng, lambda: c.get(u).status == "SUCCEEDED")


def _log_or_empty(c: Any, job_id: int) -> str:
    atts = c.get(job_id).attempt_list
    try:
        return out_log(c, atts[-1].id) if atts else ""
    except FileNotFoundError:
        return ""
