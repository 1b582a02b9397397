"""Tables of who may act and where work runs remotely (issue 9): API tokens, node agents,
rank assignments for agents, and idempotent submits.

Secrets (API tokens, join tokens, agent credentials) are stored only as salted hashes
(HMAC-SHA256, see broker.state.token_hash; rows written before hold argon2 until their first
use); the plaintext is shown once, to whoever created it.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import JSON, Column, Index
from sqlmodel import Field, SQLModel


class Role(StrEnum):
    MEMBER = "member"  # acts within its team only: its own jobs (all the team's without a user)
    LEAD = "lead"  # a team lead: acts on every job of its team
    ADMIN = "admin"  # manages pools, teams, budgets and tokens; sees every team
    METRICS = "metrics"  # reads GET /metrics only (a Prometheus scraper): no other route


class ApiToken(SQLModel, table=True):
    """A bearer token for the HTTP API. `id` is public (it prefixes the token); `hash` is the
    salted hash of the whole token (broker.state.token_hash)."""

    id: str = Field(primary_key=True, max_length=16)
    team: str = Field(max_length=63, index=True)
    user: str | None = Field(default=None, max_length=63)  # the person (None: the whole team)
    role: str = Field(max_length=8)
    hash: str = Field(max_length=200)
    note: str = Field(default="", max_length=200)
    created_at: float
    created_by: str = Field(max_length=120)
    revoked_at: float | None = None
    revoked_by: str | None = Field(default=None, max_length=120)


class NodeAgent(SQLModel, table=True):
    """The agent serving one node: how it joins (a one-time join token), its credential after
    joining, and its heartbeat. One row per node served by an agent."""

    node: str = Field(primary_key=True, max_length=128)
    join_id: str | None = Field(default=None, max_length=16, index=True)
    join_hash: str | None = Field(default=None, max_length=200)
    join_expires_at: float | None = None
    joined_at: float | None = None
    credential_id: str | None = Field(default=None, max_length=16, index=True)
    credential_hash: str | None = Field(default=None, max_length=200)
    seen_at: float | None = None  # last request from the agent (every sync is a heartbeat)
    lost_at: float | None = None  # declared lost: missed heartbeats for node_lost_after_s
    info: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class RankState(StrEnum):
    ASSIGNED = "assigned"  # written by the broker; the agent has not reported it yet
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"  # the node was lost with the rank on it


class RankAssignment(SQLModel, table=True):
    """One rank of an attempt, to be run by the agent of `node`. `signals` is the ordered list
    of [seq, signum] the broker wants delivered; the agent acknowledges up to `acked_seq`."""

    __table_args__ = (Index("ix_rankassignment_attempt_rank", "attempt_id", "rank", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(index=True)
    rank: int
    node: str = Field(max_length=128, index=True)
    argv: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    env: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    state: str = Field(default=RankState.ASSIGNED, max_length=16, index=True)
    pid: int | None = None
    exit_code: int | None = None
    signals: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    acked_seq: int = 0
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    log_bytes: int = 0  # bytes of output the agent has shipped so far
    cause: str | None = Field(default=None, max_length=64)  # start_failed:<kind>: it could not start
    gpu_util_pct: float | None = None  # the agent's newest mean utilization of the rank's GPUs


class IdempotentSubmit(SQLModel, table=True):
    """A submit made with an Idempotency-Key header: a retry returns the same job."""

    __table_args__ = (Index("ix_idempotentsubmit_principal_key", "principal", "key", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    principal: str = Field(max_length=64)
    key: str = Field(max_length=200)
    request_sha256: str = Field(max_length=64)
    job_id: int
    created_at: float
