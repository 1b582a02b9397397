"""The pure scheduling policy: plan(snapshot) -> Plan, and every rule applied around it.

See plan.py for the cycle's steps; config.py for the one PolicyConfig; queue.py, victims.py,
backfill.py and cloud.py for the parts of the cycle; budget.py, pools.py, fairshare.py,
estimates.py and activity.py for the rules the engine and the simulator apply around plan().
"""

from broker.policy.config import PolicyConfig
from broker.policy.fairshare import decayed_gpu_seconds
from broker.policy.plan import plan
from broker.policy.queue import PendingQueue
from broker.policy.snapshot import (
    Alloc,
    Launch,
    NodeView,
    PendingView,
    Placement,
    Plan,
    PoolView,
    Preemption,
    RunningView,
    Snapshot,
    TeamView,
)

__all__ = [
    "Alloc", "Launch", "NodeView", "PendingQueue", "PendingView", "Placement", "Plan",
    "PolicyConfig", "PoolView", "Preemption", "RunningView", "Snapshot", "TeamView",
    "decayed_gpu_seconds", "plan",
]
