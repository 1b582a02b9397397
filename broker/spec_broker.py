"""The `broker:` section of onepool.yaml (broker.spec.ClusterConfig.broker): the scheduling
policy's settings, the leader's periodic task intervals and rebalancing."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from broker.output_log import DEFAULT_CAP
from broker.spec_types import _Strict


class RebalanceSettings(_Strict):
    """Scheduled rebalancing (issue 12; the rules: broker.policy.rebalance and .defrag).

    Every `broker.tasks.rebalance_s` the leader looks for moves that pay for themselves: a
    move must save at least `min_saving_usd` beyond its cost, at most `max_moves` start per
    round, and a move whose checkpoint is not committed `checkpoint_wait_s` after the request
    is given up (the job keeps running where it is). Gang jobs waiting `defrag_after_s` may
    have small jobs moved for them. `enabled: false` turns both off (`onepool rebalance
    --dry-run` still shows what it would do)."""

    enabled: bool = True
    min_saving_usd: float = Field(default=1.0, ge=0.0)
    max_moves: int = Field(default=4, ge=0, le=1000)
    checkpoint_wait_s: float = Field(default=600.0, gt=0.0, le=86400.0)
    defrag_after_s: float = Field(default=1800.0, ge=0.0)


class TaskIntervals(_Strict):
    """How often the leader runs each periodic task, in seconds (`broker.tasks:` in
    onepool.yaml; broker.control.scheduled runs them on APScheduler). Defaults by what a late
    run costs:

    - enforce_budgets_s (30): a job or team over its budget keeps spending until the next
      run; 30 s of an 8-GPU on-demand node is well under a dollar.
    - scale_down_s (30): an idle rented node is given back up to this long after its pool's
      idle_timeout_s (default 600 s): at most 5% more idle time, billed by the second.
    - rebalance_s (300): a move pays only over hours of remaining run time; minutes of delay
      change little, and each round plans the whole cluster.
    - sweep_orphans_s (300): a leaked instance is rare (a crash between a launch and its
      answer) and each sweep lists every pool's instances.
    - decay_fair_share_s (300): usage halves over fair_share_half_life_s (days); between
      runs it is carried forward at the teams' current GPU counts (broker.control.snapshots).
    - refresh_prices_s (900): spot prices move over hours; the clouds' price APIs are paged
      and throttled.
    - retain_checkpoints_s (3600): deleting old checkpoints frees storage, which is billed
      by the month; checkpoint_delete_delay_s (default 1 h) already delays every deletion.
    """

    refresh_prices_s: float = Field(default=900.0, ge=1.0, le=86400.0)
    rebalance_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    scale_down_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    sweep_orphans_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    enforce_budgets_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    decay_fair_share_s: float = Field(default=300.0, ge=1.0, le=86400.0)
    retain_checkpoints_s: float = Field(default=3600.0, ge=1.0, le=86400.0)


class ApiSettings(_Strict):
    """`broker.api:` what `onepool server` accepts before doing any work for a request
    (broker.api.guard; re-read from the applied config every few seconds).

    - max_body_bytes: a request body larger than this (job specs, configs, agents' syncs) is
      answered 413 before it is parsed or its token checked (default 1 MiB: a job spec is
      small; code and data reach nodes through object storage)
    - max_log_upload_bytes: the same for agents' log uploads (a piece is at most 512 KiB of
      output, base64 in JSON: about 700 KB)
    - max_code_upload_bytes: the same for code snapshots (PUT /v1/code/SHA256, issue 26;
      default 256 MiB, above the 200 MiB of files a client packs)
    - auth_failure_burst, auth_failures_per_s: each client address may fail authentication
      (answers 401) `auth_failure_burst` times at once, then `auth_failures_per_s` times a
      second; beyond that every request from it is answered 429 with Retry-After, before its
      body is read or its token checked, unless its credential passed lately. Other addresses
      are not affected. Addresses are the TCP peer's (X-Forwarded-For is honoured only
      from the proxies listed in FORWARDED_ALLOW_IPS: by default from none)
    - agent_threads: threads reserved for the agent routes (user routes share the server's
      own pool of 40), so a flood of user requests cannot delay agents' heartbeats
    """

    max_body_bytes: int = Field(default=1024 * 1024, ge=4096, le=1024 ** 3)
    max_log_upload_bytes: int = Field(default=3 * 1024 * 1024, ge=1024 * 1024, le=1024 ** 3)
    max_code_upload_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024, le=16 * 1024 ** 3)
    auth_failure_burst: int = Field(default=20, ge=1, le=1_000_000)
    auth_failures_per_s: float = Field(default=1.0, gt=0.0, le=1_000_000.0)
    agent_threads: int = Field(default=8, ge=1, le=256)


# Older spellings of task intervals, still accepted: (where it was, its `tasks` field).
LEGACY_TASK_KEYS = (("price_refresh_s", "refresh_prices_s"), ("orphan_sweep_s", "sweep_orphans_s"),
                    ("rebalance.interval_s", "rebalance_s"))


def _legacy_task_keys(data: Any) -> Any:
    """Move `broker.price_refresh_s`, `broker.orphan_sweep_s` and `broker.rebalance.interval_s`
    (the spellings before `broker.tasks`) to their `tasks` fields. Raises ValueError naming
    both when one is given both ways."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    tasks = data.get("tasks", {})
    if not isinstance(tasks, dict):
        return data  # the field's own validation says what is wrong
    tasks = dict(tasks)
    for old, new in LEGACY_TASK_KEYS:
        outer, _, inner = old.rpartition(".")
        holder = data
        if outer:
            if not isinstance(data.get(outer), dict) or inner not in data[outer]:
                continue
            holder = data[outer] = dict(data[outer])
        if inner not in holder:
            continue
        if new in tasks:
            raise ValueError(f"tasks.{new}: also given as {old} (its older name); keep only "
                             f"tasks.{new}")
        tasks[new] = holder.pop(inner)
    if tasks:
        data["tasks"] = tasks
    return data


