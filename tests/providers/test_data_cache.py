"""A node's data cache (providers.data_cache): least recently used out past its cap, never an
entry a live rank links to, nor one of the mapping being linked."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from providers.base import StartFailed
from providers.data_cache import DataCache
from providers.rank_prep import DATA_FILE, data_in_use


def _uris(tmp: Path) -> dict[str, str]:
    out = {}
    for name in "abc":
        f = tmp / "bucket" / f"{name}.bin"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(name.encode() * 1000)
        out[name] = f"file://{f}"
    return out


@pytest.mark.parametrize("cap, steps, busy, kept", [
    (10_000, "abc", "", "abc"),  # under the cap: all kept
    (2_500, "abc", "", "bc"),  # c evicts the least recently used: a
    (2_500, "abac", "", "ac"),  # a used again after b: b goes
    (2_500, "abc", "a", "ac"),  # a is linked by a live rank: b goes instead
    (1_500, "abc", "ab", "abc"),  # all in use: over the cap rather than pull data from under a rank
])
def test_least_recently_used_out_past_the_cap_never_one_in_use(
        tmp_path: Path, cap: int, steps: str, busy: str, kept: str) -> None:
    uris = _uris(tmp_path)
    keys: dict[str, str] = {}
    cache = DataCache(tmp_path / "cache", cap_bytes=cap, in_use=lambda: {keys[n] for n in busy if n in keys},
                      file_roots=[tmp_path])
    for i, name in enumerate(steps):
        entry = cache.get(uris[name])
        keys[name] = cache.key_of(entry)
        t = time.time() - 100 + i  # (distinct use times, oldest first)
        os.utime(entry.parent, (t, t))
    held = {n for n, k in keys.items() if (tmp_path / "cache" / k).exists()}
    assert held == set(kept)


def test_a_mapping_over_the_cap_links_all_its_entries(tmp_path: Path) -> None:
    uris = _uris(tmp_path)
    cache = DataCache(tmp_path / "cache", cap_bytes=1_000, file_roots=[tmp_path])
    keys = cache.link({"x/a": uris["a"], "x/b": uris["b"]}, tmp_path / "rank")
    assert (tmp_path / "rank" / "x" / "a").read_bytes() == b"a" * 1000
    assert (tmp_path / "rank" / "x" / "b").read_bytes() == b"b" * 1000
    assert len(keys) == 2


def test_entries_in_use_are_those_of_ranks_that_have_not_ended(tmp_path: Path) -> None:
    for rank, keys, ended in (("attempt-1/rank-0", ["k1"], True), ("attempt-2/rank-0", ["k2", "k3"], False)):
        d = tmp_path / rank
        d.mkdir(parents=True)
        (d / DATA_FILE).write_text(f'{{"keys": {keys!r}}}'.replace("'", '"'))
        if ended:
            (d / "exit.json").write_text('{"code": 0}')
    assert data_in_use(tmp_path) == {"k2", "k3"}


@pytest.mark.parametrize("where, why", [
    ("outside", "is read on this node only under its ONEPOOL_DATA_FILE_ROOTS"),  # /etc/passwd-like
    ("link", "is read on this node only under its ONEPOOL_DATA_FILE_ROOTS"),  # a folder with a link out
    ("metadata", "link-local address"),  # the cloud metadata service: the node's credentials
    ("loopback", "loopback or link-local"),
])
def test_a_job_cannot_fetch_the_nodes_own_files_or_its_credentials(tmp_path: Path, where: str,
                                                                     why: str) -> None:
    roots = tmp_path / "datasets"
    (roots / "ds").mkdir(parents=True)
    secret = tmp_path / "node-secret"
    secret.write_text("root only")
    (roots / "ds" / "leak").symlink_to(secret)
    uri = {"outside": f"file://{secret}", "link": f"file://{roots}/ds",
           "metadata": "http://169.254.169.254/latest/meta-data/iam/security-credentials/role",
           "loopback": "http://127.0.0.1:1/x"}[where]
    cache = DataCache(tmp_path / "cache", file_roots=[roots])
    with pytest.raises(StartFailed, match=why) as e:
        cache.get(uri)
    assert e.value.cause == "start_failed:data_unavailable"
    assert not any((tmp_path / "cache").rglob("node-secret")) and not any((tmp_path / "cache").rglob("leak"))
