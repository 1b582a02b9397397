"""What a running job imports: resume, save, progress, and "checkpoint now / you are being preempted".

The broker starts every attempt with this environment contract:

    ONEPOOL_JOB_ID, ONEPOOL_ATTEMPT (1, 2, ...), ONEPOOL_ATTEMPT_ID
    ONEPOOL_RANK, ONEPOOL_WORLD_SIZE             (gang jobs: one process per node)
    ONEPOOL_CHECKPOINT_URI                       the job's checkpoint prefix in the store of
                                                 the pool it runs in (fsspec URI)
    ONEPOOL_RESTORE_STEP                         the step the broker verified (and copied
                                                 into that store) for resume, if any
    ONEPOOL_GRACE_S                              seconds between SIGTERM and SIGKILL
    ONEPOOL_CHECKPOINT_INTERVAL_S                the job's checkpoint interval hint
    ONEPOOL_POOL, ONEPOOL_PROVIDER, ONEPOOL_REGION
    ONEPOOL_TEAM                                 the job's team
    ONEPOOL_JOB_DIR                              the job's own folder on the node (HOME; TMPDIR
                                                 is its tmp/, where staging_dir() goes)
    CUDA_VISIBLE_DEVICES                         the GPU slots granted on this node
    ONEPOOL_IMAGE                                the job's image, when it runs in one (its
                                                 GPUs are then numbered from 0 inside)

Nothing else of the server's or agent's environment: see providers.isolation.

Signals (handled once this module is imported under the broker):

    SIGUSR1   checkpoint now and keep running (an interruption notice, a user request):
              `due()` and `checkpoint_requested()` turn true until the next save()
    SIGTERM   checkpoint now and exit (preemption, interruption, cancel): `preempted()`
              turns true as well; save, then exit_preempted()

Typical use::

    from broker import runtime
    ck = runtime.restore()                 # None on a fresh start
    step = ck.step + 1 if ck else 0
    while step < total:
        ...train...
        runtime.progress(step, total)      # cheap: the restart is over; status shows an ETA
        if runtime.preempted() or runtime.due():
            runtime.save(step, arrays={"w": w})   # returns at once; uploads in background
        if runtime.preempted():
            runtime.exit_preempted()       # waits for the upload, exits for requeue
        step += 1
    runtime.wait()                         # the last upload is committed
    ...write results...
    runtime.done()                         # finished: never run again, whatever dies now

`save()` serializes arrays at once (training may change them afterwards) and hands the
upload to a background thread; files given as paths are read by that thread, so leave them
unchanged until the save is done (`staging_dir(step)` gives a private folder to write them
into). Multi-node jobs: every rank calls save() for the same step with its own shard; rank
0 commits the checkpoint only once every rank's shard is there.

Exit 0 means "done"; a non-zero exit after SIGTERM means "preempted, requeue me"; a non-zero
exit otherwise means the job failed.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from broker.checkpoint.checkpoints import CheckpointStore, Manifest, Source, shard_dir
from broker.checkpoint.uploader import PendingSave, Uploader
from broker.clock import SystemClock
from broker.errors import CheckpointError

EXIT_PREEMPTED = 143  # 128 + SIGTERM, as a shell reports a process ended by SIGTERM
ARRAYS_FILE = "arrays.npz"
SHARD_POLL_S = 0.2
# Rewrite the progress marker at most this often (the broker's environment may lower it).
PROGRESS_EVERY_S = float(os.environ.get("ONEPOOL_PROGRESS_EVERY_S", "10"))


@dataclass
class Restored:
    """A checkpoint loaded for resume. `arrays` holds what save(arrays=...) stored (this
    rank's shard for multi-node jobs); read() reads this rank's files."""

    step: int
    manifest: Manifest
    store: CheckpointStore
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    rank: int = 0

    def read(self, name: str) -> bytes:
        """The bytes of one file of this checkpoint (of this rank's shard, if sharded)."""
        return self.store.read(self.step, _in_shard(self.manifest, self.rank, name))


@dataclass
class Context:
    """The environment contract, parsed. Build it with from_env()."""

    job_id: int | None
    attempt: int | None
    attempt_id: int | None
    rank: int
    world_size: int
    checkpoint_uri: str | None
    restore_step: int | None
    grace_s: float
    checkpoint_interval_s: float
    written_by: dict[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Context:
        e = os.environ if env is None else env

        def num(k: str) -> int | None:
            v = e.get(k)
            return int(v) if v not in (None, "") else None

        return cls(
            job_id=num("ONEPOOL_JOB_ID"), attempt=num("ONEPOOL_ATTEMPT"),
            attempt_id=num("ONEPOOL_ATTEMPT_ID"),
            rank=num("ONEPOOL_RANK") or 0, world_size=num("ONEPOOL_WORLD_SIZE") or 1,
            checkpoint_uri=e.get("ONEPOOL_CHECKPOINT_URI") or None,
            restore_step=num("ONEPOOL_RESTORE_STEP"),
            grace_s=float(e.get("ONEPOOL_GRACE_S", "60")),
            checkpoint_interval_s=float(e.get("ONEPOOL_CHECKPOINT_INTERVAL_S", "1800")),
            written_by={"provider": e.get("ONEPOOL_PROVIDER", "local"),
                        "region": e.get("ONEPOOL_REGION", "local"),
                        "pool": e.get("ONEPOOL_POOL", "")},
        )

    def store(self) -> CheckpointStore:
        if not self.checkpoint_uri:
            raise RuntimeError("ONEPOOL_CHECKPOINT_URI is not set: not running under the broker?")
        return CheckpointStore(self.checkpoint_uri)


_preempted = threading.Event()
_requested = threading.Event()
_last_save = [time.monotonic()]
_ctx: list[Context] = []
_uploader: list[Uploader] = []
_progressed: list[float] = []  # [first step, monotonic time of the last marker, first wall time]


def _on_sigterm(signum: int, frame: object) -> None:
    _preempted.set()
    _requested.set()


def _on_sigusr1(signum: int, frame: object) -> None:
    _requested.set()


def install() -> None:
    """Make SIGTERM set the preempted flag instead of killing the process, and SIGUSR1
    request a checkpoint (idempotent). Called on import under the broker."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        signal.signal(signal.SIGUSR1, _on_sigusr1)


def context() -> Context:
    if not _ctx:
        _ctx.append(Context.from_env())
    return _ctx[0]


def preempted() -> bool:
    """True once the broker asked this attempt to stop (SIGTERM): save and exit soon."""
    return _preempted.is_set()


def checkpoint_requested() -> bool:
    """True when the broker asked for a checkpoint (SIGUSR1 or SIGTERM) not yet saved."""
    return _requested.is_set()


def due() -> bool:
    """True when a checkpoint was requested, or the interval hint has passed since the last
    save (or start)."""
    return _requested.is_set() or time.monotonic() - _last_save[0] >= context().checkpoint_interval_s


def restore() -> Restored | None:
    """The checkpoint to resume from, or None for a fresh start.

    Takes the step the broker verified (ONEPOOL_RESTORE_STEP) or, outside the broker, the
    newest intact committed one. A damaged checkpoint is skipped for the previous one; a
    folder without a manifest is never used.
    """
    ctx = context()
    if not ctx.checkpoint_uri:
        return None
    store = ctx.store()
    m, skipped = store.latest_valid(at_most=ctx.restore_step)
    if m is None:
        return None
    arrays: dict[str, np.ndarray] = {}
    name = _in_shard(m, ctx.rank, ARRAYS_FILE)
    if name in m.files:
        with np.load(io.BytesIO(store.read(m.step, name)), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return Restored(step=m.step, manifest=m, store=store, arrays=arrays, skipped=skipped,
                    rank=ctx.rank)


def staging_dir(step: int) -> Path:
    """A fresh local folder for this step's files (e.g. torch.save(..., d / "model.pt")):
    pass it to save(step, files={"": d}) or name its files; nothing else writes there."""
    d = Path(tempfile.mkdtemp(prefix=f"onepool-step-{step}-"))
    return d


def save(step: int, arrays: Mapping[str, np.ndarray] | None = None,
         files: Mapping[str, Source] | None = None, *, block: bool = False) -> PendingSave:
    """Checkpoint `step`: numpy arrays (as arrays.npz, serialized now) and/or files (bytes,
    local paths, or local folders, whose files keep their relative names under the given
    name). Returns at once; the upload and the commit run in the background (block=True
    waits). Every rank of a multi-node job saves its own shard.

    Raises CheckpointError if nothing is given; upload errors come from the returned
    handle's result(), or wait().
    """
    ctx = context()
    payload = _payload(arrays, files)
    if not payload:
        raise CheckpointError("save() needs arrays or files to write")
    started = SystemClock().now()  # the save's cost, from here to its commit: see broker.policy.intervals
    pending = _worker().submit(step, partial(_upload, ctx, ctx.store(), step, payload, started))
    _last_save[0] = time.monotonic()
    _requested.clear()
    if block:
        pending.result()
    return pending


def progress(step: int, total: int | None = None) -> None:
    """Report that training completed `step` (of `total` steps, numbered 0..total-1, when the
    job knows it: `onepool status` then shows an ETA). Cheap: rank 0 writes a tiny marker in
    the background on the first call of an attempt (the broker measures restart overhead from
    it) and then at most every PROGRESS_EVERY_S seconds."""
    ctx = context()
    if not ctx.checkpoint_uri or ctx.attempt is None or ctx.rank != 0:
        return
    now = time.monotonic()
    if _progressed and now - _progressed[1] < PROGRESS_EVERY_S:
        return
    if not _progressed:
        _progressed.extend([step, now, SystemClock().now()])
    _progressed[1] = now
    first_step, first_time = int(_progressed[0]), float(_progressed[2])
    _worker().run(partial(_mark, ctx.store(), ctx.attempt, step, total, first_step, first_time))


def wait(timeout: float | None = None) -> None:
    """Wait until every save so far is committed. Raises CheckpointError naming the steps
    whose upload failed, or TimeoutError."""
    if not _uploader:
        return
    failed = _uploader[0].flush(timeout)
    if failed:
        raise CheckpointError("checkpoint upload failed: " + "; ".join(
            f"step {p.step}: {p.error()}" for p in failed))


def done() -> None:
    """This rank's work is finished: call it last, after the job's final side effects (its
    results written). If the rank's supervisor or node then dies before this process has
    exited, or its exit cannot be reported (its node lost, its instance reclaimed), the
    broker records the attempt COMPLETED instead of running it again: the mark is kept in
    the rank's folder and in the attempt's checkpoint store. Outside the broker it does
    nothing."""
    d = os.environ.get("ONEPOOL_JOB_DIR") or os.environ.get("ONEPOOL_RANK_DIR")  # the job's own folder
    if not d:
        return
    ctx = context()
    if ctx.checkpoint_uri and ctx.attempt is not None:  # outlives the node: see Engine._poll_one
        try:
            ctx.store().mark_done(ctx.attempt, ctx.rank, SystemClock().now())
        except OSError as e:
            print(f"onepool: could not record in the store that this rank is done ({e})", file=sys.stderr)
    tmp = Path(d) / "done.json.tmp"
    tmp.write_text(f'{{"pid": {os.getpid()}}}')
    tmp.replace(Path(d) / "done.json")


def exit_preempted() -> None:
    """Leave after a preemption request, once pending uploads are done (failures are
    reported on stderr); the broker puts the job back in the queue."""
    try:
        wait()
    except (CheckpointError, TimeoutError) as e:
        print(f"onepool: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.exit(EXIT_PREEMPTED)


# -- internals ------------------------------------------------------------------------------
def _worker() -> Uploader:
    if not _uploader:
        _uploader.append(Uploader())
    return _uploader[0]


def _payload(arrays: Mapping[str, np.ndarray] | None,
             files: Mapping[str, Source] | None) -> dict[str, Source]:
    out: dict[str, Source] = {}
    for name, src in (files or {}).items():
        if isinstance(src, str | Path) and Path(src).is_dir():
            for p in sorted(Path(src).rglob("*")):
                if p.is_file():
                    rel = p.relative_to(src).as_posix()
                    out[f"{name}/{rel}" if name else rel] = p
        else:
            out[name] = src
    if arrays:
        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
        out[ARRAYS_FILE] = buf.getvalue()
    return out


def _upload(ctx: Context, store: CheckpointStore, step: int,
            payload: dict[str, Source], started: float | None = None) -> Manifest | None:
    meta = {"job_id": ctx.job_id, "attempt": ctx.attempt, "written_by": ctx.written_by,
            "started": started}
    if ctx.world_size <= 1:
        return store.write(step, payload, now=SystemClock().now(), **meta)  # type: ignore[arg-type]
    store.write_shard(step, ctx.rank, payload)
    if ctx.rank != 0:
        return None
    deadline = time.monotonic() + ctx.grace_s
    while missing := store.missing_shards(step, ctx.world_size):  # no event to wait on
        if time.monotonic() > deadline:
            raise CheckpointError(f"step {step} not committed: rank(s) {missing} wrote no shard "
                                  f"within {ctx.grace_s:g}s")
        time.sleep(SHARD_POLL_S)
    return store.commit(step, store.gather_shards(step, ctx.world_size), now=SystemClock().now(),
                        world_size=ctx.world_size, **meta)  # type: ignore[arg-type]


def _mark(store: CheckpointStore, attempt: int, step: int, total: int | None, first_step: int,
          first_time: float) -> None:
    try:
        store.mark_progress(attempt, step, SystemClock().now(), total=total, first_step=first_step,
                            first_time=first_time)
    except OSError as e:
        print(f"onepool: could not record progress ({e})", file=sys.stderr)


def _in_shard(m: Manifest, rank: int, name: str) -> str:
    return f"{shard_dir(rank)}/{name}" if m.world_size > 1 else name


if os.environ.get("ONEPOOL_JOB_ID"):
    install()
