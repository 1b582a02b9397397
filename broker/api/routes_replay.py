"""/v1/replay: replay the broker's history under changed settings (admins), and
/v1/rebalance/history: what finished moves expected and realized (issue 31).

POST {"sets": ["broker.grace_s=120", ...], "config": {onepool.yaml as JSON} | null,
"since": epoch seconds | null} -> broker.sim.replay.compare's result (current, changed,
diff, recorded, fidelity). The replay runs in the request's worker thread: it takes the
simulator's time (seconds for a few thousand jobs)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from broker.api.context import client
from broker.client.sdk import Client

router = APIRouter(prefix="/v1")
ClientDep = Annotated[Client, Depends(client)]


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sets: list[str] = Field(default_factory=list, max_length=100)
    config: dict[str, Any] | None = None
    since: float | None = Field(default=None, ge=0, allow_inf_nan=False)


@router.post("/replay", tags=["admin"])
def replay(body: ReplayRequest, c: ClientDep) -> dict[str, Any]:
    """Replay the history under the applied config and the changed one (admins)."""
    return c.replay(body.sets, body.config, body.since)


@router.get("/rebalance/history", tags=["admin"])
def rebalance_history(c: ClientDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> dict[str, Any]:
    """Finished moves: expected and realized saving, totals and correction ratio per kind (a
    member: its own team's moves)."""
    return c.rebalance_history(limit)
