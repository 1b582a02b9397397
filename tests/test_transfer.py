"""Cross-store copies (streamed or server-side, retried, verified), the choice of the restore
point across stores, and egress prices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.checkpoint.checkpoints import CheckpointStore, job_prefix
from broker.checkpoint.resume import fetch_restore_point
from broker.checkpoint.transfer import CopyFailed, SourceDamaged, copy_checkpoint
from pricing.egress import GIB, Location, Scope, egress_usd, load_rates, provider_of, scope_between


@pytest.fixture
def roots(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """roots("file"|"file2"|"s3"|"s3b"|"gcs") -> a fresh store root of that kind."""
    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = {"file": lambda: f"file://{tmp_path}/a", "file2": lambda: f"file://{tmp_path}/b",
                          "s3": lambda: request.getfixturevalue("s3_bucket"),
                          "s3b": lambda: _another_bucket(request, "s3"),
                          "gcs": lambda: request.getfixturevalue("gcs_bucket"),
                          "gcsb": lambda: _another_bucket(request, "gs")}[kind]()
        return made[kind]

    return get


def _another_bucket(request: pytest.FixtureRequest, scheme: str) -> str:
    import uuid

    import fsspec

    request.getfixturevalue("s3_server" if scheme == "s3" else "gcs_server")
    name = f"ck-{uuid.uuid4().hex[:12]}"
    fsspec.core.url_to_fs(f"{scheme}://{name}")[0].mkdir(name)
    return f"{scheme}://{name}"


def job_store(root: str) -> CheckpointStore:
    return CheckpointStore(job_prefix(root, "t", "e", 1))


@pytest.mark.parametrize(("src", "dst", "server_side"), [
    ("file", "s3", False), ("s3", "gcs", False), ("gcs", "file", False),
    ("s3", "s3b", True), ("gcs", "gcsb", True), ("file", "file2", True),
])
def test_copy_verifies_and_is_idempotent(roots: Any, src: str, dst: str, server_side: bool) -> None:
    a, b = job_store(roots(src)), job_store(roots(dst))
    m = a.write(6, {"arrays.npz": b"w" * 3000, "sub/opt.bin": b"o" * 500}, job_id=1, attempt=2, now=5)
    res = copy_checkpoint(a, m, b, now=9)
    assert (res.step, res.bytes, res.server_side) == (6, 3500, server_side)
    got = b.manifest(6)
    assert got is not None and got.files == m.files and got.attempt == 2 and got.copied_from == m.uri
    assert b.verify(got) == [] and b.read(6, "sub/opt.bin") == b"o" * 500
    again = copy_checkpoint(a, m, b, now=10)
    assert again.bytes == 0 and again.manifest == got


@pytest.mark.parametrize(("src", "dst"), [("file", "s3"), ("file", "file2"), ("s3", "s3b")])
def test_damaged_source_is_refused_and_leaves_nothing(roots: Any, src: str, dst: str) -> None:
    a, b = job_store(roots(src)), job_store(roots(dst))
    m = a.write(6, {"w": b"good"}, now=5)
    a.fs.pipe_file(a.step_path(6, "w"), b"bad!")
    with pytest.raises(SourceDamaged):
        copy_checkpoint(a, m, b, now=9)
    assert b.steps() == []


class Flaky:
    """Wraps a filesystem: its first `fail` opens for writing raise a connection reset."""

    def __init__(self, fs: Any, fail: int) -> None:
        self.fs, self.fail, self.calls = fs, fail, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def open(self, path: str, mode: str = "rb", **kw: Any) -> Any:
        if "w" in mode:
            self.calls += 1
            if self.calls <= self.fail:
                raise ConnectionResetError("connection reset by peer (simulated)")
        return self.fs.open(path, mode, **kw)


def test_transient_errors_are_retried(roots: Any) -> None:
    a, b = job_store(roots("file")), job_store(roots("s3"))
    m = a.write(1, {"w": b"x" * 100}, now=1)
    flaky = Flaky(b.fs, fail=2)
    b.fs = flaky  # type: ignore[assignment]
    res = copy_checkpoint(a, m, b, now=2)
    assert res.bytes == 100 and flaky.calls == 3


def test_persistent_failure_raises_copy_failed_and_cleans_up(roots: Any) -> None:
    a, b = job_store(roots("file")), job_store(roots("s3"))
    m = a.write(1, {"w": b"x" * 100}, now=1)
    b.fs = Flaky(b.fs, fail=99)  # type: ignore[assignment]
    with pytest.raises(CopyFailed, match="failed after 2 tries"):
        copy_checkpoint(a, m, b, now=2, tries=2)
    assert job_store(roots("s3")).steps() == []


def test_restore_point_falls_back_across_stores_and_prices_the_copy(roots: Any) -> None:
    """Newest in S3 is damaged, the one before it is intact in S3: it is copied to GCS,
    priced at AWS's internet egress rate, and the fallback is said."""
    s3, gcs = roots("s3"), roots("gcs")
    src, dst = job_prefix(s3, "t", "e", 1), job_prefix(gcs, "t", "e", 1)
    a = CheckpointStore(src)
    a.write(1, {"w": b"1" * 1000}, attempt=1, now=1)
    a.write(2, {"w": b"2" * 1000}, attempt=1, now=2)
    a.fs.pipe_file(a.step_path(2, "w"), b"X" + b"2" * 999)  # one flipped byte
    where = {s3: Location("aws", "us-east-1"), gcs: Location("gcp", "us-central1")}
    rp = fetch_restore_point([src], dst, now=10, locate=where.__getitem__)
    assert rp.step == 1 and rp.bytes == rp.egress_bytes == 1000
    assert rp.egress_usd == pytest.approx(1000 / GIB * 0.09)
    assert rp.damaged == [(s3, 2)] and rp.source == a.step_uri(1)
    kinds = [k for k, _, _ in rp.events]
    assert kinds == ["checkpoint_damaged", "checkpoint_copied", "checkpoint_fallback"]
    assert "resuming from step 1 instead" in rp.events[-1][1]
    assert CheckpointStore(dst).latest_valid()[0].step == 1  # type: ignore[union-attr]


