"""/v1/agent: the node agents' protocol (see broker.control.agents). Agents authenticate with
the node credential their join returned; nothing here is open to API tokens.

Every route here is async and does its database work on the agent routes' own threads
(ApiContext.agent_work), never on the pool the user routes share: a flood of user requests
cannot make an agent's sync wait for a thread, miss its heartbeat and fence its ranks."""

from __future__ import annotations

import asyncio
import base64
import binascii

from fastapi import APIRouter, Request
from pydantic import BaseModel

from broker.api.context import ApiContext, bearer, ctx
from broker.api.guard import authenticated
from broker.control import agents
from broker.errors import SpecError

router = APIRouter(prefix="/v1/agent", tags=["agent"])


class LogAck(BaseModel):
    offset: int


@router.post("/join", response_model=agents.JoinReply)
async def join(request: Request, req: agents.JoinRequest) -> agents.JoinReply:
    """Exchange a one-time join token for this node's credential."""
    c = ctx(request)
    reply = await c.agent_work(_join, c, req)
    c.on_agent_report()
    return reply


def _join(c: ApiContext, req: agents.JoinRequest) -> agents.JoinReply:
    with c.store.session() as s:
        return agents.join(s, c.verifier, req, c.clock.now(), c.timing())


@router.post("/sync", response_model=agents.SyncReply)
async def sync(request: Request, req: agents.SyncRequest) -> agents.SyncReply:
    """Heartbeat + rank reports; answers at once when there is news for the agent, else holds
    the request up to `wait_s` (long poll)."""
    c = ctx(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + req.wait_s
    known = set(req.known)
    first = True
    while True:
        reply = await c.agent_work(_sync_once, c, request, req, first)
        if first and (req.ranks or req.acked):
            c.on_agent_report()
        first = False
        left = deadline - loop.time()
        if reply.retire or agents.news_for(reply, known) or left <= 0:
            return reply
        await c.mailbox.wait(reply.node, min(left, c.check_s))


def _sync_once(c: ApiContext, request: Request, req: agents.SyncRequest,
               heartbeat: bool) -> agents.SyncReply:
    with c.store.session() as s:
        agent = c.verifier.node_of_credential(s, bearer(request))
        authenticated(request.scope)
        if not heartbeat:  # later looks of a long poll only read
            req = agents.SyncRequest(known=req.known, acked=req.acked)
        reply = agents.sync(s, agent, req, c.clock.now(), c.timing(), heartbeat=heartbeat)
        if not heartbeat:
            s.rollback()
        return reply


@router.post("/logs", response_model=LogAck)
async def ship_logs(request: Request, piece: agents.LogPiece) -> LogAck:
    """Append a rank's output; answers the offset to continue from."""
    c = ctx(request)
    return await c.agent_work(_ship_logs, c, request, piece)


def _ship_logs(c: ApiContext, request: Request, piece: agents.LogPiece) -> LogAck:
    try:
        data = base64.b64decode(piece.data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise SpecError("logs", ["data_b64: must be base64"]) from None
    with c.store.session() as s:
        agent = c.verifier.node_of_credential(s, bearer(request))
        authenticated(request.scope)
        return LogAck(offset=agents.write_log(c.store.home, s, agent, piece, data, c.output_cap()))


@router.post("/notice", status_code=202)
async def notice(request: Request, req: agents.NoticeRequest) -> dict[str, str]:
    """An interruption notice the agent read from its cloud's metadata service."""
    c = ctx(request)
    await c.agent_work(_notice, c, request, req)
    c.on_agent_report()
    return {"status": "recorded"}


def _notice(c: ApiContext, request: Request, req: agents.NoticeRequest) -> None:
    with c.store.session() as s:
        agent = c.verifier.node_of_credential(s, bearer(request))
        authenticated(request.scope)
        agents.notice(s, agent, req, c.clock.now())
