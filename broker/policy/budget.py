"""Team budgets as the policy sees them. Pure: the spend is measured elsewhere (the ledger, or
the simulator's bill); these rules say what it means for scheduling.

- A team without an amount has state "none"; one that spent it all is "exhausted"; one with
  less than `low_fraction` of the amount left is "low"; otherwise "ok".
- restrict(): a LOW team's pending jobs are spot-only and its high/urgent allowance is 0; an
  EXHAUSTED team's pending jobs are hidden from the plan (and its allowance is 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from broker.policy.snapshot import Snapshot
from broker.spec import SpotPolicy

STATES = ("none", "ok", "low", "exhausted")


def team_budget_state(amount: float | None, spent: float, low_fraction: float) -> str:
    """One of STATES for a team that spent `spent` of `amount` (None: no budget)."""
    if amount is None:
        return "none"
    if spent >= amount:
        return "exhausted"
    if amount - spent < low_fraction * amount:
        return "low"
    return "ok"


def restrict(snap: Snapshot, states: Mapping[str, str]) -> Snapshot:
    """The snapshot the policy sees under team budget states (team -> one of STATES)."""
    if not any(v in ("low", "exhausted") for v in states.values()):
        return snap
    pending = tuple(
        dataclasses.replace(p, spot=SpotPolicy.ONLY) if states.get(p.team) == "low" else p
        for p in snap.pending if states.get(p.team) != "exhausted")
    teams = tuple(dataclasses.replace(t, priority_allowance_gpus=0)
                  if states.get(t.name) in ("low", "exhausted") else t for t in snap.teams)
    return dataclasses.replace(snap, pending=pending, teams=teams, queue=None)
