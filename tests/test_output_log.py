"""Job output is capped per attempt (broker.output_log): the tail is kept, the rest counted.

A table of writes against the on-disk format, and a real rank printing past a small cap
through its supervisor, read back with `onepool logs`. (What agents ship through
/v1/agent/logs: tests/api/test_output_cap.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.client.cli import app
from broker.output_log import CappedOutput, extent, read, segments
from tests.conftest import drive

KIB = 1024


def stream(n: int, seed: int = 0) -> bytes:
    """n bytes, each position distinguishable (a byte cut or shifted anywhere shows)."""
    return bytes((i * 7 + seed) % 251 for i in range(n))


def on_disk(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.iterdir() if p.name.startswith("output.log"))


def pieces(run_dir: Path, offset: int = 0) -> list[tuple[int, bytes]]:
    """Everything kept from `offset`, read 1000 bytes at a time, as runs of contiguous bytes:
    [(where a run starts, its bytes)]."""
    runs: list[tuple[int, bytes]] = []
    while True:
        start, data = read(run_dir, offset, 1000)
        if not data:
            return runs
        if runs and runs[-1][0] + len(runs[-1][1]) == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + data)
        else:
            runs.append((start, data))
        offset = start + len(data)


def read_all(run_dir: Path) -> tuple[int, bytes]:
    """The kept output, which must be one tail: (where it starts, its bytes)."""
    runs = pieces(run_dir)
    assert len(runs) <= 1, f"a gap in the kept output: {[(s, len(b)) for s, b in runs]}"
    return runs[0] if runs else (0, b"")


# (cap, the writes as (offset or None for an append, size), end, kept, dropped)
WRITES = [
    pytest.param(64 * KIB, [(None, 10 * KIB)], 10 * KIB, 10 * KIB, 0, id="under-the-cap"),
    pytest.param(64 * KIB, [(None, 64 * KIB)], 64 * KIB, 64 * KIB, 0, id="exactly-the-cap"),
    pytest.param(64 * KIB, [(None, 65 * KIB)], 65 * KIB, 33 * KIB, 32 * KIB, id="one-past"),
    pytest.param(64 * KIB, [(None, 1000)] * 500, 500_000, 500_000 - 14 * 32 * KIB, 14 * 32 * KIB,
                 id="many-small-writes"),
    pytest.param(64 * KIB, [(None, 1024 * KIB)], 1024 * KIB, 64 * KIB, 960 * KIB, id="one-huge-write"),
    # an agent's pieces: a resend of bytes already here is skipped, a gap is counted as dropped
    pytest.param(64 * KIB, [(0, 10 * KIB), (0, 10 * KIB), (5 * KIB, 10 * KIB)], 15 * KIB, 15 * KIB, 0,
                 id="resends-skipped"),
    pytest.param(64 * KIB, [(0, 10 * KIB), (50 * KIB, 10 * KIB)], 60 * KIB, 20 * KIB, 40 * KIB,
                 id="gap-counted"),
]


@pytest.mark.parametrize(("cap", "writes", "end", "kept", "dropped"), WRITES)
def test_the_output_keeps_its_tail_within_the_cap(tmp_path: Path, cap: int, writes: list,
                                                  end: int, kept: int, dropped: int) -> None:
    full = stream(end + 64 * KIB)  # the stream every write is a piece of
    out = CappedOutput(tmp_path, cap)
    for offset, size in writes:
        at = out.end if offset is None else offset
        out.write_at(at, full[at:at + size])
        assert on_disk(tmp_path) <= cap
    out.close()
    assert extent(tmp_path).end == end and extent(tmp_path).dropped == dropped
    assert on_disk(tmp_path) == kept <= cap and len(segments(tmp_path)) <= 2
    runs = pieces(tmp_path)
    assert sum(len(b) for _, b in runs) == kept
    assert runs[-1][0] + len(runs[-1][1]) == end  # the tail is kept ...
    assert all(b == full[s:s + len(b)] for s, b in runs)  # ... byte for byte


def test_a_new_writer_continues_where_the_last_one_stopped(tmp_path: Path) -> None:
    full = stream(200 * KIB)
    for lo, hi in [(0, 50 * KIB), (50 * KIB, 120 * KIB), (120 * KIB, 200 * KIB)]:
        out = CappedOutput(tmp_path, 64 * KIB)
        assert out.end == lo
        out.append(full[lo:hi])
        out.close()
    start, tail = read_all(tmp_path)
    assert start + len(tail) == 200 * KIB and tail == full[start:] and len(tail) >= 32 * KIB


def test_reading_before_the_kept_tail_starts_at_the_tail(tmp_path: Path) -> None:
    out = CappedOutput(tmp_path, 64 * KIB)
    out.append(stream(100 * KIB))
    out.close()
    first = segments(tmp_path)[0].start
    assert read(tmp_path, 0, 10)[0] == first
    assert read(tmp_path, first + 5, 10) == (first + 5, stream(100 * KIB)[first + 5:first + 15])
    assert read(tmp_path, 100 * KIB, 10) == (100 * KIB, b"")
    assert read(tmp_path / "none", 0, 10) == (0, b"")


CAP = 64 * KIB
# prints 3 MiB in 1 KiB lines (numbered), then a last line: far past the cap
CHATTY = [sys.executable, "-c",
          "import sys\nfor i in range(3072):\n    sys.stdout.write(f'{i:07d} ' + 'x' * 1015 + '\\n')\n"
          "print('the last line', flush=True)"]


def test_a_rank_printing_past_the_cap_leaves_at_most_the_cap_with_its_tail(make_cluster, tmp_path):  # type: ignore[no-untyped-def]
    c, engine = make_cluster(output_cap_bytes=CAP)
    j = c.submit({"name": "chatty", "team": "research", "command": CHATTY}).id
    drive(engine, lambda: c.get(j).status == "SUCCEEDED", timeout=60)
    [att] = c.get(j).attempt_list
    run_dir = c.store.home / "runs" / f"attempt-{att.id}" / "rank-0"
    total = 3072 * 1024 + len("the last line\n")
    assert on_disk(run_dir) <= CAP
    assert extent(run_dir).end == total and extent(run_dir).dropped >= total - CAP
    start, tail = read_all(run_dir)
    assert tail.endswith(b"\nthe last line\n") and len(tail) >= CAP // 2
    lines = tail.split(b"\n")[1:-2]  # the first may start mid-line
    assert [int(x[:7]) for x in lines] == list(range(3072 - len(lines), 3072))  # nothing lost inside
    res = CliRunner().invoke(app, ["--home", str(c.store.home), "logs", str(j)])
    assert res.exit_code == 0, res.output
    assert f"[onepool: {start} bytes of output dropped here" in res.stderr
    assert res.stdout.endswith("the last line\n") and len(res.stdout) == len(tail)

