"""Output an agent ships through /v1/agent/logs is capped on the server as a local rank's is
(broker.output_log): at most broker.output_cap_bytes per attempt, the tail intact, and the
logs route says where the kept output starts and how much was dropped."""

from __future__ import annotations

import base64

from sqlmodel import select

from broker.control.engine import Engine
from broker.control.executors import Executors
from broker.spec import parse_config
from broker.state.model_access import RankAssignment
from tests.api.conftest import AGENT_POOL, Api
from tests.conftest import config
from tests.test_output_log import on_disk, read_all, stream

CAP = 64 * 1024


def test_output_an_agent_ships_is_capped_on_the_server(api: Api) -> None:
    api.local.apply(parse_config(config(pools=[AGENT_POOL], output_cap_bytes=CAP)))
    api.app.state.ctx.forget_settings()  # applied beside the server, not through it
    token = api.local.join_token("onprem-0").join_token
    cred = api.http.post("/v1/agent/join", json={"join_token": token}).json()["credential"]
    agent = {"Authorization": f"Bearer {cred}"}
    job = api.http.post("/v1/jobs", json={"name": "j", "command": ["true"]},
                        headers=api.as_(api.research)).json()["id"]
    engine = Engine(api.local.store, api.clock,
                    Executors(api.local.store, api.clock, api.local.store.home / "runs"))
    try:
        engine.cycle()  # places the job on onprem-0: a rank assignment for its agent
    finally:
        engine.close()
    with api.local.store.session() as s:
        [row] = s.exec(select(RankAssignment)).all()
    full = stream(1024 * 1024)
    offset = 0
    while offset < len(full):  # as the agent ships: 100 KiB pieces, each from the last answer
        r = api.http.post("/v1/agent/logs", headers=agent, json={
            "assignment_id": row.id, "offset": offset,
            "data_b64": base64.b64encode(full[offset:offset + 100 * 1024]).decode()})
        assert r.status_code == 200, r.text
        offset = r.json()["offset"]
    run_dir = api.local.store.home / "runs" / f"attempt-{row.attempt_id}" / "rank-0"
    assert on_disk(run_dir) <= CAP
    start, tail = read_all(run_dir)
    assert tail == full[start:] and len(tail) >= CAP // 2
    logs = api.http.get(f"/v1/jobs/{job}/logs", headers=api.as_(api.research)).json()
    assert logs["offset"] == start and logs["dropped"] == len(full) - len(tail)
