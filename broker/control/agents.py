"""The broker's side of the node-agent protocol (the API's /v1/agent routes call these) and
the engine's watch over agents.

An agent joins once with a join token and gets a node credential. From then on it calls
sync() in a loop: each call is a heartbeat, reports the state of every rank it runs, and
returns what the agent should do now (ranks to run, signals to deliver, ranks to forget or
kill). The API holds a sync open (long poll) while `has_news` is false.

The engine calls `watch()` every cycle: agents silent for `node_lost_after_s` are lost
(an on-prem node's ranks are LOST, so their attempts requeue; a rented node is handed to the
capacity manager to terminate first). Interruption notices agents report go to the same
Notice table as the cloud's notice queues, and are acted on once there.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field
from sqlmodel import Session, col, or_, select

from broker import utilization
from broker.control import phases_rec
from broker.errors import InvalidState, NotFound, Unauthorized
from broker.output_log import DEFAULT_CAP, CappedOutput, per_rank_cap
from broker.spec import MAX_ID, MAX_PID, DbId, LogOffset
from broker.state import ledger
from broker.state.events import record
from broker.state.model import Attempt, Node, NodeState, Notice, Pool
from broker.state.model_access import NodeAgent, RankAssignment
from broker.state.model_access import RankState as AState
from broker.state.token_hash import Check
from broker.state.tokens import JOIN, NODE, Verifier, parse, redeem_join_token
from broker.wire import SERVER_UNREACHABLE
from providers import start_errors

log = logging.getLogger("onepool.agents")
LIVE = (AState.ASSIGNED, AState.RUNNING)
NOTICE_KINDS = ("spot_interruption", "rebalance", "preempted", "maintenance")


# -- wire format ------------------------------------------------------------------------------
class JoinRequest(BaseModel):
    join_token: str = Field(min_length=1, max_length=200)
    info: dict[str, Any] = Field(default_factory=dict)  # hostname, pid, gpus, gpu_type, ...
    # The credential this agent held before (its saved one): proof that a join while the
    # node's agent looks alive comes from that same agent, restarted with a new join token.
    previous_credential: str | None = Field(default=None, max_length=200)


class JoinReply(BaseModel):
    node: str
    pool: str
    credential: str
    heartbeat_s: float
    fence_s: float  # ranks stop themselves after this long without a successful sync
    fence_grace_s: float | None = None  # ... and are killed this long after (None: their grace)


class RankReport(BaseModel):
    assignment_id: DbId
    state: str = Field(pattern="^(running|exited|lost)$")
    pid: int | None = Field(default=None, ge=0, le=MAX_PID)
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    # why it could not start at all (providers.start_errors), with state "exited"; or, with
    # state "lost", `server_unreachable`: it stopped itself, cut off from the server (its fence)
    cause: str | None = Field(default=None, pattern=f"{start_errors.PATTERN}|^{SERVER_UNREACHABLE}$")
    # The mean utilization (percent) of the rank's GPUs since the agent's previous report
    # (broker.utilization); None: not sampled (no NVML on the node).
    gpu_util_pct: float | None = Field(default=None, ge=0.0, le=100.0, allow_inf_nan=False)
    # Restart phases the node timed for the rank (broker.phases: kept for rank 0, cleaned).
    phases: dict[str, float | bool] | None = Field(default=None, max_length=16)


class SyncRequest(BaseModel):
    ranks: list[RankReport] = Field(default_factory=list, max_length=4096)
    # assignment id -> highest signal seq done
    acked: dict[DbId, DbId] = Field(default_factory=dict, max_length=4096)
    known: list[DbId] = Field(default_factory=list, max_length=4096)  # assignment ids it runs
    wait_s: float = Field(default=0.0, ge=0.0, le=60.0)
    info: dict[str, Any] = Field(default_factory=dict)
    # the code snapshots its node's cache holds, most recently used first (issue 26; None: not
    # told): the policy prefers warm nodes among equals (broker.policy.warm)
    code_held: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] | None = Field(default=None,
                                                                                     max_length=64)
    # the images its container runtime holds (None: not told, or no runtime): the same preference
    images_held: list[Annotated[str, Field(min_length=1, max_length=512)]] | None = Field(default=None,
                                                                                         max_length=256)


class Assignment(BaseModel):
    assignment_id: int
    attempt_id: int
    rank: int
    argv: list[str]
    env: dict[str, str]


class SignalOrder(BaseModel):
    assignment_id: int
    seq: int
    signal: int


class SyncReply(BaseModel):
    node: str
    assignments: list[Assignment] = []  # every live rank of this node (start the unknown ones)
    signals: list[SignalOrder] = []  # not yet acknowledged, in order
    forget: list[int] = []  # ended on the broker's side: stop reporting them
    kill: list[int] = []  # ended or lost on the broker's side but reported running: SIGKILL
    retire: bool = False  # the node is gone from the broker: stop everything and exit
    heartbeat_s: float = 5.0
    fence_s: float = 160.0
    fence_grace_s: float | None = None

    @property
    def has_news(self) -> bool:
        return bool(self.signals or self.forget or self.kill or self.retire)


class LogPiece(BaseModel):
    assignment_id: DbId
    offset: LogOffset
    data_b64: str = Field(max_length=2 * 1024 * 1024)


class NoticeRequest(BaseModel):
    kind: str = Field(pattern="^(" + "|".join(NOTICE_KINDS) + ")$")
    deadline: float | None = Field(default=None, allow_inf_nan=False)
    detail: dict[str, Any] = Field(default_factory=dict)


FENCE_CHECK_S = 1.0  # how often a rank's supervisor looks at its lease (providers.local_runner)


@dataclass
class Timing:
    """The agents' clock: one source for the three times (defaults: BrokerSettings).

    - heartbeat_s: an agent calls in at least this often (a long poll lasts at most this).
    - fence_s = lost_after_s x 2/3: a rank whose agent has had no answer from the server for
      this long stops itself (SIGTERM, then SIGKILL after fence_grace_s). With the defaults
      (240 s: 160 s) a server restart or outage of up to about 150 s stops no job.
    - fence_grace_s: the fenced rank's time to checkpoint, the job's grace_s at most, so that
      it is dead (fence_s + fence_grace_s after the agent's last answer, which came at most
      heartbeat_s after the server last heard it) before lost_after_s, when the broker declares
      the node lost and places its work elsewhere: the work never runs twice (split brain).
    """

    heartbeat_s: float = 5.0
    lost_after_s: float = 240.0

    @property
    def fence_s(self) -> float:
        """Ranks fence themselves before the broker gives their work to another node."""
        return self.lost_after_s * 2 / 3

    @property
    def fence_grace_s(self) -> float:
        """The most a fenced rank gets between SIGTERM and SIGKILL (see the class)."""
        return max(0.0, self.lost_after_s - self.fence_s - self.heartbeat_s - FENCE_CHECK_S)


# -- routes' logic ------------------------------------------------------------------------------
def join(s: Session, verifier: Verifier, req: JoinRequest, now: float, timing: Timing) -> JoinReply:
    """Redeem a join token. The node's GPUs follow what the agent reports, up to the pool's
    size (fewer or more than before); it is up, unless the agent reports a GPU type that is not
    the pool's: then it takes no work (state waiting) and an `agent_gpu_type` event says why.
    Raises Unauthorized (bad token, node gone), or InvalidState when another agent serves the
    node and is alive (called in within `lost_after_s`): nothing is changed then, the token
    stays usable."""
    before = _agent_row_of(s, req.join_token)
    alive_since = None if before is None else _alive(before, now, timing)
    same = before is not None and _same_agent(verifier, before, req.previous_credential)
    row, credential = redeem_join_token(s, verifier, req.join_token, now)
    node = s.get(Node, row.node)
    if node is None or node.state in (NodeState.RETIRED, NodeState.TERMINATED, NodeState.TERMINATING):
        raise Unauthorized(f"node {row.node} is no longer part of this broker")
    if alive_since is not None and not same:
        host = before.info.get("hostname", "?") if before is not None else "?"
        raise InvalidState(
            f"node {row.node} is served by a live agent (on {host}, "
            f"last call {alive_since:.0f}s ago): stop that agent first; this one may join "
            f"{timing.lost_after_s:g}s after it last called in")
    pool = s.get(Pool, node.pool)
    assert pool is not None
    row.info = {**_clean(req.info), "joined_at": now}
    s.add(row)
    reported = req.info.get("gpus")
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        node.gpus = min(reported, pool.gpus_per_node)
    wrong = _wrong_gpu_type(req.info.get("gpu_type"), pool.gpu_type)
    if wrong:
        node.state = NodeState.WAITING
        record(s, now, "agent_gpu_type", f"agent on {req.info.get('hostname', '?')} reports GPU type "
               f"{wrong!r} but pool {pool.name} is {pool.gpu_type}: node {node.id} takes no work until "
               f"an agent with {pool.gpu_type} GPUs joins (or give the agent --gpu-type {pool.gpu_type} "
               "if that is what it has)", node=node.id, pool=node.pool)
    elif node.state in (NodeState.WAITING, NodeState.LOST, NodeState.LAUNCHING):
        if node.state == NodeState.LAUNCHING:  # [issue 13 metering hook] its boot ends
            node.ready_at = ledger.node_ready(s, node.id, now)
        node.state, node.idle_since = NodeState.UP, now
    s.add(node)
    record(s, now, "agent_joined", f"agent on {req.info.get('hostname', '?')} joined as node "
           f"{node.id} ({node.gpus} GPUs, pool {node.pool})", node=node.id, pool=node.pool,
           agent=row.info)
    return JoinReply(node=node.id, pool=node.pool, credential=credential,
                     heartbeat_s=timing.heartbeat_s, fence_s=timing.fence_s,
                     fence_grace_s=timing.fence_grace_s)


def _agent_row_of(s: Session, join_token: str) -> NodeAgent | None:
    """The agent row a join token names (not verified here: redeem_join_token does)."""
    try:
        tid = parse(join_token, JOIN)
    except Unauthorized:
        return None
    return s.exec(select(NodeAgent).where(NodeAgent.join_id == tid)).first()


def _alive(row: NodeAgent, now: float, timing: Timing) -> float | None:
    """Seconds since the node's current agent last called in, if it holds a credential and
    has called in within `lost_after_s`; else None."""
    if row.credential_id is None or row.seen_at is None or row.lost_at is not None:
        return None
    ago = now - row.seen_at
    return max(0.0, ago) if ago < timing.lost_after_s else None


def _same_agent(verifier: Verifier, row: NodeAgent, previous: str | None) -> bool:
    """Does `previous` prove the joining agent is the one holding the node's credential?"""
    if not previous or row.credential_id is None or row.credential_hash is None:
        return False
    try:
        cid = parse(previous, NODE)
    except Unauthorized:
        return False
    return cid == row.credential_id and verifier.check(previous, row.credential_hash) is not Check.BAD