def test_restore_point_prefers_the_copy_already_in_the_target(roots: Any) -> None:
    f, s3 = roots("file"), roots("s3")
    src, dst = job_prefix(f, "t", "e", 1), job_prefix(s3, "t", "e", 1)
    CheckpointStore(src).write(3, {"w": b"x"}, now=1)
    CheckpointStore(dst).write(3, {"w": b"x"}, now=1)
    rp = fetch_restore_point([src], dst, now=2, locate=lambda r: Location(provider_of(r)))
    assert rp.step == 3 and rp.egress_bytes == 0 and rp.copy is None and rp.events == []


@pytest.mark.parametrize(("src", "dst", "scope", "usd_per_gib"), [
    (Location("aws", "us-east-1"), Location("aws", "us-east-1"), Scope.SAME_REGION, 0.0),
    (Location("aws", "us-east-1"), Location("aws", "eu-west-1"), Scope.INTER_REGION, 0.02),
    (Location("aws", "us-east-1"), Location("gcp", "us-central1"), Scope.INTERNET, 0.09),
    (Location("aws", None), Location("aws", None), Scope.INTER_REGION, 0.02),
    (Location("gcp", "us-central1"), Location("onprem", "local"), Scope.INTERNET, 0.12),
    (Location("onprem", "local"), Location("aws", "us-east-1"), Scope.INTERNET, 0.0),
    (Location("azure", "eastus"), Location("aws", "us-east-1"), Scope.INTERNET, 0.087),
    (Location("wasabi", None), Location("aws", None), Scope.INTERNET, 0.09),  # default rows
])
def test_egress_prices(src: Location, dst: Location, scope: Scope, usd_per_gib: float) -> None:
    assert scope_between(src, dst) == scope
    assert egress_usd(3 * GIB, src, dst) == pytest.approx(3 * usd_per_gib)
    assert egress_usd(0, src, dst) == 0.0


def test_egress_table_names_its_sources() -> None:
    rates = load_rates()
    assert {p for p, _ in rates} >= {"aws", "gcp", "azure", "onprem", "default"}
    assert all(r.source and r.as_of for r in rates.values())
    assert [provider_of(u) for u in ("s3://b/x", "gs://b", "file:///d", "/plain/path")] == [
        "aws", "gcp", "onprem", "onprem"]
