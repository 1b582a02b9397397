"""Choose, fetch and verify the checkpoint an attempt resumes from, before it starts.

`fetch_restore_point` looks at every store that holds the job's checkpoints, takes the
newest committed step (on a tie, the copy already in the target store), and makes sure an
intact copy of it is in the target store (the store of the pool the attempt will run in):

- already there: verify every file's checksum;
- elsewhere: copy it (broker.checkpoint.transfer: server-side or streamed, retried, verified) and
  price the bytes that crossed with the per-provider egress rates in pricing/;
- damaged (or its copy fails): fall back to the next older committed step, and say so.

It returns what happened as data (the step, bytes, egress and the events to record); the
engine writes it to the database. Unreachable stores are skipped with an event, never
raised: a job whose checkpoints cannot be reached starts from the newest one that can.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.checkpoint.checkpoints import CheckpointStore, Manifest, store_root_of
from broker.checkpoint.transfer import CopyFailed, CopyResult, SourceDamaged, copy_checkpoint
from broker.errors import CheckpointError
from pricing.egress import Location, egress_usd

EventSpec = tuple[str, str, dict[str, Any]]
"""(kind, message, data) of an event to record."""


@dataclass
class RestorePoint:
    step: int | None = None
    manifest: Manifest | None = None  # in the target store
    bytes: int = 0  # size of the checkpoint resumed from
    egress_bytes: int = 0
    egress_usd: float = 0.0
    copy: CopyResult | None = None
    source: str | None = None  # the step folder it was copied from, if copied
    damaged: list[tuple[str, int]] = field(default_factory=list)  # (store root, step)
    events: list[EventSpec] = field(default_factory=list)


@dataclass(frozen=True)
class _Candidate:
    step: int
    in_target: bool
    prefix: str
    manifest: Manifest


def fetch_restore_point(prefixes: list[str], target: str, *, now: float,
                        locate: Callable[[str], Location]) -> RestorePoint:
    """Make the newest intact checkpoint among `prefixes` available at `target` (a job prefix).

    `locate` maps a store root URI to its provider and region, for egress prices.
    """
    out = RestorePoint()
    stores = {p: CheckpointStore(p) for p in dict.fromkeys([target, *prefixes])}
    candidates: list[_Candidate] = []
    for p, st in stores.items():
        try:
            candidates += [_Candidate(m.step, p == target, p, m) for m in st.committed()]
        except OSError as e:
            out.events.append(("checkpoint_store_unreachable",
                               f"cannot list checkpoints at {p} ({e}); skipping that store",
                               {"store": store_root_of(p)}))
    candidates.sort(key=lambda c: (-c.step, not c.in_target))
    skipped: list[str] = []
    for c in candidates:
        if c.in_target:
            problems = _verify(stores[target], c.manifest)
            if problems:
                _damaged(out, skipped, c, "; ".join(problems))
                continue
            out.step, out.manifest, out.bytes = c.step, c.manifest, c.manifest.bytes
            break
        try:
            res = copy_checkpoint(stores[c.prefix], c.manifest, stores[target], now=now)
        except SourceDamaged as e:
            _damaged(out, skipped, c, str(e))
            continue
        except CopyFailed as e:
            skipped.append(f"step {c.step} at {c.prefix} could not be copied ({e})")
            out.events.append(("checkpoint_copy_failed", str(e), {"step": c.step,
                                                                   "from": c.prefix, "to": target}))
            continue
        src_root, dst_root = store_root_of(c.prefix), store_root_of(target)
        usd = egress_usd(res.bytes, locate(src_root), locate(dst_root))
        out.step, out.manifest, out.bytes = c.step, res.manifest, res.manifest.bytes
        out.egress_bytes, out.egress_usd, out.copy, out.source = res.bytes, usd, res, c.manifest.uri
        how = "server-side" if res.server_side else "streamed"
        out.events.append(("checkpoint_copied",
                           f"copied step {c.step} ({res.bytes} bytes, {how}) from {src_root} to "
                           f"{dst_root}: egress ${usd:.6f}",
                           {"step": c.step, "from": src_root, "to": dst_root, "bytes": res.bytes,
                            "egress_usd": usd, "server_side": res.server_side}))
        break
    if skipped:
        where = f"resuming from step {out.step}" if out.step is not None else "starting from scratch"
        out.events.append(("checkpoint_fallback", f"{'; '.join(skipped)}: {where} instead",
                           {"resumed_step": out.step, "skipped": skipped}))
    return out


def _verify(st: CheckpointStore, m: Manifest) -> list[str]:
    try:
        return st.verify(m)
    except (OSError, CheckpointError) as e:
        return [f"unreadable: {e}"]


def _damaged(out: RestorePoint, skipped: list[str], c: _Candidate, why: str) -> None:
    out.damaged.append((store_root_of(c.prefix), c.step))
    skipped.append(f"step {c.step} at {c.prefix} is damaged ({why})")
    out.events.append(("checkpoint_damaged", f"step {c.step} at {c.prefix} is damaged: {why}",
                       {"step": c.step, "store": store_root_of(c.prefix), "problems": why}))