def _wrong_gpu_type(reported: Any, pool_type: str) -> str | None:
    """The reported GPU type when it is not the pool's: it must name it (A100 in "NVIDIA
    A100-SXM4-80GB", any case). Nothing reported, or "GPU" (the agent was not told), is
    not a mismatch."""
    if not isinstance(reported, str) or reported.strip() in ("", "GPU"):
        return None
    return None if pool_type.lower() in reported.lower() else reported[:80]


def _clean(info: dict[str, Any]) -> dict[str, Any]:
    """What of the agent's self-description is kept: short strings and finite numbers a
    database integer holds (a NaN or an infinity is not JSON PostgreSQL takes)."""
    return {str(k)[:40]: v if not isinstance(v, str) else v[:200] for k, v in list(info.items())[:20]
            if isinstance(v, str | bool) or v is None
            or (isinstance(v, int) and -MAX_ID <= v <= MAX_ID)
            or (isinstance(v, float) and math.isfinite(v))}


def sync(s: Session, agent: NodeAgent, req: SyncRequest, now: float, timing: Timing, *,
         heartbeat: bool = True) -> SyncReply:
    """Record the heartbeat (with heartbeat=False: a read-only look, for a long poll's later
    checks) and the rank reports; say what the agent should do now."""
    node = s.get(Node, agent.node)
    if node is None or node.state in (NodeState.TERMINATED, NodeState.TERMINATING, NodeState.RETIRED):
        return SyncReply(node=agent.node, retire=True, kill=[r.assignment_id for r in req.ranks
                                                              if r.state == "running"],
                         heartbeat_s=timing.heartbeat_s, fence_s=timing.fence_s,
                         fence_grace_s=timing.fence_grace_s)
    if heartbeat:
        agent.seen_at = now
    if req.info:
        agent.info = {**agent.info, **_clean(req.info)}
    for key, held in (("code_held", req.code_held), ("images_held", req.images_held)):
        if held is not None and agent.info.get(key) != held:
            agent.info = {**agent.info, key: held}
    if heartbeat and (agent.lost_at is not None or node.state == NodeState.LOST):
        agent.lost_at = None
        if node.state == NodeState.LOST:
            node.state, node.idle_since = NodeState.UP, now
            s.add(node)
            record(s, now, "agent_back", f"node {node.id}'s agent calls in again: up",
                   node=node.id, pool=node.pool)
    s.add(agent)
    ids = {r.assignment_id for r in req.ranks} | set(req.known) | {int(k) for k in req.acked}
    rows = {r.id: r for r in s.exec(select(RankAssignment).where(
        RankAssignment.node == agent.node,
        or_(col(RankAssignment.id).in_(ids), col(RankAssignment.state).in_(list(LIVE))))).all()}
    kill: list[int] = []
    forget: list[int] = []
    for rep in req.ranks:
        row = rows.get(rep.assignment_id)
        if row is None:
            kill.append(rep.assignment_id) if rep.state == "running" else forget.append(rep.assignment_id)
            continue
        if row.state in LIVE:
            if rep.state == "running" and row.state == AState.ASSIGNED:
                row.state, row.pid, row.started_at = AState.RUNNING, rep.pid, now
            elif rep.state in ("exited", "lost"):
                row.state = AState.EXITED if rep.state == "exited" else AState.LOST
                row.exit_code, row.ended_at = rep.exit_code, now
                # a start failure's cause with "exited"; server_unreachable (its fence) with "lost"
                fits = (start_errors.is_start_failure(rep.cause) if rep.state == "exited"
                        else rep.cause == SERVER_UNREACHABLE)
                row.cause = rep.cause if fits else None
            s.add(row)
        elif rep.state == "running":
            kill.append(row.id or 0)  # the broker gave up on it (node was lost): stop it
        if row.state not in LIVE and rep.state != "running":
            forget.append(row.id or 0)
    _utilization(s, rows, req.ranks, now)
    for rep in req.ranks:  # restart phases (issue 26), of each attempt's first rank
        row = rows.get(rep.assignment_id)
        if rep.phases and row is not None and row.rank == 0 and (a := s.get(Attempt, row.attempt_id)):
            phases_rec.note(s, a, rep.phases, now)
    for aid, seq in req.acked.items():
        row = rows.get(int(aid))
        if row is not None and seq > row.acked_seq:
            row.acked_seq = seq
            s.add(row)
    live = [r for r in rows.values() if r.state in LIVE]
    signals = [SignalOrder(assignment_id=r.id or 0, seq=q, signal=sig)
               for r in live for q, sig in r.signals if q > r.acked_seq]
    return SyncReply(node=agent.node,
                     assignments=[Assignment(assignment_id=r.id or 0, attempt_id=r.attempt_id,
                                             rank=r.rank, argv=r.argv, env=r.env) for r in live],
                     signals=signals, forget=forget, kill=kill,
                     heartbeat_s=timing.heartbeat_s, fence_s=timing.fence_s,
                     fence_grace_s=timing.fence_grace_s)


