"""Issue 27: an API process without a broker of its own (`onepool server --no-broker`) wakes
its agents' long polls when the leader, in another process, writes an assignment for them:
the agent starts the rank at once, not at its next poll (here 30 s away)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.api.app import create_app
from broker.client.sdk import Client
from broker.control.engine import Engine
from broker.control.executors import Executors
from broker.spec import parse_config
from broker.state.store import Store
from tests.agents.harness import agents_cleanup, serve, spawn_agent, wait_for
from tests.conftest import config, kill_leftovers

pytestmark = pytest.mark.e2e
POOL = {"name": "onprem", "provider": "agent", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1}
SLOW_S = 30.0  # the agents' heartbeat (their long poll) and the API's own look at the database
WOKEN_WITHIN_S = 10.0


def test_an_assignment_written_by_a_broker_in_another_process_wakes_the_agents_poll(
        tmp_path: Path, clock) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    api_store = Store(home)
    api = serve(create_app(api_store, clock, check_s=SLOW_S, agent_wakes=True))
    broker_store = Store(home)  # the leader's own: shares nothing in memory with the API's
    ex = Executors(broker_store, clock, home / "runs", notify=lambda node: broker_store.agents_changed())
    c = Client(store=broker_store, clock=clock)
    data = config(pools=[POOL], agent_heartbeat_s=SLOW_S, node_lost_after_s=3600)
    data["broker"]["server_url"] = api.url
    c.apply(parse_config(data))
    engine = Engine(broker_store, clock, ex)
    try:
        with agents_cleanup() as agents:
            agent = spawn_agent(api.url, tmp_path / "agent", join_token=c.join_token("onprem-0").join_token)
            agents.append(agent)
            wait_for("the agent joined", lambda: [n.state for n in c.nodes()] == ["up"])
            engine.cycle()  # the node's first cycle: nothing to place yet
            job = c.submit(name="probe", team="research", command=["sleep", "60"], gpus_per_node=2).id
            engine.cycle()  # places it: the assignment is written, the agents' wake-up poked
            assert c.get(job).status == "RUNNING"
            wait_for("the agent started the rank", lambda: any((tmp_path / "agent" / "runs").glob(
                "attempt-*/rank-0/handle.json")), timeout=WOKEN_WITHIN_S)
    finally:
        engine.close()
        api.stop()
        kill_leftovers(home / "runs")
