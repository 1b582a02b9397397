"""The states of jobs, attempts, nodes and checkpoints (plain enums, no database import: the
fast read path of `onepool status` and the views use them without loading SQLAlchemy).
broker.state.model re-exports them."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Its budget is spent: it took a final checkpoint and stopped. Not final: raising the
    # budget (`onepool budget set JOB AMOUNT`) puts it back in the queue (issue 6).
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"

    @property
    def final(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class AttemptState(StrEnum):
    LAUNCHING = "LAUNCHING"  # row written, processes may or may not have started
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # signalled; killed after the grace period
    ENDED = "ENDED"


class EndReason(StrEnum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"  # the processes vanished without an exit status (node failure, reboot)
    INTERRUPTED = "INTERRUPTED"  # the provider reclaimed the node after a notice (spot)
    BUDGET = "BUDGET"  # stopped because the job's or its team's budget is spent (issue 6)
    REBALANCED = "REBALANCED"  # stopped at a checkpoint to move to cheaper capacity (issue 12)


class NodeState(StrEnum):
    LAUNCHING = "launching"  # row (and its token) written; the instance may or may not exist yet
    UP = "up"
    DRAINING = "draining"  # an interruption notice came: nothing new lands, it goes when empty
    TERMINATING = "terminating"  # decided; the provider call may or may not have happened
    TERMINATED = "terminated"
    RETIRED = "retired"  # a static node dropped from the config
    WAITING = "waiting"  # an agent-served on-prem node whose agent has not joined yet
    LOST = "lost"  # an agent-served on-prem node whose agent stopped calling in (it may return)
    # A Slurm node that is drained, down, not responding or out of the partition (it may
    # return): nothing new lands; work already there runs on and is still charged.
    UNAVAILABLE = "unavailable"


class CheckpointState(StrEnum):
    COMMITTED = "committed"
    PARTIAL = "partial"  # a step folder without a manifest (so far)
    DAMAGED = "damaged"  # committed, but its files failed verification
    DELETED = "deleted"  # removed by retention (it did exist, committed)
    ABANDONED = "abandoned"  # a partial folder removed by retention