def _utilization(s: Session, rows: dict[int | None, RankAssignment], reports: list[RankReport],
                 now: float) -> None:
    """Record the GPU utilization reported for running ranks, and fold it into their attempts."""
    touched: set[int] = set()
    for rep in reports:
        row = rows.get(rep.assignment_id)
        if rep.gpu_util_pct is not None and rep.state == "running" and row is not None and row.state in LIVE:
            row.gpu_util_pct = rep.gpu_util_pct
            s.add(row)
            touched.add(row.attempt_id)
    for aid in sorted(touched):
        a = s.get(Attempt, aid)
        if a is None or a.ended_at is not None:
            continue
        ranks = s.exec(select(RankAssignment.gpu_util_pct).where(
            RankAssignment.attempt_id == aid, col(RankAssignment.state).in_(list(LIVE)))).all()
        utilization.update_attempt(a, ranks, now)
        s.add(a)


def news_for(reply: SyncReply, known: set[int]) -> bool:
    """Whether a sync answer carries anything the agent does not know yet."""
    return reply.has_news or any(a.assignment_id not in known for a in reply.assignments)


def write_log(home: Path, s: Session, agent: NodeAgent, piece: LogPiece, data: bytes,
              cap: int = DEFAULT_CAP) -> int:
    """Write shipped output at `offset` of the rank's log on the broker (the same place a
    local rank writes), capped like a local rank's (broker.output_log: `cap` bytes per
    attempt, shared by its ranks; the tail kept). Returns the log's end after it: the offset
    the agent continues from (a resend of bytes already written is skipped; bytes the node
    dropped before shipping count as dropped here too). Raises NotFound."""
    row = s.get(RankAssignment, piece.assignment_id)
    if row is None or row.node != agent.node:
        raise NotFound(f"no rank assignment {piece.assignment_id} on node {agent.node}")
    att = s.get(Attempt, row.attempt_id)
    run_dir = home / "runs" / f"attempt-{row.attempt_id}" / f"rank-{row.rank}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out = CappedOutput(run_dir, per_rank_cap(cap, len(att.alloc) if att is not None else 1))
    try:
        before = out.end
        end = out.write_at(piece.offset, data)
    finally:
        out.close()
    if end != before:
        row.log_bytes = end
        s.add(row)
    return end


