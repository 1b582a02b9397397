"""/v1 routes for configuration, pools, nodes, rebalancing proposals, teams, tokens and health."""

from __future__ import annotations

import os
import socket
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, Field

from broker.api.context import client, ctx
from broker.client.sdk import Client
from broker.control.health import Health
from broker.errors import SpecError
from broker.spec import ClusterConfig, parse_config
from broker.state.tokens import local_principal
from broker.state.views import JoinTokenInfo, NodeInfo, TokenInfo
from broker.wire import MoveInfo, PoolInfo

router = APIRouter(prefix="/v1")
ClientDep = Annotated[Client, Depends(client)]


class TeamInfo(BaseModel):
    name: str
    weight: float
    priority_allowance_gpus: int


class TokenRequest(BaseModel):
    team: str = Field(min_length=1, max_length=63)
    role: str = "member"
    note: str = Field(default="", max_length=200)
    user: str | None = Field(default=None, max_length=63)


class JoinTokenRequest(BaseModel):
    ttl_s: float = Field(default=3600.0, gt=0, le=30 * 86400, allow_inf_nan=False)


class WhoAmI(BaseModel):
    kind: str
    team: str | None
    token_id: str
    user: str | None = None


@router.get("/config", response_model=ClusterConfig, tags=["admin"])
def get_config(c: ClientDep) -> ClusterConfig:
    return c.config()


@router.put("/config", response_model=ClusterConfig, tags=["admin"],
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": {"type": "object", "description": "onepool.yaml as JSON"}}}}})
def put_config(request: Request, c: ClientDep, body: Annotated[Any, Body()] = None) -> ClusterConfig:
    """Apply a config (admins): pools, teams and broker settings. This process uses the new
    limits from its next request on; other API processes within a few seconds."""
    c.principal.require_admin("applying a config (pools, teams, settings)")
    if not isinstance(body, dict):
        raise SpecError("config", ["(root): must be a JSON object with 'pools' and 'teams'"])
    applied = c.apply(parse_config(body, "config"))
    ctx(request).forget_settings()
    return applied


@router.get("/pools", response_model=list[PoolInfo], tags=["capacity"])
def pools(c: ClientDep, include_inactive: bool = False) -> list[PoolInfo]:
    """Every pool now (`onepool pools`): market, price in force, live nodes with their free
    GPUs and the jobs holding the rest (a member: its own team's only). The configured pools
    themselves are in GET /v1/config."""
    return c.pools(include_inactive=include_inactive)


@router.get("/rebalance/proposals", response_model=list[MoveInfo], tags=["capacity"])
def rebalance_proposals(c: ClientDep) -> list[MoveInfo]:
    """The moves rebalancing would start now (`onepool rebalance --dry-run`): computed on a
    read-only snapshot, without the lease; changes nothing (a member: its own team's jobs)."""
    return c.rebalance_dry_run()


@router.get("/nodes", response_model=list[NodeInfo], tags=["capacity"])
def nodes(c: ClientDep, pool: str | None = None) -> list[NodeInfo]:
    """Nodes with their free GPUs."""
    return c.nodes(pool)


@router.post("/nodes/{node}/join-token", response_model=JoinTokenInfo, status_code=201, tags=["capacity"])
def join_token(c: ClientDep, node: str, body: JoinTokenRequest | None = None) -> JoinTokenInfo:
    """A one-time token for `onepool agent --join-token-file` (admins)."""
    return c.join_token(node, (body or JoinTokenRequest()).ttl_s)


@router.get("/teams", response_model=list[TeamInfo], tags=["admin"])
def teams(c: ClientDep) -> list[TeamInfo]:
    return [TeamInfo(name=t.name, weight=t.weight, priority_allowance_gpus=t.priority_allowance_gpus)
            for t in c.config().teams]


@router.post("/tokens", response_model=TokenInfo, status_code=201, tags=["admin"])
def create_token(c: ClientDep, body: TokenRequest) -> TokenInfo:
    """A new token; its secret is in this answer only (admins)."""
    return c.create_token(body.team, body.role, body.note, body.user)


@router.get("/tokens", response_model=list[TokenInfo], tags=["admin"])
def tokens(c: ClientDep) -> list[TokenInfo]:
    return c.tokens()


@router.post("/tokens/{token_id}/revoke", response_model=TokenInfo, tags=["admin"])
def revoke_token(c: ClientDep, token_id: str) -> TokenInfo:
    return c.revoke_token(token_id)


@router.get("/whoami", response_model=WhoAmI, tags=["admin"])
def whoami(c: ClientDep) -> WhoAmI:
    p = c.principal
    return WhoAmI(kind=p.kind, team=p.team, token_id=p.id, user=p.user)


@router.get("/healthz", response_model=Health, tags=["health"])
def healthz(request: Request) -> Health:
    """Whether a broker cycles on this server's database (no token needed), and which API
    process answers (host:pid: the leader's when it holds the lease)."""
    h = ctx(request).client(local_principal()).health()
    return h.model_copy(update={"served_by": f"{socket.gethostname()}:{os.getpid()}"})
