"""The compared policies: each a named configuration of the one policy, not another scheduler.

- partitioned: on-prem capacity split into fixed partitions (one per team, by weight); FIFO
  with backfill inside each; no preemption; no cloud.
- fifo: one pool, FIFO with backfill, no preemption, no cloud.
- naive-preempt: one pool, priority classes, preemption of the youngest victims with no
  regard to checkpoints (and victims that do not checkpoint on the signal); no cloud.
- onepool-onprem: the full policy (checkpoint-aware victims, anti-capture, fair share,
  minimum run time, checkpoint on signal) on the same on-prem capacity: the fair comparison.
- onepool: the same plus the scenario's cloud pools (spot routing, preempt-or-buy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from broker.errors import SpecError
from broker.policy import PolicyConfig


@dataclass(frozen=True)
class SimPolicy:
    name: str
    config: PolicyConfig
    partitioned: bool = False


_FIFO = dict(classes=False, fair_share=False, anti_capture=False, preemption=False, cloud=False)
BASE: dict[str, tuple[dict[str, Any], bool]] = {
    "partitioned": (_FIFO, True),
    "fifo": (_FIFO, False),
    "naive-preempt": (dict(fair_share=False, anti_capture=False, victim_order="youngest",
                           min_run_s=0.0, checkpoint_on_signal=False, cloud=False), False),
    "onepool-onprem": (dict(cloud=False), False),
    "onepool": ({}, False),
}
NAMES = list(BASE)


def resolve(names: list[str], grace_s: float, restart_overhead_s: float,
            overrides: dict[str, dict[str, Any]],
            variants: dict[str, dict[str, Any]] | None = None) -> list[SimPolicy]:
    """The named policies, with the scenario's grace, restart overhead and overrides.

    `variants` defines extra names: {"name": {"base": one of NAMES, **PolicyConfig fields}}.
    Raises SpecError for an unknown name or an unknown/invalid override field.
    """
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    variants = variants or {}
    out = []
    for n in names:
        if n in variants:
            v = dict(variants[n])
            base = v.pop("base", None)
            if base not in BASE:
                raise SpecError("variants", [f"{n}.base: must be one of {', '.join(NAMES)}"])
            kw, partitioned = BASE[base]
            extra = {**overrides.get(base, {}), **v}
        elif n not in BASE:
            raise SpecError("--policies", [f"{n!r} is not a policy; allowed: {', '.join(NAMES)}"])
        else:
            kw, partitioned = BASE[n]
            extra = overrides.get(n, {})
        bad = sorted(set(extra) - fields)
        if bad:
            raise SpecError("scenario", [f"policy.{n}.{b}: unknown PolicyConfig field; allowed: "
                                         f"{', '.join(sorted(fields))}" for b in bad])
        cfg = PolicyConfig(**{"grace_s": grace_s, "restart_overhead_s": restart_overhead_s,
                              **kw, **extra})
        out.append(SimPolicy(n, cfg, partitioned))
    return out