class PolicySettings(_Strict):
    """The scheduling policy's knobs, written once: onepool.yaml's `broker:` section and a
    simulation scenario both hold them, and `broker.policy.PolicyConfig.from_settings` turns
    either into the policy's configuration. Times in seconds.

    - grace_s: SIGTERM -> this long to checkpoint and exit -> SIGKILL
    - min_run_s: a job preempted before is safe from preemption this long after it restarts
    - cloud_after_wait_s: non-urgent jobs wait this long before nodes are rented for them
    - restart_overhead_s: what a resumed attempt spends before it makes progress (assumed)
    - checkpoint_on_signal: the share of jobs that save a checkpoint when signalled (the rest
      lose the work since their last periodic checkpoint); the policy's loss estimates use it
    - fair_share_half_life_s: how fast past usage is forgotten in the fair-share order
    - reservations: how many blocked jobs (in queue order) get a reservation; a reservation
      holds GPUs only against jobs that would not finish before its estimated start (EASY).
      Default 0: held GPUs idle on the estimates' errors, and aging bounds starvation instead
      (bench/results/sweep.*: at both capacities of the shared trace, no reservations with
      aging and oldest gangs first gave low work 0.2-0.4x the p95 completion time of one
      reservation without, and multi-node jobs 0.78-1.26x its p99 wait)
    - promote_after_s: aging; a low job waiting this long since submission is scheduled as
      normal (nothing ages into high or urgent), and keeps that class as a possible victim
      while the attempt it then starts runs; aging grants no right to preempt or to rent on
      demand (an aged low job preempts nothing). Default 6 h; None: off
    - promote_gangs_only: age only multi-node jobs (false: every low job ages)
    - oldest_gangs_first: with aging on, multi-node jobs that have waited promote_after_s
      are walked first in their class, oldest first whatever their team (fair share orders
      the rest). A gang needs whole nodes at once; behind lighter teams' work it only ever
      sees them taken piecemeal, so fair share alone starves heavier teams' gangs
    - preempt_after_s: a job below high preempts only once it has waited this long since it
      was submitted (most find capacity meanwhile; high/urgent preempt at once); 0: at once
    - checkpoint_align_s: a job below high waits up to this long for its victims' next
      periodic checkpoints, when they would otherwise lose unsaved work; 0: never
    """

    grace_s: float = Field(default=60.0, ge=0.0, le=3600)
    min_run_s: float = Field(default=300.0, ge=0.0)
    cloud_after_wait_s: float = Field(default=600.0, ge=0.0)
    restart_overhead_s: float = Field(default=180.0, ge=0.0)
    checkpoint_on_signal: float = Field(default=0.5, ge=0.0, le=1.0)
    fair_share_half_life_s: float = Field(default=7 * 86400.0, gt=0.0)
    reservations: int = Field(default=0, ge=0, le=10_000)
    promote_after_s: float | None = Field(default=21600.0, gt=0.0)
    promote_gangs_only: bool = False
    oldest_gangs_first: bool = True
    preempt_after_s: float = Field(default=900.0, ge=0.0)
    checkpoint_align_s: float = Field(default=900.0, ge=0.0)


