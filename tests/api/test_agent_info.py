"""What an agent says about itself (`info` on join and sync) is kept as short, finite scalars:
a NaN, an infinity or an integer past 2^63 in it is dropped, never stored where the database
(PostgreSQL's JSON) refuses it."""

from __future__ import annotations

import pytest

from broker.state.model_access import NodeAgent
from tests.api.conftest import Api

pytestmark = pytest.mark.both_dbs
INFO = '{"hostname": "h", "gpus": 2, "load": NaN, "t": Infinity, "big": 99999999999999999999999, "ok": 1.5}'


def test_non_finite_and_huge_numbers_in_an_agents_info_are_dropped(api: Api) -> None:
    token = api.local.join_token("onprem-0").join_token
    join = api.http.post("/v1/agent/join", content=f'{{"join_token": "{token}", "info": {INFO}}}',
                         headers={"Content-Type": "application/json"})
    assert join.status_code == 200, join.text
    cred = {"Authorization": f"Bearer {join.json()['credential']}", "Content-Type": "application/json"}
    sync = api.http.post("/v1/agent/sync", content=f'{{"info": {INFO}}}', headers=cred)
    assert sync.status_code == 200, sync.text
    with api.local.store.session() as s:
        [agent] = s.query(NodeAgent).all()
        kept = {k: v for k, v in agent.info.items() if k != "joined_at"}
    assert kept == {"hostname": "h", "gpus": 2, "ok": 1.5}
