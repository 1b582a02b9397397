"""The chaos suite's fault kinds: name -> (weight, action). An action returns True if it did
something. Kills are counted by the actions themselves (Chaos.kills).

"kill_agent" SIGKILLs a node agent: an on-prem one starts again soon (it adopts its ranks)
or after its node was declared lost (its ranks fenced themselves and its work requeued;
it rejoins empty and kills what the broker gave up on); a rented instance's agent stays
dead (its node goes lost, its instance is terminated and confirmed gone, its work requeues).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.chaos.run import Chaos


def kill_leader(c: Chaos) -> bool:
    """SIGKILL the leader at a random moment (a second broker, if any, takes over)."""
    b = c.leader()
    if b is None:
        return False
    c.kill(b, "leader broker (from outside)")
    return True


def kill_supervisor(c: Chaos) -> bool:
    """SIGKILL one job supervisor; the job process it leaves must not outlive its attempt."""
    sups = c.supervisors()
    if not sups:
        return False
    p = c.rng.choice(sups)
    try:
        p.send_signal(signal.SIGKILL)
    except Exception:  # noqa: BLE001  (it ended meanwhile: no kill happened)
        return False
    c.kills["job supervisor"] += 1
    return True


def standby(c: Chaos) -> bool:
    """Start a second broker: it must stand by while the leader lives."""
    c.reap()
    if len(c.brokers) >= 2:
        return False
    c.start_broker(c.arm())
    return True


def pause_leader(c: Chaos) -> bool:
    """SIGSTOP the leader past its lease (a standby takes over), then wake it up: the stale
    leader must not act."""
    from tests.chaos.run import LEASE_S

    b = c.leader()
    if b is None or len(c.brokers) < 2:
        return standby(c)
    b.paused = True
    c.route()  # the load balancer's health check fails for it
    b.proc.send_signal(signal.SIGSTOP)
    time.sleep(LEASE_S + c.rng.uniform(1.0, 2.5))
    b.proc.send_signal(signal.SIGCONT)
    b.paused = False
    c.route()
    return True


def kill_agent(c: Chaos) -> bool:
    """SIGKILL one node agent (its ranks keep running). An on-prem agent comes back either
    before its ranks fence themselves (it adopts them) or after its node was declared lost;
    a rented instance's agent does not come back."""
    from tests.chaos.nodes import rented_agents
    from tests.chaos.run import NODE_LOST_S

    onprem, rented = c.hosts.live(), rented_agents(c.booter)
    if not onprem and not rented:
        return False
    if rented and (not onprem or c.rng.random() < 0.3):
        try:
            c.booter.kill_agent(c.rng.choice(rented))
        except (KeyError, ProcessLookupError):  # the instance went meanwhile: no kill happened
            return False
        c.kills["node agent (rented)"] += 1
        return True
    back = (c.rng.uniform(0.5, NODE_LOST_S / 3) if c.rng.random() < 0.6
            else c.rng.uniform(NODE_LOST_S + 2, NODE_LOST_S + 15))
    c.hosts.kill(c.rng.choice(onprem), back)
    c.kills["node agent (on-prem)"] += 1
    return True


def cloud_fault(c: Chaos) -> bool:
    """One burst of one cloud fault (see tests/chaos/proxy.py)."""
    from tests.chaos.run import CHEAP

    kind = c.rng.choice(["capacity", "throttle", "error5xx", "timeout", "hide"])
    with c.faults.lock:
        if kind == "capacity":
            c.faults.capacity_types.add(CHEAP)
            threading.Timer(c.rng.uniform(5, 20), lambda: c.faults.capacity_types.discard(CHEAP)).start()
        else:
            setattr(c.faults, kind, getattr(c.faults, kind) + c.rng.randint(1, 6))
    return True


def _notice(instance_id: str) -> str:
    return json.dumps({"version": "0", "source": "aws.ec2", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "detail-type": "EC2 Spot Instance Interruption Warning",
                       "detail": {"instance-id": instance_id, "instance-action": "terminate"}})


def spot_notice(c: Chaos) -> bool:
    """A spot interruption warning, then the reclaim a few seconds later."""
    live = c.instances(("running",))
    if not live:
        return False
    iid = c.rng.choice(live)["InstanceId"]
    c.sqs.send_message(QueueUrl=c.queue, MessageBody=_notice(iid))
    threading.Timer(c.rng.uniform(2, 5), lambda: c.ec2.terminate_instances(InstanceIds=[iid])).start()
    return True


def lost_notice(c: Chaos) -> bool:
    """A reclaim whose notice never arrived (a lost SQS message)."""
    live = c.instances(("running",))
    if not live:
        return False
    c.ec2.terminate_instances(InstanceIds=[c.rng.choice(live)["InstanceId"]])
    return True


def submit(c: Chaos) -> bool:
    c.submit(c.rng.randint(1, 3))
    return True


def urgent(c: Chaos) -> bool:
    """Urgent work: preemptions (grace, checkpoint, requeue) under fire."""
    c.submit(1, priority="urgent")
    return True


FAULTS: dict[str, tuple[float, Callable[[Chaos], bool]]] = {
    "kill_leader": (1.0, kill_leader),
    "kill_supervisor": (1.5, kill_supervisor),
    "kill_agent": (1.0, kill_agent),
    "standby": (1.0, standby),
    "pause_leader": (0.5, pause_leader),
    "cloud_fault": (2.0, cloud_fault),
    "spot_notice": (1.0, spot_notice),
    "lost_notice": (0.5, lost_notice),
    "submit": (1.0, submit),
    "urgent": (0.7, urgent),
}