def notice(s: Session, agent: NodeAgent, req: NoticeRequest, now: float) -> Notice | None:
    """Record an interruption notice of a rented node (once per node and kind) in the same
    table the cloud's notice queues feed; the capacity manager drains the node and
    interrupts its attempts. None for a node without an instance (on-prem: nothing to do)."""
    node = s.get(Node, agent.node)
    if node is None or node.instance_id is None:
        record(s, now, "notice_ignored", f"{req.kind} reported by node {agent.node}, which is not a "
               "rented instance", node=agent.node, notice=req.kind)
        return None
    key = f"agent:{node.instance_id}:{req.kind}"
    prior = s.exec(select(Notice).where(Notice.key == key)).first()
    if prior is not None:
        return prior
    row = Notice(key=key, pool=node.pool, instance_id=node.instance_id, kind=req.kind,
                 deadline=req.deadline, received_at=now)
    s.add(row)
    record(s, now, "notice_reported", f"{req.kind} reported by the agent of node {agent.node}"
           + (f" (gone at {req.deadline:.0f})" if req.deadline else ""), node=agent.node,
           notice=req.kind, source="agent")
    return row


# -- the engine's watch ---------------------------------------------------------------------------
@dataclass
class WatchResult:
    lost_nodes: list[str] = field(default_factory=list)  # on-prem: their ranks are LOST now
    rented_lost: list[str] = field(default_factory=list)  # to terminate; their work ends once gone


