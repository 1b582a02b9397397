"""Who is acting: API tokens, node join tokens and agent credentials.

Every secret has the shape `{prefix}_{id}_{secret}`: the id (12 hex digits) finds the row,
the whole string is checked against a salted HMAC-SHA256 of it (broker.state.token_hash says
why a fast hash is safe for tokens this random), so the database never holds a usable secret.
The plaintext is returned once, to whoever created it.

Checking a token costs one primary-key read and one HMAC, whether it is unknown, revoked,
wrong or right: a flood of bad tokens costs the server microseconds each (the API's guard
also answers 429 to an address that keeps failing, broker.api.guard). Rows still holding an
argon2 hash (written before) verify once with argon2, under a process-wide budget, and are
upgraded to the fast hash on that first success.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, select

from broker.clock import Clock, SystemClock
from broker.errors import Forbidden, NotFound, SpecError, Unauthorized
from broker.state import access
from broker.state.access import check_user
from broker.state.model import Setting, Team
from broker.state.model_access import ApiToken, NodeAgent, Role
from broker.state.token_hash import Check, Hasher, LegacyBudget, hash_secret, is_legacy

API, JOIN, NODE = "op", "opj", "opn"
ACTOR_MAX = 120  # Event.actor, Job.submitted_by, Job.held_by, ApiToken.created_by
_SHAPE = re.compile(r"^(op|opj|opn)_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")


class NotVerifiedHere(Exception):
    """The token's row holds an old (argon2) hash, slow to check (asked with cached_only):
    verify it where a slow hash may run (api_principal without cached_only, which upgrades the
    row to the fast hash), then ask again."""


@dataclass(frozen=True)
class Principal:
    """Who makes a request. kind: local (the embedded, single-user mode: full rights), member,
    lead (a team lead), admin, metrics (a Prometheus scraper: GET /metrics only), agent (a
    node agent: only the agent routes) or broker (the engine itself). `user`: the person a
    member, lead or admin token belongs to (None: a token of the whole team); the local user's
    login. What each may do: broker.state.access, the one rule."""

    kind: str
    team: str | None
    id: str
    user: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind in ("local", "admin", "broker")

    @property
    def person(self) -> str | None:
        """The user a job it submits records (Job.user): the token's user, the local login."""
        return self.id if self.kind == "local" else self.user

    @property
    def actor(self) -> str:
        """How events name it: `token:ID (team role)` or `token:ID (team role USER)`,
        `local:USER`, `agent:NODE`, `broker`; at most ACTOR_MAX characters (the columns that
        hold it): a long user name is cut short there (the token id still says whose it is)."""
        if self.kind in ("member", "lead", "admin"):
            head = f"token:{self.id} ({self.team} {self.kind}"
            if not self.user:
                return head + ")"
            return f"{head} {self.user}"[:ACTOR_MAX - 1] + ")"
        if self.kind == "broker":
            return "broker"
        return f"{self.kind}:{self.id}"

    def require_admin(self, what: str) -> None:
        """Raises Forbidden unless this principal may manage pools, teams, budgets and tokens."""
        access.require(self, access.Action.ADMIN, what)

    def may_act_for(self, team: str) -> bool:
        """Whether this principal may see `team`'s jobs (changing one: broker.state.access)."""
        return access.allowed(self, access.Action.READ, team)

    def require_team(self, team: str, what: str) -> None:
        """Raises Forbidden unless this principal may read `team`'s jobs and submit for it."""
        access.require(self, access.Action.SUBMIT, what, team)