class BrokerSettings(PolicySettings):
    """Knobs of the live broker (the policy's are inherited from PolicySettings). Times in
    seconds."""

    cycle_s: float = Field(default=2.0, gt=0.0, le=3600)
    checkpoint_store: str | None = None  # default: file://$ONEPOOL_HOME/checkpoints
    keep_checkpoints: int = Field(default=3, ge=1)  # newest committed checkpoints kept per job
    # Retention waits this long before deleting a checkpoint that fell out of the newest
    # `keep_checkpoints`, or a step folder that has had no manifest (an abandoned upload).
    checkpoint_delete_delay_s: float = Field(default=3600.0, ge=0.0)
    # Money (issue 6): who pays for idle rented node time ("pool": nobody's jobs; "launcher":
    # the team whose job triggered the launch), and what a submission whose estimate exceeds
    # its budget gets ("spot_only": queued spot-only if a spot pool fits the budget, else refused).
    idle_charged_to: Literal["pool", "launcher"] = "pool"
    over_budget_submission: Literal["refuse", "spot_only"] = "spot_only"
    # One leader (issue 10): the leader renews its lease every cycle and at least every
    # lease_s / 3; a standby takes over lease_s after the leader's last renewal (at once when
    # the dead leader ran on the same host). Kubernetes' leader election uses 15 s too.
    lease_s: float = Field(default=15.0, ge=1.0, le=3600)
    # Agents (issue 9). The URL at which agents on rented instances reach `onepool server`
    # (required when a pool rents nodes); a node whose agent has not been heard from for
    # `node_lost_after_s` is lost (its attempts requeue; a rented instance is terminated);
    # agents call in at least every `agent_heartbeat_s`. `agent_package` is the pip
    # requirement the boot script installs when the image has no `onepool` command (with the
    # server extra, which the agent needs: "onepool[server,cloud] @ https://.../onepool.whl").
    server_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    # The three agent times and what each protects against: broker.control.agents.Timing and
    # the README's "Staying up" (a rank fences itself at 2/3 of node_lost_after_s).
    node_lost_after_s: float = Field(default=240.0, ge=3.0, le=3600.0)
    agent_heartbeat_s: float = Field(default=5.0, ge=0.5, le=600.0)
    agent_package: str | None = Field(default=None, min_length=1, max_length=500)
    # Job output (broker.output_log): each attempt keeps at most this many bytes of output,
    # shared by its ranks; the tail is kept, the rest counted as dropped (`onepool logs`
    # says how much). Bounds what jobs can write to the disk that holds the database.
    output_cap_bytes: int = Field(default=DEFAULT_CAP, ge=64 * 1024, le=1 << 40)
    # A job whose rank could not start (providers.start_errors) goes back to the queue to run
    # on another node while the cause may be the node's (a missing working directory), and
    # fails after this many start failures; a cause only the job can have (an exec format
    # error of its own script) fails it at once. Preemptions and lost nodes do not count.
    max_start_failures: int = Field(default=3, ge=1, le=100)
    # Periodic tasks (issue 12; broker.control.scheduled, run by the leader on APScheduler
    # with its job store in this database): refresh prices, rebalance (as `rebalance` says),
    # scale down idle rented nodes, sweep orphan instances (tagged with this broker, claimed
    # by no live node), enforce budgets, decay fair-share usage, checkpoint retention, each
    # every `tasks.<name>_s`. A task that fails is logged and runs again at its next time.
    tasks: TaskIntervals = TaskIntervals()
    rebalance: RebalanceSettings = RebalanceSettings()
    api: ApiSettings = ApiSettings()

    @model_validator(mode="before")
    @classmethod
    def _older_task_keys(cls, data: Any) -> Any:
        return _legacy_task_keys(data)

    @model_validator(mode="after")
    def _agent_timing(self) -> BrokerSettings:
        if self.agent_heartbeat_s * 3 > self.node_lost_after_s:
            raise ValueError(f"node_lost_after_s: must be at least 3 x agent_heartbeat_s "
                             f"({3 * self.agent_heartbeat_s:g}s), so one slow heartbeat does not "
                             f"lose a node (got {self.node_lost_after_s:g})")
        return self

    @field_validator("checkpoint_store")
    @classmethod
    def _store_uri(cls, v: str | None) -> str | None:
        return None if v is None else store_uri(v)


def store_uri(v: str) -> str:
    """A checkpoint store root URI, without a trailing slash. Raises ValueError if it has no scheme."""
    v = v.strip().rstrip("/")
    if not re.match(r"^[a-z][a-z0-9+.-]*://.+", v):
        raise ValueError(f"must be a URI like file:///data/ckpt, s3://bucket/prefix or "
                         f"gs://bucket/prefix (got {v!r})")
    return v
