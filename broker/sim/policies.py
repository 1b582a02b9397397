"""The compared policies: each a named configuration of the one policy, not another scheduler.

- partitioned: on-prem capacity split into fixed partitions (one per team, by weight); FIFO
  with backfill inside each; no preemption; no cloud.
- fifo: one pool, FIFO with backfill, no preemption, no cloud.
- naive-preempt: one pool, priority classes, preemption of the youngest victims at once, with
  no regard to checkpoints and no minimum run time, one EASY reservation, no aging; no cloud.
- onepool-onprem: the full policy (checkpoint-aware victims, anti-capture, fair share,
  minimum run time, patience and checkpoint alignment before preempting for normal work,
  aging of low work, no reservations: the product's defaults) on the same on-prem capacity:
  the fair comparison.
- onepool: the same plus the scenario's cloud pools (spot routing, preempt-or-buy).

Baselines at their strongest: fifo runs twice, with no reservations and with EASY
reservations, and reports whichever gives low-priority work the lower p95 completion time
(STRONGEST). partitioned runs without reservations: with EASY its low-class p95 completion was
worse on the shared trace (16.2 d against 10.6 d at 1,200 GPUs), and a second replay would
double one of the benchmark's longest runs. Who checkpoints on the signal is a
property of the workload (the scenario's `checkpoint_on_signal`), the same for every policy.

Every config is PolicyConfig.from_settings(scenario, **overrides): the scenario's knobs
(grace, minimum run time, reservations, ...) reach every policy the same way the live
broker's onepool.yaml reaches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.errors import SpecError
from broker.policy import PolicyConfig
from broker.spec import PolicySettings


@dataclass(frozen=True)
class SimPolicy:
    name: str
    config: PolicyConfig
    partitioned: bool = False
    variant: str = ""  # for a baseline run in several configurations: which one this is


_FIFO = dict(classes=False, fair_share=False, anti_capture=False, preemption=False, cloud=False)
BASE: dict[str, tuple[dict[str, Any], bool]] = {
    "partitioned": ({**_FIFO, "reservations": 0}, True),
    "fifo": (_FIFO, False),
    "naive-preempt": (dict(fair_share=False, anti_capture=False, victim_order="youngest",
                           min_run_s=0.0, preempt_after_s=0.0, checkpoint_align_s=0.0,
                           preemptible_backfill=False, cloud=False, reservations=1,
                           promote_after_s=None), False),
    "onepool-onprem": (dict(cloud=False), False),
    "onepool": ({}, False),
}
NAMES = list(BASE)
# Baselines tried in several configurations; the one with the lower low-class p95 completion
# time is reported (the other is kept under "alternatives").
STRONGEST: dict[str, dict[str, dict[str, Any]]] = {
    "fifo": {"no reservations": {"reservations": 0}, "easy": {"reservations": 1}},
}


def resolve(names: list[str], settings: PolicySettings,
            overrides: dict[str, dict[str, Any]] | None = None,
            variants: dict[str, dict[str, Any]] | None = None,
            strongest: bool = False) -> list[SimPolicy]:
    """The named policies for these settings (a Scenario), with per-policy `overrides`.

    `variants` defines extra names: {"name": {"base": one of NAMES, **PolicyConfig fields}}.
    With `strongest`, a baseline listed in STRONGEST yields one SimPolicy per configuration
    (same name, `variant` set). Raises SpecError for an unknown name or an unknown/invalid
    override field.
    """
    overrides = overrides or {}
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
        tries = STRONGEST.get(n, {}) if strongest and n not in variants and not extra else {}
        for label, more in (tries or {"": {}}).items():
            cfg = PolicyConfig.from_settings(settings, f"policy.{n}", **{**kw, **extra, **more})
            out.append(SimPolicy(n, cfg, partitioned, label))
    return out
