"""/v1/code/{sha256}: code snapshots uploaded by thin clients (issue 26), which hold no store
credentials. GET answers whether the token's team (or `?team=`, for an admin) has that
snapshot in the broker's store (`{"sha256": ..., "stored": true|false}`). PUT stores the body
under that digest after checking the token, then the body's size
(`broker.api.max_code_upload_bytes`, also enforced by the guard before anything is read), then
its sha256 (a body that does not hash to the digest is refused as a SpecError and nothing is
written). PUT of a digest already stored answers 200 without writing; a new one 201 (the
log's `code upload` line says which)."""

from __future__ import annotations

import logging
import re
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from broker.api.context import ctx, principal
from broker.checkpoint import code_store
from broker.checkpoint.index import default_store_root
from broker.control.config_apply import applied_config
from broker.errors import SpecError, TooLarge
from broker.state.tokens import Principal

log = logging.getLogger("onepool.api")
router = APIRouter(prefix="/v1")
Sha = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="the archive's sha256 (hex)")]
TEAM = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def _where(request: Request, p: Principal, team: str | None) -> tuple[str, str]:
    """(store root, team) of this request. Raises SpecError, Forbidden."""
    team = team or p.team
    if team is None or not TEAM.match(team):
        raise SpecError("code", [f"team: name the team the code is for (?team=NAME; got {team!r})"])
    p.require_team(team, "code snapshots")
    c = ctx(request)
    with c.store.session() as s:
        cfg = applied_config(s)
    return default_store_root(cfg, c.store.home), team


class CodeState(BaseModel):
    sha256: str
    stored: bool = Field(description="whether the team's snapshot with this digest is in the store")


@router.get("/code/{sha256}", response_model=CodeState, tags=["jobs"])
async def has_code(request: Request, sha256: Sha, team: str | None = None) -> CodeState:
    """Whether the team has this snapshot stored (a client uploads only when not)."""
    p = await run_in_threadpool(principal, request)
    root, team = await run_in_threadpool(_where, request, p, team)
    return CodeState(sha256=sha256, stored=await run_in_threadpool(code_store.has, root, team, sha256))


@router.put("/code/{sha256}", response_model=CodeState, tags=["jobs"],
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def put_code(request: Request, sha256: Sha, team: str | None = None) -> Response:
    """Store a code snapshot (a tar.gz) under its sha256 for the team."""
    p = await run_in_threadpool(principal, request)  # the token first, then the body
    root, team = await run_in_threadpool(_where, request, p, team)
    limit = ctx(request).limits().max_code_upload_bytes
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"a code snapshot may be at most {limit} bytes "
                           "(broker.api.max_code_upload_bytes); exclude files with .onepoolignore")
    try:
        written = await run_in_threadpool(code_store.put, root, team, sha256, bytes(body))
    except code_store.DigestMismatch as e:
        raise SpecError("code", [str(e)]) from e
    log.info("code upload: sha256:%s for team %s (%d bytes, %s)", sha256, team, len(body),
             "stored" if written else "already there")
    return Response(CodeState(sha256=sha256, stored=True).model_dump_json(),
                    status_code=201 if written else 200, media_type="application/json")