def watch(s: Session, now: float, lost_after_s: float, since: float | None = None) -> WatchResult:
    """Declare agents silent for `lost_after_s` lost, silence counted from their last call or
    from `since` (the start of the caller's term), whichever is later: after an outage of the
    broker no agent is lost before it had `lost_after_s` to call in. An on-prem node's unfinished ranks are
    LOST at once (its ranks fence themselves before this, see providers.local_runner); a
    rented node is returned for termination: its ranks are LOST once the instance is
    confirmed gone (broker.control.executors)."""
    out = WatchResult()
    if since is not None and since > now - lost_after_s:
        return out
    rows = s.exec(select(NodeAgent, Node, Pool).join(Node, col(Node.id) == NodeAgent.node)
                  .join(Pool, col(Pool.name) == Node.pool)
                  .where(col(NodeAgent.joined_at).is_not(None), col(NodeAgent.lost_at).is_(None),
                         col(NodeAgent.seen_at) < now - lost_after_s,
                         col(Node.state).in_([NodeState.UP, NodeState.DRAINING]))).all()
    for agent, node, pool in rows:
        agent.lost_at = now
        s.add(agent)
        silent = now - (agent.seen_at or now)
        record(s, now, "node_lost", f"node {node.id}'s agent has not called in for {silent:.0f}s "
               f"(limit {lost_after_s:g}s): lost; its work goes back to the queue",
               node=node.id, pool=node.pool, reason="agent_silent")
        if pool.provider != "agent":
            out.rented_lost.append(node.id)
            continue
        node.state = NodeState.LOST
        s.add(node)
        out.lost_nodes.append(node.id)
        for r in s.exec(select(RankAssignment).where(RankAssignment.node == node.id,
                                                     col(RankAssignment.state).in_(list(LIVE)))):
            r.state, r.ended_at = AState.LOST, now
            s.add(r)
    return out
