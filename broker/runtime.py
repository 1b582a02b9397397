"""What a running job imports: resume, save, and "you are being preempted".

The broker starts every attempt with this environment contract:

    ONEPOOL_JOB_ID, ONEPOOL_ATTEMPT (1, 2, ...), ONEPOOL_ATTEMPT_ID
    ONEPOOL_RANK, ONEPOOL_WORLD_SIZE             (gang jobs: one process per node)
    ONEPOOL_CHECKPOINT_URI                       the job's checkpoint prefix (fsspec URI)
    ONEPOOL_RESTORE_STEP                         the step the broker verified for resume, if any
    ONEPOOL_GRACE_S                              seconds between SIGTERM and SIGKILL
    ONEPOOL_CHECKPOINT_INTERVAL_S                the job's checkpoint interval hint
    ONEPOOL_POOL, ONEPOOL_PROVIDER, ONEPOOL_REGION
    CUDA_VISIBLE_DEVICES                         the GPU slots granted on this node

Typical use::

    from broker import runtime
    ck = runtime.restore()                 # None on a fresh start
    step = ck.step + 1 if ck else 0
    while step < total:
        ...train...
        if runtime.preempted() or runtime.due():
            runtime.save(step, arrays={"w": w})
        if runtime.preempted():
            runtime.exit_preempted()       # the broker requeues the job
        step += 1

Exit 0 means "done"; a non-zero exit after SIGTERM means "preempted, requeue me"; a non-zero
exit otherwise means the job failed.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from broker.checkpoints import CheckpointStore, Manifest
from broker.clock import SystemClock

EXIT_PREEMPTED = 143  # 128 + SIGTERM, as a shell reports a process ended by SIGTERM
ARRAYS_FILE = "arrays.npz"


@dataclass
class Restored:
    """A checkpoint loaded for resume. `arrays` holds what save(arrays=...) stored."""

    step: int
    manifest: Manifest
    store: CheckpointStore
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def read(self, name: str) -> bytes:
        """The bytes of one file of this checkpoint."""
        return self.store.read(self.step, name)


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
_last_save = [time.monotonic()]
_ctx: list[Context] = []


def _on_sigterm(signum: int, frame: object) -> None:
    _preempted.set()


def install() -> None:
    """Make SIGTERM set the preempted flag instead of killing the process (idempotent).

    Called on import when running under the broker; call it yourself otherwise.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def context() -> Context:
    if not _ctx:
        _ctx.append(Context.from_env())
    return _ctx[0]


def preempted() -> bool:
    """True once the broker asked this attempt to stop (SIGTERM): save and exit soon."""
    return _preempted.is_set()


def due() -> bool:
    """True when the checkpoint interval hint has passed since the last save (or start)."""
    return time.monotonic() - _last_save[0] >= context().checkpoint_interval_s


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
    if ARRAYS_FILE in m.files:
        with np.load(io.BytesIO(store.read(m.step, ARRAYS_FILE)), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return Restored(step=m.step, manifest=m, store=store, arrays=arrays, skipped=skipped)


def save(
    step: int,
    arrays: Mapping[str, np.ndarray] | None = None,
    files: Mapping[str, bytes | str | Path] | None = None,
) -> Manifest | None:
    """Write a checkpoint for `step`: numpy arrays (as arrays.npz) and/or files (bytes or local
    paths), then commit its manifest. Only rank 0 writes; other ranks get None.

    Raises CheckpointError if nothing is given or the step is already committed.
    """
    ctx = context()
    if ctx.rank != 0:
        return None
    payload: dict[str, bytes | str | Path] = dict(files or {})
    if arrays:
        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
        payload[ARRAYS_FILE] = buf.getvalue()
    m = ctx.store().write(step, payload, job_id=ctx.job_id, attempt=ctx.attempt,
                          written_by=ctx.written_by, now=SystemClock().now())
    _last_save[0] = time.monotonic()
    return m


def exit_preempted() -> None:
    """Leave after a preemption request; the broker puts the job back in the queue."""
    sys.stdout.flush()
    sys.exit(EXIT_PREEMPTED)


if os.environ.get("ONEPOOL_JOB_ID"):
    install()