def local_principal() -> Principal:
    """The embedded mode's principal: whoever can open the database file."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Principal("local", None, user)


BROKER = Principal("broker", None, "broker")


def _new(prefix: str) -> tuple[str, str]:
    tid = secrets.token_hex(6)
    return tid, f"{prefix}_{tid}_{secrets.token_urlsafe(32)}"


def parse(token: str, prefix: str) -> str:
    """The id inside a token of this kind. Raises Unauthorized if it is not shaped like one."""
    m = _SHAPE.match(token.strip())
    if m is None or m.group(1) != prefix:
        kind = {API: "an API token (op_...)", JOIN: "a join token (opj_...)",
                NODE: "a node credential (opn_...)"}[prefix]
        raise Unauthorized(f"not {kind}: check that the whole token was copied")
    return m.group(2)


class Verifier:
    """Checks tokens against their stored hashes (see the module's docstring for the costs)."""

    def __init__(self, clock: Clock | None = None, hasher: Hasher | None = None) -> None:
        self.hasher = hasher or Hasher(LegacyBudget(clock or SystemClock()))

    def check(self, token: str, stored_hash: str | None, *, cached_only: bool = False) -> Check:
        """Check `token` against `stored_hash`. With cached_only, raises NotVerifiedHere instead
        of running a slow (argon2) check; raises TooManyRequests when the process's budget for
        slow checks is spent."""
        if cached_only and stored_hash and is_legacy(stored_hash):
            raise NotVerifiedHere()
        return self.hasher.check(stored_hash, token)

    def api_principal(self, s: Session, token: str | None, *, cached_only: bool = False,
                      allow_metrics: bool = False) -> Principal:
        """The member or admin behind an API token. Raises Unauthorized (missing, malformed,
        unknown, revoked); Forbidden for a metrics token unless `allow_metrics` (only GET
        /metrics allows it); with cached_only, NotVerifiedHere for a row whose old hash needs a
        slow check. A row with an old hash is upgraded in `s` (the caller commits)."""
        if not token:
            raise Unauthorized("this API needs a token: send `Authorization: Bearer TOKEN` "
                               "(set ONEPOOL_TOKEN; an admin creates one with `onepool token create`)")
        tid = parse(token, API)
        row = s.get(ApiToken, tid)
        verdict = Check.BAD if row is None else self.check(token, row.hash, cached_only=cached_only)
        if row is None or verdict is Check.BAD:
            raise Unauthorized(f"token {tid} is not known to this server")
        if row.revoked_at is not None:
            raise Unauthorized(f"token {tid} was revoked; ask an admin for a new one")
        if row.role == Role.METRICS and not allow_metrics:
            raise Forbidden(f"token {tid} is a metrics token: it reads GET /metrics only "
                            "(use a member or admin token here)")
        if verdict is Check.OK_UPGRADE:
            row.hash = hash_secret(token)
            s.add(row)
        return Principal(row.role, row.team, row.id, row.user)

    def node_of_credential(self, s: Session, credential: str | None) -> NodeAgent:
        """The agent row a node credential belongs to. Raises Unauthorized. A row with an old
        hash is upgraded in `s` (the caller commits)."""
        if not credential:
            raise Unauthorized("agent routes need the node credential the join returned")
        cid = parse(credential, NODE)
        row = s.exec(select(NodeAgent).where(NodeAgent.credential_id == cid)).first()
        verdict = Check.BAD if row is None else self.check(credential, row.credential_hash)
        if row is None or verdict is Check.BAD:
            raise Unauthorized("node credential not known to this server (the node may have "
                               "been retired): join again with a new join token")
        if verdict is Check.OK_UPGRADE:
            row.credential_hash = hash_secret(credential)
            s.add(row)
        return row


# -- API tokens -----------------------------------------------------------------------------------
def create_api_token(s: Session, team: str, role: str, by: Principal, now: float,
                     note: str = "", user: str | None = None) -> tuple[str, ApiToken]:
    """Create a token for `team` with `role`, belonging to the person `user` (None: a token of
    the whole team); returns (plaintext, row). Only admins (or the embedded mode) may. Raises
    Forbidden, SpecError (unknown team or role, a bad user name, a metrics token with a user)."""
    by.require_admin("creating tokens")
    roles = [r.value for r in Role]
    if role not in roles:
        raise SpecError("token", [f"role: must be one of {', '.join(roles)} (got {role!r})"])
    check_user(user)
    if user is not None and role == Role.METRICS:
        raise SpecError("token", ["user: a metrics token reads GET /metrics only and belongs to "
                                  "no person; leave --user out"])
    teams = [t.name for t in s.exec(select(Team).order_by(Team.name)).all()]
    if team not in teams:
        allowed = ", ".join(teams) or "(none: apply an onepool.yaml first)"
        raise SpecError("token", [f"team: must be one of {allowed} (got {team!r})"])
    if len(note) > 200:
        raise SpecError("token", ["note: at most 200 characters"])
    tid, token = _new(API)
    row = ApiToken(id=tid, team=team, user=user, role=role, hash=hash_secret(token), note=note,
                   created_at=now, created_by=by.actor)
    s.add(row)
    return token, row


def revoke_api_token(s: Session, tid: str, by: Principal, now: float) -> ApiToken:
    """Revoke a token (idempotent). Raises Forbidden, NotFound."""
    by.require_admin("revoking tokens")
    row = s.get(ApiToken, tid)
    if row is None:
        raise NotFound(f"no token with id {tid!r}")
    if row.revoked_at is None:
        row.revoked_at, row.revoked_by = now, by.actor
        s.add(row)
    return row


# -- node join tokens -----------------------------------------------------------------------------
def new_join_token(s: Session, node: str, now: float, ttl_s: float) -> str:
    """A fresh one-time join token for `node` (replacing any unused one); returns it."""
    tid, token = _new(JOIN)
    _store_join(s, node, tid, token, now + ttl_s)
    return token


def derived_join_token(s: Session, node: str, seed: str, now: float, ttl_s: float) -> str:
    """The join token of a rented node, derived from its launch token `seed` and this broker's
    secret, so a launch retried after a crash (same client token, so the same instance and
    user data) carries the same join token. Stores its hash if not stored yet."""
    key = _broker_secret(s)
    mac = hmac.new(key, f"join\0{node}\0{seed}".encode(), hashlib.sha256).hexdigest()
    tid, token = mac[:12], f"{JOIN}_{mac[:12]}_{mac[12:56]}"
    row = s.get(NodeAgent, node)
    if row is None or row.join_id != tid:
        _store_join(s, node, tid, token, now + ttl_s)
    return token


def _store_join(s: Session, node: str, tid: str, token: str, expires_at: float) -> None:
    row = s.get(NodeAgent, node) or NodeAgent(node=node)
    row.join_id, row.join_hash, row.join_expires_at = tid, hash_secret(token), expires_at
    s.add(row)


def _broker_secret(s: Session) -> bytes:
    """This broker home's secret (made on first use). Several cloud workers (one thread per
    rented pool) may ask for it first at the same moment: the first insert wins and the others
    read the winner's (INSERT ... ON CONFLICT DO NOTHING, then read back), so no launch fails
    and every derived join token uses the one stored secret."""
    row = s.get(Setting, "broker_secret")
    if row is None:
        made = {"hex": secrets.token_hex(32)}
        dialect = s.get_bind().dialect.name
        insert = {"sqlite": sqlite_insert, "postgresql": pg_insert}[dialect]
        s.execute(insert(Setting).values(key="broker_secret", value=made)
                  .on_conflict_do_nothing(index_elements=["key"]))
        row = s.get(Setting, "broker_secret", populate_existing=True)
        assert row is not None, "the broker secret was just inserted or found"
    return bytes.fromhex(str(row.value["hex"]))


def redeem_join_token(s: Session, verifier: Verifier, token: str, now: float) -> tuple[NodeAgent, str]:
    """Exchange a join token for a node credential: the token is used up, the node's previous
    credential (if any) stops working. Returns (row, credential). Raises Unauthorized
    (malformed, unknown, used or expired)."""
    tid = parse(token, JOIN)
    row = s.exec(select(NodeAgent).where(NodeAgent.join_id == tid)).first()
    if row is None or verifier.check(token, row.join_hash) is Check.BAD:
        raise Unauthorized("join token not known to this server, or already used: each join "
                           "token works once (create another with `onepool node join-token NODE`)")
    if row.join_expires_at is not None and now > row.join_expires_at:
        raise Unauthorized(f"join token for node {row.node} expired; create another with "
                           f"`onepool node join-token {row.node}`")
    cid, credential = _new(NODE)
    row.join_id, row.join_hash, row.join_expires_at = None, None, None
    row.credential_id, row.credential_hash = cid, hash_secret(credential)
    row.joined_at, row.seen_at, row.lost_at = now, now, None
    s.add(row)
    return row, credential
