"""The pure scheduling policy: plan(snapshot) -> Plan. See plan.py for the cycle's steps."""

from broker.policy.fairshare import decayed_gpu_seconds
from broker.policy.plan import plan
from broker.policy.snapshot import (
    Alloc,
    Launch,
    NodeView,
    PendingView,
    Placement,
    Plan,
    PolicyConfig,
    PoolView,
    Preemption,
    RunningView,
    Snapshot,
    TeamView,
)

__all__ = [
    "Alloc", "Launch", "NodeView", "PendingView", "Placement", "Plan", "PolicyConfig", "PoolView",
    "Preemption", "RunningView", "Snapshot", "TeamView", "decayed_gpu_seconds", "plan",
]
