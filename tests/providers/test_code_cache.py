"""A node's cache of code snapshots (providers.code_cache): hits fetch nothing, least
recently used out past the cap, a damaged download fetched once more then refused, private
copies per rank."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.codepack import Snapshot, pack
from providers.base import StartFailed
from providers.code_cache import CodeCache


def _snap(tmp: Path, name: str, size: int = 10) -> Snapshot:
    d = tmp / f"src-{name}"
    d.mkdir()
    (d / "main.py").write_text(name * size)
    return pack(d)


class Store:
    """Fetches from a dict of URI -> a list of answers (the last repeats); counts calls."""

    def __init__(self, answers: dict[str, list[bytes | Exception]]) -> None:
        self.answers, self.calls = answers, 0

    def __call__(self, uri: str) -> bytes:
        self.calls += 1
        seq = self.answers[uri]
        got = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(got, Exception):
            raise got
        return got


def test_a_hit_fetches_nothing_and_each_rank_gets_its_own_writable_copy(tmp_path: Path) -> None:
    s = _snap(tmp_path, "a")
    store = Store({"u": [s.data]})
    cache = CodeCache(tmp_path / "cache", fetch=store)
    r0 = cache.checkout(s.sha256, "u", tmp_path / "r0")
    r1 = cache.checkout(s.sha256, "u", tmp_path / "r1")
    assert store.calls == 1 and cache.stats == {"fetches": 1, "hits": 1, "fetched_bytes": len(s.data)}
    (r0 / "main.py").write_text("changed by rank 0")
    assert (r1 / "main.py").read_text() == "a" * 10
    assert (cache.get(s.sha256, "u") / "main.py").read_text() == "a" * 10


Answers = Callable[[Snapshot], list[bytes | Exception]]


@pytest.mark.parametrize("answers, calls, cause", [
    (lambda s: [s.data[:-3] + b"xyz", s.data], 2, None),  # damaged once: fetched again, verified
    (lambda s: [b"damaged", b"damaged again"], 2, "start_failed:code_unverified"),
    (lambda s: [FileNotFoundError("no such key")], 1, "start_failed:code_unavailable"),
], ids=["refetched once", "damaged twice", "missing"])
def test_a_download_that_does_not_verify_is_fetched_once_more(tmp_path: Path, answers: Answers, calls: int,
                                                              cause: str | None) -> None:
    s = _snap(tmp_path, "a")
    store = Store({"u": answers(s)})
    cache = CodeCache(tmp_path / "cache", fetch=store)
    if cause is None:
        assert (cache.get(s.sha256, "u") / "main.py").exists()
    else:
        with pytest.raises(StartFailed) as e:
            cache.get(s.sha256, "u")
        assert e.value.cause == cause
        assert cache.holds() == []
    assert store.calls == calls


def test_least_recently_used_snapshots_leave_past_the_cap(tmp_path: Path) -> None:
    snaps = {n: _snap(tmp_path, n, size=1000) for n in "abc"}
    store = Store({n: [s.data] for n, s in snaps.items()})
    cache = CodeCache(tmp_path / "cache", cap_bytes=2500, fetch=store)
    cache.get(snaps["a"].sha256, "a")
    cache.get(snaps["b"].sha256, "b")
    os.utime(cache.root / snaps["a"].sha256, (1, 1))
    os.utime(cache.root / snaps["b"].sha256, (2, 2))
    cache.get(snaps["a"].sha256, "a")  # a used again: b is now the oldest
    cache.get(snaps["c"].sha256, "c")
    assert sorted(cache.holds()) == sorted([snaps["a"].sha256, snaps["c"].sha256])


def test_an_archive_that_unpacks_unsafely_fails_as_the_jobs_fault(tmp_path: Path) -> None:
    import hashlib

    bad = b"\x1f\x8b not really gzip"
    cache = CodeCache(tmp_path / "cache", fetch=Store({"u": [bad]}))
    with pytest.raises(StartFailed) as e:
        cache.get(hashlib.sha256(bad).hexdigest(), "u")
    assert e.value.cause == "start_failed:code_bad_archive"
    assert [p.name for p in cache.root.iterdir() if not p.name.startswith("stats")] == []
